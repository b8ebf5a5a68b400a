/* The C ABI of engram's kernels: raw pointers, sizes, an explicit stream for the CUDA entry points, and an
 * error code back (never an exception or an abort). Python loads it with ctypes (engram/kernels.py). */
#ifndef ENGRAM_KERNELS_H
#define ENGRAM_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum engram_status {
    ENGRAM_OK = 0,
    ENGRAM_ERR_ARGUMENT = 1, /* a size or pointer is invalid */
    ENGRAM_ERR_RANGE = 2,    /* an id lies outside the table */
    ENGRAM_ERR_CUDA = 3,     /* a CUDA call failed; engram_last_cuda_error() says which */
};

/* N-gram row ids for `tokens` new tokens of one request.
 * ext: int64 [context + tokens], the request's last `context` ids then the new ones.
 * start: int64 [tokens], the lowest index of ext that token t (at ext[context + t]) may read.
 * multipliers [layers, N], primes/magic/offsets [layers, (N-1)*K]; out: int64 [tokens, layers, (N-1)*K]. */
int engram_ngram_hash_cpu(const int64_t* ext, const int64_t* start, int64_t tokens, int64_t context,
                          const int64_t* multipliers, const int64_t* primes, const int64_t* magic,
                          const int64_t* offsets, int64_t layers, int64_t max_ngram, int64_t heads, int64_t fill,
                          int64_t* out, int num_threads);

/* Rows of a table shard for ids of the whole table. weight: [shard_rows, row_bytes] bytes; scale: fp8's
 * ue8m0 [shard_rows, dim / 32] or NULL. ids: int64 [n] global row ids. DEAD_ID (-1) and ids outside
 * [row_start, row_start + shard_rows) give zero rows; any id outside [-1, table_rows) makes the call
 * return ENGRAM_ERR_RANGE with *bad_id set, and nothing is read or written.
 * out_kind: ENGRAM_OUT_RAW copies row_bytes as stored; ENGRAM_OUT_F32 / ENGRAM_OUT_BF16 dequantise fp8. */
int engram_gather_cpu(const uint8_t* weight, const uint8_t* scale, int64_t shard_rows, int64_t dim, int64_t row_bytes,
                      int64_t row_start, int64_t table_rows, const int64_t* ids, int64_t n, uint8_t* out, int out_kind,
                      int64_t* bad_id, int num_threads);

#ifdef __cplusplus
}
#endif

#endif
