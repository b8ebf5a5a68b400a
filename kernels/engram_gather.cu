// Gather of table rows for global row ids, with dequantisation fused into the store: fp8 e4m3 with ue8m0
// block-32 scales (DeepSeek V4.1), fp8 with one scale per table and NVFP4 (Qwen4Exp). The same kernels read
// device tables and UVA views of pinned host tables.
//
// A row is handled by a sub-warp of LANES threads, each moving 16 bytes at a time (rows start 128-byte
// aligned when the table does and rows are multiples of 16 bytes). Each sub-warp keeps ROWS_IN_FLIGHT rows
// loading at once: over PCIe (UVA) a row is ~1 us away, so latency, not bandwidth, bounds a lone row.
//
// The sorted form (order and leader given) reads each distinct row once, leaders only, in ascending
// address order (the GPU's translation of scattered host addresses, not the link, limits random reads),
// writing it to out[order[i]]; a second kernel copies it to the other positions of its run.
#include <cuda_runtime.h>

#include "engram_common.h"
#include "engram_kernels.h"
#include "engram_launch.h"

namespace {

constexpr int THREADS = 256;
constexpr int ROWS_IN_FLIGHT = 4;

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Where row i is read from and written to. local < 0 reads zeros (DEAD_ID, rows of other shards, and ids
// outside the table, which also raise the flag); dst < 0 writes nothing (a follower of the sorted form, or
// an order entry outside [0, n), which also raises the flag).
struct RowPlan {
    int64_t local;
    int64_t dst;
};

__device__ __forceinline__ RowPlan plan_row(int64_t i, int64_t n, const int64_t* ids, const int64_t* order,
                                            const int64_t* leader, int64_t shard_rows, int64_t row_start,
                                            int64_t table_rows, bool report, int* error_flag) {
    RowPlan p{-1, -1};
    if (i >= n) return p;
    if (leader != nullptr && leader[i] != i) return p;  // copied from its leader by copy_runs
    const int64_t dst = order != nullptr ? order[i] : i;
    if (dst < 0 || dst >= n) {  // only a broken order can say so: write nothing
        if (report) *reinterpret_cast<volatile int*>(error_flag) = 1;
        return p;
    }
    p.dst = dst;
    const int64_t id = ids[i];
    if (id < -1 || id >= table_rows) {  // zeros, and the flag (0 -> 1 only: a plain store suffices, also in host memory)
        if (report) *reinterpret_cast<volatile int*>(error_flag) = 1;
    } else {
        p.local = engram_local_row(id, row_start, shard_rows);
    }
    return p;
}

// plan_row for the ROWS_IN_FLIGHT rows from `base`: where each is read from and written to.
__device__ __forceinline__ void plan_rows(int64_t base, int64_t n, const int64_t* ids, const int64_t* order,
                                          const int64_t* leader, int64_t shard_rows, int64_t row_start,
                                          int64_t table_rows, bool report, int* error_flag,
                                          int64_t (&local)[ROWS_IN_FLIGHT], int64_t (&dst)[ROWS_IN_FLIGHT]) {
#pragma unroll
    for (int r = 0; r < ROWS_IN_FLIGHT; ++r) {
        const RowPlan p = plan_row(base + r, n, ids, order, leader, shard_rows, row_start, table_rows, report, error_flag);
        local[r] = p.local;
        dst[r] = p.dst;
    }
}

// Raw rows: 16-byte vectors when everything is aligned, bytes otherwise.
template <int LANES>
__global__ void gather_raw(const uint8_t* __restrict__ weight, int64_t shard_rows, int64_t row_bytes, int64_t row_start,
                           int64_t table_rows, const int64_t* __restrict__ ids, const int64_t* __restrict__ order,
                           const int64_t* __restrict__ leader, int64_t n, uint8_t* __restrict__ out,
                           int* __restrict__ error_flag) {
    const int lane = threadIdx.x % LANES;
    const int64_t group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES;
    const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / LANES;
    const bool vector = engram_vector_bytes(reinterpret_cast<uintptr_t>(weight), row_bytes) == 16 && aligned16(out);
    for (int64_t base = group * ROWS_IN_FLIGHT; base < n; base += groups * ROWS_IN_FLIGHT) {
        const uint8_t* src[ROWS_IN_FLIGHT];
        int64_t dst[ROWS_IN_FLIGHT];
#pragma unroll
        for (int r = 0; r < ROWS_IN_FLIGHT; ++r) {
            const RowPlan p = plan_row(base + r, n, ids, order, leader, shard_rows, row_start, table_rows, lane == 0, error_flag);
            src[r] = p.local >= 0 ? weight + p.local * row_bytes : nullptr;
            dst[r] = p.dst;
        }
        if (vector) {
            for (int64_t off = lane * 16; off < row_bytes; off += LANES * 16) {
                uint4 v[ROWS_IN_FLIGHT];
#pragma unroll
                for (int r = 0; r < ROWS_IN_FLIGHT; ++r) v[r] = src[r] ? *reinterpret_cast<const uint4*>(src[r] + off) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int r = 0; r < ROWS_IN_FLIGHT; ++r)
                    if (dst[r] >= 0) *reinterpret_cast<uint4*>(out + dst[r] * row_bytes + off) = v[r];
            }
        } else {
            for (int64_t off = lane; off < row_bytes; off += LANES) {
#pragma unroll
                for (int r = 0; r < ROWS_IN_FLIGHT; ++r)
                    if (dst[r] >= 0) out[dst[r] * row_bytes + off] = src[r] ? src[r][off] : 0;
            }
        }
    }
}

// VEC bytes of a row into registers in one load (VEC as engram_vector_bytes allows: 16, 8 or 1).
template <int VEC>
__device__ __forceinline__ void load_bytes(const uint8_t* p, uint8_t (&b)[VEC]) {
    if constexpr (VEC == 16) {
        *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(p);
    } else if constexpr (VEC == 8) {
        *reinterpret_cast<uint2*>(b) = *reinterpret_cast<const uint2*>(p);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) b[k] = p[k];
    }
}

