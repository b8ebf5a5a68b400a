/* CPU twin of the gather: every argument is checked first (nothing is read or written if one is wrong),
 * then rows are copied or dequantised in parallel. Row math is shared with CUDA (engram_common.h): fp8 with
 * block-32 scales in steps of the CUDA gather's loads, per-table fp8 and NVFP4 value by value.
 *
 * The sorted form (order and leader given) reads each distinct row once, in address order, then copies it
 * to the other positions that asked for it: the access pattern that makes host tables fast on a GPU.
 *
 * Table reads run guarded (guard_cpu.h): a table whose file was truncated under it makes the call return
 * ENGRAM_ERR_FAULT, not kill the process.
 *
 * A shard may lie in segments (engram_gather_segments_cpu: a table a checkpoint splits into parts, served
 * from the files as they are): a row's address is its segment's base plus its offset there. */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../engram_common.h"
#include "../engram_kernels.h"
#include "guard_cpu.h"

#define ENGRAM_PREFETCH 8

/* e4m3 -> float for every byte, filled when the library loads: a table read beats decoding per value. */
static float e4m3_table[256];

__attribute__((constructor)) static void fill_e4m3_table(void) {
    for (int v = 0; v < 256; ++v) e4m3_table[v] = engram_e4m3_to_float((uint8_t)v);
}

/* VEC values of one block at w into out[i..i+VEC), loaded in one step as the CUDA gather loads them. */
#define DEQUANT_STEP(VEC)                                                                                      \
    do {                                                                                                       \
        uint8_t v[VEC];                                                                                        \
        memcpy(v, w + i, VEC);                                                                                 \
        if (out_kind == ENGRAM_OUT_F32) {                                                                      \
            for (int k = 0; k < VEC; ++k) ((float*)out)[i + k] = e4m3_table[v[k]] * factor;                    \
        } else {                                                                                               \
            for (int k = 0; k < VEC; ++k) ((uint16_t*)out)[i + k] = engram_float_to_bf16(e4m3_table[v[k]] * factor); \
        }                                                                                                      \
    } while (0)

/* As engram_dequant_row (the CUDA path), with the table, in steps of `vec` bytes (engram_vector_bytes). */
static void dequant_row_cpu(const uint8_t* w, const uint8_t* s, int64_t dim, int out_kind, int vec, uint8_t* out) {
    for (int64_t i = 0; i < dim; i += vec) {
        const float factor = engram_e8m0_to_float(s[i >> 5]);
        if (vec == 16) DEQUANT_STEP(16);
        else if (vec == 8) DEQUANT_STEP(8);
        else DEQUANT_STEP(1);
    }
}

int engram_vector_bytes_cpu(const void* base, int64_t row_bytes) { return engram_vector_bytes((uintptr_t)base, row_bytes); }

typedef struct {
    const uint8_t* const* weights; /* each segment's first row, and its scales' (NULL without row scales) */
    const uint8_t* const* scales;
    const int64_t* starts; /* the shard-local row each segment starts at: 0, then ascending */
    int64_t segments, shard_rows, dim, row_bytes, scale_bytes, row_start, out_bytes;
    int out_kind, vec, quant;
    float table_scale; /* FP8_TABLE and NVFP4 (engram_table_scale for FP8_TABLE) */
} table_t;

/* The segment holding shard-local row `local` (in [0, shard_rows)): the last one starting at or before it. */
static inline int64_t segment_of(const table_t* t, int64_t local) {
    int64_t lo = 0, hi = t->segments; /* starts[lo] <= local < starts[hi] (starts[segments]: shard_rows) */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (t->starts[mid] <= local) lo = mid;
        else hi = mid;
    }
    return lo;
}

static inline const uint8_t* weight_row(const table_t* t, int64_t local) {
    const int64_t s = t->segments == 1 ? 0 : segment_of(t, local);
    return t->weights[s] + (local - t->starts[s]) * t->row_bytes;
}

static inline const uint8_t* scale_row(const table_t* t, int64_t local) {
    if (!t->scales) return NULL;
    const int64_t s = t->segments == 1 ? 0 : segment_of(t, local);
    return t->scales[s] + (local - t->starts[s]) * t->scale_bytes;
}

/* A row stored one scale per table (FP8_TABLE) or as NVFP4, value by value. */
static void dequant_scaled_row_cpu(const table_t* t, const uint8_t* w, const uint8_t* s, uint8_t* out) {
    for (int64_t i = 0; i < t->dim; ++i) {
        const float v = engram_dequant_value(t->quant, w, s, i, t->table_scale);
        if (t->out_kind == ENGRAM_OUT_F32) ((float*)out)[i] = v;
        else ((uint16_t*)out)[i] = engram_float_to_bf16(v);
    }
}

