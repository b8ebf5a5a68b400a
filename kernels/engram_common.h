/* Per-element math shared by the CUDA kernels and their CPU twins, so both compute the same thing by
 * construction. Everything is unsigned 64-bit: products reach 2^63 and signed overflow is undefined. */
#ifndef ENGRAM_COMMON_H
#define ENGRAM_COMMON_H

#include <stdint.h>

#if defined(__CUDACC__)
#define ENGRAM_HD __host__ __device__ __forceinline__
#else
#define ENGRAM_HD static inline
#endif

/* High 64 bits of a 64x64-bit product. */
ENGRAM_HD uint64_t engram_mulhi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, b);
#else
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#endif
}

/* x mod p without a hardware divide: magic = floor((2^64 - 1) / p) (Barrett); the estimate of the
 * quotient is at most two short, so at most two subtractions finish the job. */
ENGRAM_HD uint64_t engram_mod(uint64_t x, uint64_t p, uint64_t magic) {
    uint64_t r = x - engram_mulhi(x, magic) * p;
    if (r >= p) r -= p;
    if (r >= p) r -= p;
    return r;
}

/* Store that bypasses the cache where the CPU has one: row ids are written once and read by someone
 * else, so pulling their lines into the cache first (read-for-ownership) only doubles the traffic. */
ENGRAM_HD void engram_store_stream(int64_t* p, int64_t v) {
#if !defined(__CUDA_ARCH__) && defined(__x86_64__)
    __builtin_ia32_movnti64((long long*)p, v);
#else
    *p = v;
#endif
}

/* Row ids of one token for one layer. ext holds the request's history then its new ids; the token sits
 * at ext[pos]; lookbacks that reach below start read fill. out gets (N-1)*K ids, order-major. */
ENGRAM_HD void engram_hash_token(const int64_t* ext, int64_t pos, int64_t start, int64_t fill,
                                 const int64_t* mult, /* [N] */
                                 const int64_t* primes, const int64_t* magic, const int64_t* offsets, /* [(N-1)*K] */
                                 int64_t max_ngram, int64_t heads, int64_t* out) {
    uint64_t mix = 0;
    for (int64_t k = 0; k < max_ngram; ++k) {
        int64_t at = pos - k;
        uint64_t word = (uint64_t)(at >= start ? ext[at] : fill);
        mix ^= word * (uint64_t)mult[k];
        if (k == 0) continue;
        for (int64_t h = 0; h < heads; ++h) {
            int64_t c = (k - 1) * heads + h;
            engram_store_stream(out + c, (int64_t)engram_mod(mix, (uint64_t)primes[c], (uint64_t)magic[c]) + offsets[c]);
        }
    }
}

#endif