// N values of type T from registers to dst: 16-byte stores when dst is 16-byte aligned and N values fill
// whole vectors, element stores otherwise (an output that is a view at an odd offset).
template <typename T, int N>
__device__ __forceinline__ void store_values(T* dst, const T (&v)[N], bool vector) {
    constexpr int per = 16 / static_cast<int>(sizeof(T));
    if constexpr (N % per == 0) {
        if (vector) {
#pragma unroll
            for (int k = 0; k < N / per; ++k) reinterpret_cast<uint4*>(dst)[k] = reinterpret_cast<const uint4*>(v)[k];
            return;
        }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = v[k];
}

// fp8 rows: each thread dequantises VEC values (one load) with the scale of their block of 32.
template <int LANES, int VEC>
__global__ void gather_fp8(const uint8_t* __restrict__ weight, const uint8_t* __restrict__ scale, int64_t shard_rows,
                           int64_t dim, int64_t row_start, int64_t table_rows, const int64_t* __restrict__ ids,
                           const int64_t* __restrict__ order, const int64_t* __restrict__ leader, int64_t n,
                           uint8_t* __restrict__ out, int out_kind, int* __restrict__ error_flag) {
    const int lane = threadIdx.x % LANES;
    const int64_t group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES;
    const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / LANES;
    const int64_t out_bytes = dim * (out_kind == ENGRAM_OUT_F32 ? 4 : 2);
    const bool vector_out = aligned16(out);  // rows of out_bytes (a multiple of 64) keep its alignment
    for (int64_t base = group * ROWS_IN_FLIGHT; base < n; base += groups * ROWS_IN_FLIGHT) {
        int64_t local[ROWS_IN_FLIGHT];
        int64_t dst_row[ROWS_IN_FLIGHT];
        plan_rows(base, n, ids, order, leader, shard_rows, row_start, table_rows, lane == 0, error_flag, local, dst_row);
        for (int64_t v0 = lane * VEC; v0 < dim; v0 += LANES * VEC) {
            alignas(16) uint8_t w[ROWS_IN_FLIGHT][VEC];
            uint8_t s[ROWS_IN_FLIGHT];
#pragma unroll
            for (int r = 0; r < ROWS_IN_FLIGHT; ++r) {
                if (local[r] >= 0) {
                    load_bytes<VEC>(weight + local[r] * dim + v0, w[r]);
                    s[r] = scale[local[r] * (dim / 32) + v0 / 32];  // VEC divides 32: one block per load
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) w[r][k] = 0;
                    s[r] = 0;
                }
            }
#pragma unroll
            for (int r = 0; r < ROWS_IN_FLIGHT; ++r) {
                if (dst_row[r] < 0) continue;
                uint8_t* dst = out + dst_row[r] * out_bytes;
                const float factor = engram_e8m0_to_float(s[r]);
                if (out_kind == ENGRAM_OUT_F32) {
                    alignas(16) float f[VEC];
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = local[r] >= 0 ? engram_e4m3_to_float(w[r][k]) * factor : 0.0f;
                    store_values(reinterpret_cast<float*>(dst) + v0, f, vector_out);
                } else {
                    alignas(16) uint16_t h[VEC];
#pragma unroll
                    for (int k = 0; k < VEC; ++k) h[k] = local[r] >= 0 ? engram_float_to_bf16(engram_e4m3_to_float(w[r][k]) * factor) : 0;
                    store_values(reinterpret_cast<uint16_t*>(dst) + v0, h, vector_out);
                }
            }
        }
    }
}

