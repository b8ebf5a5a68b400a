// The CUDA runtime calls the Python side needs, behind the C ABI: launch error bookkeeping, and host
// registration for UVA (engram/memory/registration.py checks every code these return).
#include <cuda_runtime.h>

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
