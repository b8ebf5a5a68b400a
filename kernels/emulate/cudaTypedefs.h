/* The driver entry points' function types, as the CUDA toolkit's cudaTypedefs.h names them, over the
 * emulated driver (kernels/emulate/cuda.h). */
#ifndef ENGRAM_EMULATE_CUDA_TYPEDEFS_H
#define ENGRAM_EMULATE_CUDA_TYPEDEFS_H

#include "cuda.h"

typedef CUresult (*PFN_cuDeviceGet_v2000)(CUdevice_v1*, int);
typedef CUresult (*PFN_cuDeviceGetAttribute_v2000)(int*, CUdevice_attribute, CUdevice_v1);
typedef CUresult (*PFN_cuMemGetAllocationGranularity_v10020)(size_t*, const CUmemAllocationProp_v1*, CUmemAllocationGranularity_flags);
typedef CUresult (*PFN_cuMemCreate_v10020)(CUmemGenericAllocationHandle_v1*, size_t, const CUmemAllocationProp_v1*, unsigned long long);
typedef CUresult (*PFN_cuMemRelease_v10020)(CUmemGenericAllocationHandle_v1);
typedef CUresult (*PFN_cuMemAddressReserve_v10020)(CUdeviceptr_v2*, size_t, size_t, CUdeviceptr_v2, unsigned long long);
typedef CUresult (*PFN_cuMemAddressFree_v10020)(CUdeviceptr_v2, size_t);
typedef CUresult (*PFN_cuMemMap_v10020)(CUdeviceptr_v2, size_t, size_t, CUmemGenericAllocationHandle_v1, unsigned long long);
typedef CUresult (*PFN_cuMemUnmap_v10020)(CUdeviceptr_v2, size_t);
typedef CUresult (*PFN_cuMemSetAccess_v10020)(CUdeviceptr_v2, size_t, const CUmemAccessDesc_v1*, size_t);

#endif
