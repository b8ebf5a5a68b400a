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

#ifdef __cplusplus
}
#endif

#endif
