/* CPU twin of the n-gram hash: one pass per token with everything in registers, tokens split across
 * OpenMP threads. The per-token math is engram_hash_token, shared with the CUDA kernel. */
#include "../engram_common.h"
#include "../engram_kernels.h"

int engram_ngram_hash_cpu(const int64_t* ext, const int64_t* start, int64_t tokens, int64_t context,
                          const int64_t* multipliers, const int64_t* primes, const int64_t* magic,
                          const int64_t* offsets, int64_t layers, int64_t max_ngram, int64_t heads, int64_t fill,
                          int64_t* out, int num_threads) {
    if (tokens < 0 || context < 0 || layers < 1 || max_ngram < 2 || heads < 1 || num_threads < 1) return ENGRAM_ERR_ARGUMENT;
    if (tokens == 0) return ENGRAM_OK;
    if (!ext || !start || !multipliers || !primes || !magic || !offsets || !out) return ENGRAM_ERR_ARGUMENT;
    const int64_t columns = (max_ngram - 1) * heads;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t l = 0; l < layers; ++l) {
            engram_hash_token(ext, context + t, start[t], fill, multipliers + l * max_ngram, primes + l * columns,
                              magic + l * columns, offsets + l * columns, max_ngram, heads,
                              out + (t * layers + l) * columns);
        }
    }
#if defined(__x86_64__)
    __builtin_ia32_sfence(); /* streaming stores are weakly ordered: publish them before returning */
#endif
    return ENGRAM_OK;
}