// One instantiation of gather_fp8 per sub-warp width and load width.
template <int LANES>
void launch_fp8(int vec, int blocks, cudaStream_t s, const uint8_t* w, const uint8_t* sc, int64_t shard_rows, int64_t dim,
                int64_t row_start, int64_t table_rows, const int64_t* ids, const int64_t* order, const int64_t* leader,
                int64_t n, uint8_t* o, int out_kind, int* error_flag) {
    if (vec == 16) {
        ENGRAM_LAUNCH(blocks, THREADS, s, gather_fp8<LANES, 16>)(w, sc, shard_rows, dim, row_start, table_rows, ids, order, leader, n, o, out_kind, error_flag);
    } else if (vec == 8) {
        ENGRAM_LAUNCH(blocks, THREADS, s, gather_fp8<LANES, 8>)(w, sc, shard_rows, dim, row_start, table_rows, ids, order, leader, n, o, out_kind, error_flag);
    } else {
        ENGRAM_LAUNCH(blocks, THREADS, s, gather_fp8<LANES, 1>)(w, sc, shard_rows, dim, row_start, table_rows, ids, order, leader, n, o, out_kind, error_flag);
    }
}

// Rows with one float scale per table (FP8_TABLE: e4m3 bytes; NVFP4: a byte holds two e2m1 values, with
// one e4m3 scale per 16): each lane dequantises whole stored bytes, ROWS_IN_FLIGHT rows at once, and
// stores element by element (rows are short: Qwen4Exp PLE heads are 80-256 values).
template <int LANES>
__global__ void gather_scaled(const uint8_t* __restrict__ weight, const uint8_t* __restrict__ scale, int64_t shard_rows,
                              int64_t dim, int64_t row_bytes, int64_t row_start, int64_t table_rows,
                              const int64_t* __restrict__ ids, const int64_t* __restrict__ order,
                              const int64_t* __restrict__ leader, int64_t n, uint8_t* __restrict__ out, int out_kind,
                              int quant, float table_scale, int* __restrict__ error_flag) {
    const int lane = threadIdx.x % LANES;
    const int64_t group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES;
    const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / LANES;
    const int64_t scale_bytes = engram_quant_scale_bytes(quant, dim);
    const int per_byte = quant == ENGRAM_QUANT_NVFP4 ? 2 : 1;
    for (int64_t base = group * ROWS_IN_FLIGHT; base < n; base += groups * ROWS_IN_FLIGHT) {
        int64_t local[ROWS_IN_FLIGHT];
        int64_t dst_row[ROWS_IN_FLIGHT];
        plan_rows(base, n, ids, order, leader, shard_rows, row_start, table_rows, lane == 0, error_flag, local, dst_row);
        for (int64_t b = lane; b < row_bytes; b += LANES) {
#pragma unroll
            for (int r = 0; r < ROWS_IN_FLIGHT; ++r) {
                if (dst_row[r] < 0) continue;
                const uint8_t* w = local[r] >= 0 ? weight + local[r] * row_bytes : nullptr;
                const uint8_t* sc = local[r] >= 0 && scale_bytes ? scale + local[r] * scale_bytes : nullptr;
                for (int k = 0; k < per_byte; ++k) {
                    const int64_t i = b * per_byte + k;
                    const float v = w ? engram_dequant_value(quant, w, sc, i, table_scale) : 0.0f;
                    if (out_kind == ENGRAM_OUT_F32) reinterpret_cast<float*>(out)[dst_row[r] * dim + i] = v;
                    else reinterpret_cast<uint16_t*>(out)[dst_row[r] * dim + i] = w ? engram_float_to_bf16(v) : 0;
                }
            }
        }
    }
}