static void prefetch_row(const table_t* t, int64_t id) {
    const int64_t local = engram_local_row(id, t->row_start, t->shard_rows);
    if (local < 0) return;
    const uint8_t* row = weight_row(t, local);
    for (int64_t b = 0; b < t->row_bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
}

/* One row into dst: zeros for DEAD_ID and rows of other shards. */
static void read_row(const table_t* t, int64_t id, uint8_t* dst) {
    const int64_t local = engram_local_row(id, t->row_start, t->shard_rows);
    if (local < 0) {
        memset(dst, 0, (size_t)t->out_bytes);
    } else if (t->out_kind == ENGRAM_OUT_RAW) {
        memcpy(dst, weight_row(t, local), (size_t)t->row_bytes);
    } else if (t->quant != ENGRAM_QUANT_FP8_BLOCK32) {
        dequant_scaled_row_cpu(t, weight_row(t, local), scale_row(t, local), dst);
    } else {
        dequant_row_cpu(weight_row(t, local), scale_row(t, local), t->dim, t->out_kind, t->vec, dst);
    }
}

/* Rows stored as they are wanted, ids[lo, hi) into out[lo, hi): the loop a random-row copy is bound by
 * (outstanding cache and TLB misses), with no per-row dispatch, so the core keeps the next rows' loads in
 * flight beside the prefetches. */
static void copy_rows(const table_t* t, const int64_t* ids, int64_t lo, int64_t hi, uint8_t* out) {
    const uint8_t* weight = t->weights[0];
    const size_t row_bytes = (size_t)t->row_bytes;
    const int64_t row_start = t->row_start, shard_rows = t->shard_rows;
    const int one = t->segments == 1;
    for (int64_t i = lo; i < hi; ++i) {
        if (i + ENGRAM_PREFETCH < hi) prefetch_row(t, ids[i + ENGRAM_PREFETCH]);
        const int64_t local = engram_local_row(ids[i], row_start, shard_rows);
        uint8_t* dst = out + i * (int64_t)row_bytes;
        if (local >= 0)
            memcpy(dst, one ? weight + local * (int64_t)row_bytes : weight_row(t, local), row_bytes);
        else memset(dst, 0, row_bytes);
    }
}

/* ENGRAM_OK, or ENGRAM_ERR_RANGE with *bad_id the first id outside [-1, table_rows). */
static int check_range(const int64_t* ids, int64_t n, int64_t table_rows, int64_t* bad_id, int num_threads) {
    int64_t lo = ids[0], hi = ids[0];
#pragma omp parallel for num_threads(num_threads) reduction(min : lo) reduction(max : hi)
    for (int64_t i = 0; i < n; ++i) {
        lo = ids[i] < lo ? ids[i] : lo;
        hi = ids[i] > hi ? ids[i] : hi;
    }
    if (lo >= -1 && hi < table_rows) return ENGRAM_OK;
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < -1 || ids[i] >= table_rows) {
            *bad_id = ids[i];
            break;
        }
    }
    return ENGRAM_ERR_RANGE;
}

/* The sorted form's contract, checked in O(n): ids ascending, order a permutation of [0, n), leader[i]
 * the first index of i's run of equal ids. Anything else could leave output rows unwritten. */
static int check_sorted(const int64_t* ids, const int64_t* order, const int64_t* leader, int64_t n) {
    uint8_t* seen = calloc((size_t)n, 1);
    if (!seen) return ENGRAM_ERR_ARGUMENT;
    int status = ENGRAM_OK;
    for (int64_t i = 0; i < n && status == ENGRAM_OK; ++i) {
        const int64_t expected = i > 0 && ids[i] == ids[i - 1] ? leader[i - 1] : i;
        if ((i > 0 && ids[i] < ids[i - 1]) || leader[i] != expected || order[i] < 0 || order[i] >= n || seen[order[i]]) {
            status = ENGRAM_ERR_ARGUMENT;
        } else {
            seen[order[i]] = 1;
        }
    }
    free(seen);
    return status;
}

/* Rows for ids[lo, hi) in a guarded region: 0, or 1 when a read faulted (the rest are left unread). Its own
 * function, so nothing live across sigsetjmp is modified before the jump back. */
static __attribute__((noinline)) int read_part(const table_t* t, const int64_t* ids, const int64_t* order,
                                               const int64_t* leader, int64_t lo, int64_t hi, uint8_t* out) {
    if (!ENGRAM_GUARD_ENTER()) {
        engram_guard_leave();
        return 1;
    }
    if (order == NULL && t->out_kind == ENGRAM_OUT_RAW) {
        copy_rows(t, ids, lo, hi, out);
        engram_guard_leave();
        return 0;
    }
    for (int64_t i = lo; i < hi; ++i) {
        if (order == NULL) {
            /* Rows are random: ask for one a few ahead, so several cache misses are in flight. */
            if (i + ENGRAM_PREFETCH < hi) prefetch_row(t, ids[i + ENGRAM_PREFETCH]);
            read_row(t, ids[i], out + i * t->out_bytes);
        } else if (leader[i] == i) {
            read_row(t, ids[i], out + order[i] * t->out_bytes);
        }
    }
    engram_guard_leave();
    return 0;
}

/* The segments' contract, checked in O(segments): starts[0] = 0, strictly ascending, below shard_rows; a
 * base for each (and a scale base where rows have scales). */
