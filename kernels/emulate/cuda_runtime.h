/* A host stand-in for the CUDA runtime, so the kernels' own .cu files compile with a C++ compiler and run
 * on the CPU (tests/emulated): the built-ins (threadIdx, blockIdx, blockDim, gridDim), the vector types the
 * kernels load, the qualifiers, the runtime calls the launchers make, and ENGRAM_LAUNCH as a loop over
 * every block and thread of the grid. Streams are in-order queues that run each launch at once.
 *
 * A sequential loop runs a kernel exactly only while its threads never wait for each other: no shared
 * memory, no __syncthreads, no warp shuffles or votes. Those are refused at compile time below, with a
 * message, rather than run wrongly. */
#ifndef ENGRAM_EMULATE_CUDA_RUNTIME_H
#define ENGRAM_EMULATE_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#define ENGRAM_EMULATED 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ _Pragma("GCC error \"the CUDA emulator runs threads one after another: it cannot run a kernel with __shared__ memory; teach it fibers first (kernels/emulate/cuda_runtime.h)\"")
#define __syncthreads() _Pragma("GCC error \"the CUDA emulator cannot run __syncthreads(): its threads run one after another (kernels/emulate/cuda_runtime.h)\"")
#define __syncwarp(...) _Pragma("GCC error \"the CUDA emulator cannot run warp-synchronous code\"")
#define __shfl_sync(...) _Pragma("GCC error \"the CUDA emulator cannot run warp shuffles\"")
#define __ballot_sync(...) _Pragma("GCC error \"the CUDA emulator cannot run warp votes\"")

struct uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct uint3 { unsigned int x = 0, y = 0, z = 0; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

typedef int cudaError_t;
typedef void* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9, cudaErrorNoDevice = 100 };
typedef int cudaDeviceAttr;
struct cudaPointerAttributes { int type; int device; void* devicePointer; void* hostPointer; };

namespace engram_emu {
inline thread_local cudaError_t last_error = cudaSuccess;

/* Runs kernel(args...) for every thread of the grid, blocks in order, threads in order within a block:
 * what the GPU would compute, for kernels whose threads never wait for each other. A configuration the
 * GPU refuses (an empty grid, more than 1024 threads a block, more than 2^31 - 1 blocks) runs nothing and
 * leaves cudaErrorInvalidConfiguration for cudaGetLastError, as a real launch does. */
struct Launch {
    dim3 grid, block;
    template <typename Kernel, typename... Args>
    void run(Kernel kernel, Args... args) const {
        const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
        if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || grid.x > 2147483647u ||
            grid.y > 65535 || grid.z > 65535) {
            last_error = cudaErrorInvalidConfiguration;
            return;
        }
        gridDim = grid;
        blockDim = block;
        for (unsigned int bz = 0; bz < grid.z; ++bz)
            for (unsigned int by = 0; by < grid.y; ++by)
                for (unsigned int bx = 0; bx < grid.x; ++bx)
                    for (unsigned int tz = 0; tz < block.z; ++tz)
                        for (unsigned int ty = 0; ty < block.y; ++ty)
                            for (unsigned int tx = 0; tx < block.x; ++tx) {
                                blockIdx.x = bx, blockIdx.y = by, blockIdx.z = bz;
                                threadIdx.x = tx, threadIdx.y = ty, threadIdx.z = tz;
                                kernel(args...);
                            }
    }
};

template <typename Kernel>
struct Bound {
    Launch launch;
    Kernel kernel;
    template <typename... Args>
    void operator()(Args... args) const { launch.run(kernel, args...); }
};

template <typename Kernel>
Bound<Kernel> launch(dim3 grid, dim3 block, cudaStream_t, Kernel kernel) { return Bound<Kernel>{Launch{grid, block}, kernel}; }
}  // namespace engram_emu

/* kernel<<<grid, block, 0, stream>>>(args) under nvcc; the loop above here (kernels/engram_launch.h). */
#define ENGRAM_EMULATED_LAUNCH(grid, block, stream, ...) ::engram_emu::launch((grid), (block), (stream), __VA_ARGS__)

inline cudaError_t cudaGetLastError() {
    const cudaError_t e = engram_emu::last_error;
    engram_emu::last_error = cudaSuccess;
    return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorInvalidConfiguration ? "invalid configuration argument (emulated)" : "emulated CUDA error";
}
/* No device and no host registration: the emulator's "device memory" is host memory, read directly. */
inline cudaError_t cudaGetDevice(int* device) { *device = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) { *value = 0; return cudaSuccess; }
inline cudaError_t cudaHostRegister(void*, size_t, unsigned int) { return cudaErrorNoDevice; }
inline cudaError_t cudaHostUnregister(void*) { return cudaErrorNoDevice; }
inline cudaError_t cudaHostGetDevicePointer(void** device, void*, unsigned int) { *device = nullptr; return cudaErrorNoDevice; }
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void*) { a->type = 0; return cudaSuccess; }

// The driver entry points, by name, from the emulated driver (kernels/emulate/cuda.h).
#include <string.h>

#include "cuda.h"
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
enum { cudaEnableDefault = 0, cudaErrorSymbolNotFound = 500 };
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
    struct Named {
        const char* name;
        void* fn;
    };
    const Named table[] = {
        {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
        {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
        {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
        {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
        {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
        {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
        {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
        {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
        {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
    };
    for (const Named& n : table) {
        if (strcmp(n.name, symbol) == 0) {
            *fn = n.fn;
            *found = cudaDriverEntryPointSuccess;
            return cudaSuccess;
        }
    }
    *fn = nullptr;
    *found = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

#endif
