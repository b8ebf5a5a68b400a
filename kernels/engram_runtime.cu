// The CUDA runtime calls the Python side needs, behind the C ABI: launch error bookkeeping, and host
// registration for UVA (engram/memory/registration.py checks every code these return).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <new>

#include "engram_kernels.h"
#include "engram_launch.h"

namespace {
thread_local int last_cuda_error = 0;
}  // namespace

int engram_launch_status() {
    const cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) return ENGRAM_OK;
    last_cuda_error = static_cast<int>(err);
    return ENGRAM_ERR_CUDA;
}

extern "C" int engram_cuda_last_error(void) { return last_cuda_error; }
extern "C" const char* engram_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
extern "C" int engram_device_attribute(int* value, int attribute, int device) {
    if (value == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (device < 0) {  // the calling thread's current GPU
        const cudaError_t err = cudaGetDevice(&device);
        if (err != cudaSuccess) return static_cast<int>(err);
    }
    return static_cast<int>(cudaDeviceGetAttribute(value, static_cast<cudaDeviceAttr>(attribute), device));
}
extern "C" int engram_cuda_get_last_error(void) { return static_cast<int>(cudaGetLastError()); }

extern "C" int engram_host_register(void* host, uint64_t size, unsigned int flags) {
    return static_cast<int>(cudaHostRegister(host, static_cast<size_t>(size), flags));
}
extern "C" int engram_host_unregister(void* host) { return static_cast<int>(cudaHostUnregister(host)); }
extern "C" int engram_host_get_device_pointer(void** device, void* host) {
    return static_cast<int>(cudaHostGetDevicePointer(device, host, 0));
}
// Asks the driver, not torch: Tensor.is_pinned() answers False for registered memory until torch has
// created its own CUDA context, while the pointer attributes are right from the first registration.
extern "C" int engram_pointer_memory_type(int* type, const void* pointer) {
    if (type == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    cudaPointerAttributes attributes{};
    const cudaError_t err = cudaPointerGetAttributes(&attributes, pointer);
    if (err != cudaSuccess) return static_cast<int>(err);
    *type = static_cast<int>(attributes.type);
    return 0;
}

// Host tables in host-NUMA cuMem: pinned host memory the GPU maps with 2 MiB pages (a registered mapping
// of ordinary pages gets small GPU pages, so random row lookups miss the GPU's TLB far more). The driver
// calls are found through the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda.

namespace {
struct Driver {
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 device_attribute;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
};

// The driver's entry points, or a cudaError_t when one cannot be found (a driver older than the calls).
int driver(Driver* d) {
    struct Entry {
        const char* name;
        void** slot;
        unsigned version;
    };
    const Entry entries[] = {
        {"cuDeviceGet", reinterpret_cast<void**>(&d->device_get), 2000},
        {"cuDeviceGetAttribute", reinterpret_cast<void**>(&d->device_attribute), 2000},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void**>(&d->granularity), 10020},
        {"cuMemCreate", reinterpret_cast<void**>(&d->create), 10020},
        {"cuMemRelease", reinterpret_cast<void**>(&d->release), 10020},
        {"cuMemAddressReserve", reinterpret_cast<void**>(&d->reserve), 10020},
        {"cuMemAddressFree", reinterpret_cast<void**>(&d->address_free), 10020},
        {"cuMemMap", reinterpret_cast<void**>(&d->map), 10020},
        {"cuMemUnmap", reinterpret_cast<void**>(&d->unmap), 10020},
        {"cuMemSetAccess", reinterpret_cast<void**>(&d->set_access), 10020},
    };
    for (const Entry& e : entries) {
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        const cudaError_t err = cudaGetDriverEntryPointByVersion(e.name, e.slot, e.version, cudaEnableDefault, &found);
        if (err != cudaSuccess) return static_cast<int>(err);
        if (found != cudaDriverEntryPointSuccess || *e.slot == nullptr) return static_cast<int>(cudaErrorSymbolNotFound);
    }
    return 0;
}

// Undo a partial map: unmap the chunks mapped, free the address range, release the handles still held.
void undo(const Driver& d, CUdeviceptr address, uint64_t padded, uint64_t chunk, uint64_t mapped,
          CUmemGenericAllocationHandle* handles, uint64_t held) {
    for (uint64_t at = 0; at < mapped; at += chunk) d.unmap(address + at, (padded - at) < chunk ? padded - at : chunk);
    if (address) d.address_free(address, padded);
    for (uint64_t i = 0; i < held; ++i) d.release(handles[i]);
}
}  // namespace

// Steps engram_host_numa_map reports in *step, so a failure names its call.
enum { STEP_DRIVER = 1, STEP_DEVICE, STEP_NUMA_ID, STEP_GRANULARITY, STEP_CREATE, STEP_RESERVE, STEP_MAP, STEP_ACCESS };

extern "C" int engram_host_numa_map(uint64_t bytes, uint64_t chunk_bytes, int numa_node, uint64_t* address,
                                    uint64_t* padded, uint64_t* granularity, int* node_used, int* step) {
    if (!address || !padded || !granularity || !node_used || !step || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    *address = *padded = *granularity = 0, *node_used = -1, *step = STEP_DRIVER;
    Driver d{};
    const int found = driver(&d);
    if (found) return found;
    int ordinal = 0;
    *step = STEP_DEVICE;
    cudaError_t rt = cudaGetDevice(&ordinal);
    if (rt != cudaSuccess) return static_cast<int>(rt);
    CUdevice device = 0;
    CUresult r = d.device_get(&device, ordinal);
    if (r != CUDA_SUCCESS) return r;
    int node = numa_node;
    *step = STEP_NUMA_ID;
    if (node < 0) {
        r = d.device_attribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device);
        if (r != CUDA_SUCCESS) return r;
        if (node < 0) return CUDA_ERROR_NOT_SUPPORTED;  // the system has no NUMA: no host-NUMA allocation
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = node;
    size_t grain = 0;
    *step = STEP_GRANULARITY;
    r = d.granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS) return r;
    if (grain == 0 || chunk_bytes == 0 || chunk_bytes % grain) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t total = (bytes + grain - 1) / grain * grain;
    const uint64_t chunks = (total + chunk_bytes - 1) / chunk_bytes;
    CUmemGenericAllocationHandle* handles = new (std::nothrow) CUmemGenericAllocationHandle[chunks];
    if (!handles) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t held = 0, mapped = 0;
    CUdeviceptr base = 0;
    *step = STEP_CREATE;
    for (; held < chunks; ++held) {
        const uint64_t at = held * chunk_bytes, size = total - at < chunk_bytes ? total - at : chunk_bytes;
        r = d.create(&handles[held], size, &prop, 0);
        if (r != CUDA_SUCCESS) break;
    }
    if (r == CUDA_SUCCESS) {
        *step = STEP_RESERVE;
        r = d.reserve(&base, total, grain, 0, 0);
    }
    *step = r == CUDA_SUCCESS ? STEP_MAP : *step;
    for (uint64_t i = 0; r == CUDA_SUCCESS && i < chunks; ++i) {
        const uint64_t at = i * chunk_bytes, size = total - at < chunk_bytes ? total - at : chunk_bytes;
        r = d.map(base + at, size, 0, handles[i], 0);
        if (r == CUDA_SUCCESS) mapped = at + size;
    }
    if (r == CUDA_SUCCESS) {
        *step = STEP_ACCESS;
        CUmemAccessDesc access[2]{};
        access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[0].location.id = device;
        access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        access[1].location.id = node;
        access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = d.set_access(base, total, access, 2);
    }
    if (r != CUDA_SUCCESS) {
        undo(d, base, total, chunk_bytes, mapped, handles, held);
        delete[] handles;
        return r;
    }
    for (uint64_t i = 0; i < chunks; ++i) d.release(handles[i]);  // the mappings keep the memory
    delete[] handles;
    *address = static_cast<uint64_t>(base), *padded = total, *granularity = grain, *node_used = node, *step = 0;
    return CUDA_SUCCESS;
}

extern "C" int engram_host_numa_unmap(uint64_t address, uint64_t padded, uint64_t chunk_bytes) {
    Driver d{};
    const int found = driver(&d);
    if (found) return found;
    if (chunk_bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t at = 0; at < padded; at += chunk_bytes) {
        const CUresult r = d.unmap(address + at, padded - at < chunk_bytes ? padded - at : chunk_bytes);
        if (r != CUDA_SUCCESS) return r;
    }
    return d.address_free(address, padded);
}

#ifdef ENGRAM_EMULATED
// What the emulated driver holds now, and which of its calls fails next (tests/emulated).
extern "C" void engram_emu_driver_state(long* handles, uint64_t* reserved, uint64_t* mapped) {
    *handles = engram_emu::handles, *reserved = engram_emu::reserved, *mapped = engram_emu::mapped;
}
extern "C" void engram_emu_driver_fail_at(long call) { engram_emu::calls = 0, engram_emu::fail_at = call; }
#endif
