/* CPU twin of the gather: ids are checked first (nothing is read if one is outside the table), then
 * rows are copied or dequantised in parallel. Row math is engram_dequant_row, shared with CUDA. */
#include <string.h>

#include "../engram_common.h"
#include "../engram_kernels.h"

#define ENGRAM_PREFETCH 8

/* e4m3 -> float for every byte, filled when the library loads: a table read beats decoding per value. */
static float e4m3_table[256];

__attribute__((constructor)) static void fill_e4m3_table(void) {
    for (int v = 0; v < 256; ++v) e4m3_table[v] = engram_e4m3_to_float((uint8_t)v);
}

/* As engram_dequant_row (the CUDA path), with the table. */
static void dequant_row_cpu(const uint8_t* w, const uint8_t* s, int64_t dim, int out_kind, uint8_t* out) {
    for (int64_t b = 0; b < dim; b += 32) {
        const float factor = engram_e8m0_to_float(s[b >> 5]);
        if (out_kind == ENGRAM_OUT_F32) {
            for (int64_t i = b; i < b + 32; ++i) ((float*)out)[i] = e4m3_table[w[i]] * factor;
        } else {
            for (int64_t i = b; i < b + 32; ++i) ((uint16_t*)out)[i] = engram_float_to_bf16(e4m3_table[w[i]] * factor);
        }
    }
}

int engram_gather_cpu(const uint8_t* weight, const uint8_t* scale, int64_t shard_rows, int64_t dim, int64_t row_bytes,
                      int64_t row_start, int64_t table_rows, const int64_t* ids, int64_t n, uint8_t* out, int out_kind,
                      int64_t* bad_id, int num_threads) {
    if (n < 0 || shard_rows < 0 || dim < 1 || row_bytes < 1 || num_threads < 1 || row_start < 0) return ENGRAM_ERR_ARGUMENT;
    if (out_kind != ENGRAM_OUT_RAW && dim % 32) return ENGRAM_ERR_ARGUMENT;
    if (n == 0) return ENGRAM_OK;
    if (!ids || !out || !bad_id || (shard_rows && (!weight || (out_kind != ENGRAM_OUT_RAW && !scale)))) return ENGRAM_ERR_ARGUMENT;
    int64_t lo = ids[0], hi = ids[0];
#pragma omp parallel for num_threads(num_threads) reduction(min : lo) reduction(max : hi)
    for (int64_t i = 0; i < n; ++i) {
        lo = ids[i] < lo ? ids[i] : lo;
        hi = ids[i] > hi ? ids[i] : hi;
    }
    if (lo < -1 || hi >= table_rows) {
        for (int64_t i = 0; i < n; ++i) {
            if (ids[i] < -1 || ids[i] >= table_rows) { *bad_id = ids[i]; break; }
        }
        return ENGRAM_ERR_RANGE;
    }
    const int64_t out_bytes = out_kind == ENGRAM_OUT_RAW ? row_bytes : dim * (out_kind == ENGRAM_OUT_F32 ? 4 : 2);
    const int64_t scale_bytes = dim / 32;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        /* Rows are random: ask for one a few iterations ahead, so several cache misses are in flight. */
        if (i + ENGRAM_PREFETCH < n) {
            int64_t ahead = ids[i + ENGRAM_PREFETCH] - row_start;
            if (ahead >= 0 && ahead < shard_rows) {
                const uint8_t* row = weight + ahead * row_bytes;
                for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b, 0, 0);
            }
        }
        int64_t local = ids[i] - row_start;
        uint8_t* dst = out + i * out_bytes;
        if (ids[i] < 0 || local < 0 || local >= shard_rows) {
            memset(dst, 0, (size_t)out_bytes);
        } else if (out_kind == ENGRAM_OUT_RAW) {
            memcpy(dst, weight + local * row_bytes, (size_t)row_bytes);
        } else {
            dequant_row_cpu(weight + local * row_bytes, scale + local * scale_bytes, dim, out_kind, dst);
        }
    }
    return ENGRAM_OK;
}
