/* A host stand-in for the CUDA driver's virtual memory calls (cuMem*), so engram_host_numa_map runs on
 * the CPU under AddressSanitizer (tests/emulated): an allocation is a count of bytes, an address range a
 * PROT_NONE reservation, a mapping fresh read-write pages at the address. It keeps what is live (handles,
 * reserved and mapped bytes) and can fail the Nth call, so every failure path is shown to leave nothing. */
#ifndef ENGRAM_EMULATE_CUDA_H
#define ENGRAM_EMULATE_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define CUDAAPI
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_v1;
typedef uint64_t CUdeviceptr;
typedef uint64_t CUdeviceptr_v2;
typedef uint64_t CUmemGenericAllocationHandle;
typedef uint64_t CUmemGenericAllocationHandle_v1;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_NOT_SUPPORTED = 801 };
typedef enum { CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134 } CUdevice_attribute;
typedef enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 } CUmemAllocationType;
typedef enum { CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_LOCATION_TYPE_HOST_NUMA = 3 } CUmemLocationType;
typedef enum { CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 } CUmemAllocationGranularity_flags;
typedef enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 } CUmemAccess_flags;
typedef struct {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct {
    CUmemAllocationType type;
    CUmemLocation location;
} CUmemAllocationProp;
typedef CUmemAllocationProp CUmemAllocationProp_v1;
typedef struct {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;
typedef CUmemAccessDesc CUmemAccessDesc_v1;

namespace engram_emu {
constexpr size_t GRANULE = 2 << 20;  // the recommended granularity of host-NUMA allocations on real GPUs
inline long calls = 0, fail_at = -1;  // the call that fails (the first is 0); -1: none
inline long handles = 0;
inline uint64_t reserved = 0, mapped = 0;

inline bool failing() { return calls++ == fail_at; }
}  // namespace engram_emu

inline CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (engram_emu::failing()) return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
inline CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute, CUdevice) {
    if (engram_emu::failing()) return CUDA_ERROR_INVALID_VALUE;
    *value = 0;  // host NUMA node 0
    return CUDA_SUCCESS;
}
inline CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
    if (engram_emu::failing()) return CUDA_ERROR_INVALID_VALUE;
    *granularity = engram_emu::GRANULE;
    return CUDA_SUCCESS;
}
inline CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop, unsigned long long) {
    if (engram_emu::failing()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (size == 0 || size % engram_emu::GRANULE || prop->location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA) return CUDA_ERROR_INVALID_VALUE;
    *handle = static_cast<CUmemGenericAllocationHandle>(++engram_emu::handles);
    return CUDA_SUCCESS;
}
inline CUresult cuMemRelease(CUmemGenericAllocationHandle) {
    --engram_emu::handles;  // a real release of a mapped handle defers the free to the unmap; counts alike
    return CUDA_SUCCESS;
}
inline CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr, unsigned long long) {
    if (engram_emu::failing()) return CUDA_ERROR_OUT_OF_MEMORY;
    void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    engram_emu::reserved += size;
    *ptr = reinterpret_cast<uintptr_t>(p);
    return CUDA_SUCCESS;
}
inline CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    munmap(reinterpret_cast<void*>(ptr), size);
    engram_emu::reserved -= size;
    return CUDA_SUCCESS;
}
inline CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t, CUmemGenericAllocationHandle, unsigned long long) {
    if (engram_emu::failing()) return CUDA_ERROR_OUT_OF_MEMORY;
    void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    engram_emu::mapped += size;
    return CUDA_SUCCESS;
}
inline CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    engram_emu::mapped -= size;
    return CUDA_SUCCESS;
}
inline CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t count) {
    if (engram_emu::failing()) return CUDA_ERROR_INVALID_VALUE;
    return count == 2 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#endif