// The sorted form's second pass: every follower copies its leader's output row (device memory to device
// memory). A leader outside [0, i) that is not its own leader, or an order entry outside [0, n) copies nothing and raises the flag.
template <int LANES>
__global__ void copy_runs(uint8_t* __restrict__ out, int64_t out_bytes, const int64_t* __restrict__ order,
                          const int64_t* __restrict__ leader, int64_t n, int* __restrict__ error_flag) {
    const int lane = threadIdx.x % LANES;
    const int64_t group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES;
    const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / LANES;
    const bool vector = (out_bytes & 15) == 0 && aligned16(out);
    for (int64_t i = group; i < n; i += groups) {
        const int64_t from = leader[i];
        if (from == i) continue;
        if (from < 0 || from > i || leader[from] != from || order[i] < 0 || order[i] >= n || order[from] < 0 || order[from] >= n) {
            if (lane == 0) *reinterpret_cast<volatile int*>(error_flag) = 1;
            continue;
        }
        const uint8_t* src = out + order[from] * out_bytes;
        uint8_t* dst = out + order[i] * out_bytes;
        if (vector) {
            for (int64_t off = lane * 16; off < out_bytes; off += LANES * 16)
                *reinterpret_cast<uint4*>(dst + off) = *reinterpret_cast<const uint4*>(src + off);
        } else {
            for (int64_t off = lane; off < out_bytes; off += LANES) dst[off] = src[off];
        }
    }
}

// Range check only: a rank that gathers some columns must still flag a bad id in the others, exactly as
// its peers do, or it would be the one rank not raising after the collective; and the n-gram hash flags
// token ids outside the vocabulary with it, without a host sync.
__global__ void check_ids(const int64_t* __restrict__ ids, int64_t n, int64_t lo, int64_t hi, int* __restrict__ error_flag) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        if (ids[i] < lo || ids[i] >= hi) *reinterpret_cast<volatile int*>(error_flag) = 1;
}

int blocks_for(int64_t groups_needed, int lanes, int max_blocks) {
    const int64_t per_block = THREADS / lanes;
    int64_t blocks = (groups_needed + per_block - 1) / per_block;
    if (blocks < 1) blocks = 1;
    if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;  // the loops stride over the rest
    return blocks > 65535 * 16 ? 65535 * 16 : static_cast<int>(blocks);
}

}  // namespace