static int check_segments(const uint8_t* const* weights, const uint8_t* const* scales, const int64_t* starts,
                          int64_t segments, int64_t shard_rows, int needs_scale) {
    if (segments < 1 || !weights || !starts || starts[0] != 0 || (needs_scale && !scales)) return ENGRAM_ERR_ARGUMENT;
    for (int64_t s = 0; s < segments; ++s) {
        if ((s && starts[s] <= starts[s - 1]) || (shard_rows && starts[s] >= shard_rows)) return ENGRAM_ERR_ARGUMENT;
        if (shard_rows && (!weights[s] || (needs_scale && !scales[s]))) return ENGRAM_ERR_ARGUMENT;
    }
    return ENGRAM_OK;
}

int engram_gather_segments_cpu(const uint8_t* const* weights, const uint8_t* const* scales, const int64_t* starts,
                               int64_t segments, int64_t shard_rows, int64_t dim, int64_t row_bytes, int64_t row_start,
                               int64_t table_rows, const int64_t* ids, const int64_t* order, const int64_t* leader,
                               int64_t n, uint8_t* out, int out_kind, int quant, float table_scale, int64_t* bad_id,
                               int num_threads) {
    if (n < 0 || shard_rows < 0 || dim < 1 || row_bytes < 1 || num_threads < 1 || row_start < 0) return ENGRAM_ERR_ARGUMENT;
    if (out_kind != ENGRAM_OUT_RAW && out_kind != ENGRAM_OUT_F32 && out_kind != ENGRAM_OUT_BF16) return ENGRAM_ERR_ARGUMENT;
    const int scaled = out_kind != ENGRAM_OUT_RAW;
    if (scaled && (engram_quant_row_bytes(quant, dim) == 0 || row_bytes != engram_quant_row_bytes(quant, dim))) return ENGRAM_ERR_ARGUMENT;
    const int needs_scale = scaled && engram_quant_scale_bytes(quant, dim) > 0;
    if ((order == NULL) != (leader == NULL)) return ENGRAM_ERR_ARGUMENT;
    if (check_segments(weights, needs_scale ? scales : NULL, starts, segments, shard_rows, needs_scale) != ENGRAM_OK)
        return ENGRAM_ERR_ARGUMENT;
    if (n == 0) return ENGRAM_OK;
    if (!ids || !out || !bad_id) return ENGRAM_ERR_ARGUMENT;
    const int range = check_range(ids, n, table_rows, bad_id, num_threads);
    if (range != ENGRAM_OK) return range;
    const float factor = quant == ENGRAM_QUANT_FP8_TABLE ? engram_table_scale(table_scale, out_kind) : table_scale;
    int vec = 16; /* the load width every segment's alignment allows: the CUDA gather's, for one segment */
    for (int64_t s = 0; s < segments && shard_rows; ++s) {
        const int v = engram_vector_bytes((uintptr_t)weights[s], row_bytes);
        vec = v < vec ? v : vec;
    }
    const table_t t = {weights, needs_scale ? scales : NULL, starts, segments, shard_rows, dim, row_bytes,
                       engram_quant_scale_bytes(quant, dim), row_start,
                       out_kind == ENGRAM_OUT_RAW ? row_bytes : dim * (out_kind == ENGRAM_OUT_F32 ? 4 : 2), out_kind,
                       vec, quant, factor};
    if (order != NULL) {
        const int sorted = check_sorted(ids, order, leader, n);
        if (sorted != ENGRAM_OK) return sorted;
    }
    if (engram_guard_install() != 0) return ENGRAM_ERR_ARGUMENT;
    int faulted = 0;
    /* Each thread reads one contiguous part of the ids inside its own guarded region: plain, every row;
     * sorted, each distinct row once, in address order, into its first position... */
#pragma omp parallel num_threads(num_threads) reduction(| : faulted)
    {
        const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
        faulted |= read_part(&t, ids, order, leader, n * part / parts, n * (part + 1) / parts, out);
    }
    if (faulted) return ENGRAM_ERR_FAULT;
    if (order == NULL) return ENGRAM_OK;
    /* ...then copied to the other positions of its run. */
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        if (leader[i] != i) memcpy(out + order[i] * t.out_bytes, out + order[leader[i]] * t.out_bytes, (size_t)t.out_bytes);
    }
    return ENGRAM_OK;
}

int engram_gather_cpu(const uint8_t* weight, const uint8_t* scale, int64_t shard_rows, int64_t dim, int64_t row_bytes,
                      int64_t row_start, int64_t table_rows, const int64_t* ids, const int64_t* order,
                      const int64_t* leader, int64_t n, uint8_t* out, int out_kind, int quant, float table_scale,
                      int64_t* bad_id, int num_threads) {
    const int64_t start = 0; /* one segment: the whole shard from `weight` */
    return engram_gather_segments_cpu(&weight, &scale, &start, 1, shard_rows, dim, row_bytes, row_start, table_rows,
                                      ids, order, leader, n, out, out_kind, quant, table_scale, bad_id, num_threads);
}