extern "C" int engram_gather_cuda(const void* weight, const void* scale, int64_t shard_rows, int64_t dim, int64_t row_bytes,
                                  int64_t row_start, int64_t table_rows, const int64_t* ids, const int64_t* order,
                                  const int64_t* leader, int64_t n, void* out, int out_kind, int quant,
                                  float table_scale, int* error_flag, int max_blocks, void* stream) {
    if (n < 0 || shard_rows < 0 || dim < 1 || row_bytes < 1 || row_start < 0 || max_blocks < 0 || !error_flag) return ENGRAM_ERR_ARGUMENT;
    if (out_kind != ENGRAM_OUT_RAW && out_kind != ENGRAM_OUT_F32 && out_kind != ENGRAM_OUT_BF16) return ENGRAM_ERR_ARGUMENT;
    const bool scaled = out_kind != ENGRAM_OUT_RAW;
    if (scaled && (engram_quant_row_bytes(quant, dim) == 0 || row_bytes != engram_quant_row_bytes(quant, dim))) return ENGRAM_ERR_ARGUMENT;
    if (scaled && shard_rows && engram_quant_scale_bytes(quant, dim) && !scale) return ENGRAM_ERR_ARGUMENT;
    if ((order == nullptr) != (leader == nullptr)) return ENGRAM_ERR_ARGUMENT;
    if (n == 0) return ENGRAM_OK;
    if (!ids || !out || (shard_rows && !weight)) return ENGRAM_ERR_ARGUMENT;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int64_t groups = (n + ROWS_IN_FLIGHT - 1) / ROWS_IN_FLIGHT;
    const auto* w = static_cast<const uint8_t*>(weight);
    auto* o = static_cast<uint8_t*>(out);
    const int64_t out_bytes = out_kind == ENGRAM_OUT_RAW ? row_bytes : dim * (out_kind == ENGRAM_OUT_F32 ? 4 : 2);
    if (out_kind == ENGRAM_OUT_RAW) {
        // Short rows take a sub-warp: one 16-byte vector per lane, so no lane idles on a 256-byte row.
        if (row_bytes <= 128) {
            ENGRAM_LAUNCH(blocks_for(groups, 8, max_blocks), THREADS, s, gather_raw<8>)(w, shard_rows, row_bytes, row_start, table_rows, ids, order, leader, n, o, error_flag);
        } else if (row_bytes <= 256) {
            ENGRAM_LAUNCH(blocks_for(groups, 16, max_blocks), THREADS, s, gather_raw<16>)(w, shard_rows, row_bytes, row_start, table_rows, ids, order, leader, n, o, error_flag);
        } else {
            ENGRAM_LAUNCH(blocks_for(groups, 32, max_blocks), THREADS, s, gather_raw<32>)(w, shard_rows, row_bytes, row_start, table_rows, ids, order, leader, n, o, error_flag);
        }
    } else if (quant != ENGRAM_QUANT_FP8_BLOCK32) {
        const auto* sc = static_cast<const uint8_t*>(scale);
        const float factor = quant == ENGRAM_QUANT_FP8_TABLE ? engram_table_scale(table_scale, out_kind) : table_scale;
        ENGRAM_LAUNCH(blocks_for(groups, 16, max_blocks), THREADS, s, gather_scaled<16>)(w, sc, shard_rows, dim, row_bytes, row_start, table_rows, ids, order, leader, n, o, out_kind, quant, factor, error_flag);
    } else {
        const auto* sc = static_cast<const uint8_t*>(scale);
        const int vec = engram_vector_bytes(reinterpret_cast<uintptr_t>(weight), dim);
        if (dim <= 256) {
            launch_fp8<16>(vec, blocks_for(groups, 16, max_blocks), s, w, sc, shard_rows, dim, row_start, table_rows, ids, order, leader, n, o, out_kind, error_flag);
        } else {
            launch_fp8<32>(vec, blocks_for(groups, 32, max_blocks), s, w, sc, shard_rows, dim, row_start, table_rows, ids, order, leader, n, o, out_kind, error_flag);
        }
    }
    const int status = engram_launch_status();
    if (status != ENGRAM_OK || leader == nullptr) return status;
    ENGRAM_LAUNCH(blocks_for(n, 16, max_blocks), THREADS, s, copy_runs<16>)(o, out_bytes, order, leader, n, error_flag);
    return engram_launch_status();
}

extern "C" int engram_check_ids_cuda(const int64_t* ids, int64_t n, int64_t lo, int64_t hi, int* error_flag, void* stream) {
    if (n < 0 || !error_flag || (n && !ids)) return ENGRAM_ERR_ARGUMENT;
    if (n == 0) return ENGRAM_OK;
    ENGRAM_LAUNCH(blocks_for(n, 1, 64), THREADS, static_cast<cudaStream_t>(stream), check_ids)(ids, n, lo, hi, error_flag);
    return engram_launch_status();
}
