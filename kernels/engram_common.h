/* Per-element math shared by the CUDA kernels and their CPU twins, so both compute the same thing by
 * construction. Hash arithmetic is unsigned 64-bit: products reach 2^63 and signed overflow is undefined. */
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

/* fp8 e4m3fn -> float, exactly (NaN for S.1111.111; the format has no infinities). */
ENGRAM_HD float engram_e4m3_to_float(uint8_t v) {
    uint32_t sign = (uint32_t)(v & 0x80) << 24, exp = (v >> 3) & 0xF, man = v & 0x7;
    union { uint32_t u; float f; } r;
    if (exp == 0xF && man == 0x7) { r.u = sign | 0x7FC00000u; return r.f; }
    if (exp == 0) { r.f = (float)man * 0.001953125f; r.u |= sign; return r.f; } /* man * 2^-9 */
    r.u = sign | ((exp + 120u) << 23) | (man << 20);
    return r.f;
}

/* ue8m0 block scale -> float: 2^(e - 127); 0xFF is NaN; 2^-127 is a float subnormal, still exact. */
ENGRAM_HD float engram_e8m0_to_float(uint8_t e) {
    union { uint32_t u; float f; } r;
    r.u = e == 0xFF ? 0x7FC00000u : e == 0 ? 0x00400000u : (uint32_t)e << 23;
    return r.f;
}

/* float -> bfloat16 bits, round to nearest even, as torch converts. A NaN stays a quiet NaN of its sign
 * (S.11111111.1000000 plus the payload's top bits): torch writes 0x7FC0 (its scalar path and CUDA) or 0xFFFF
 * (its CPU vector path) for every NaN, so NaN bits are compared as "a NaN", never byte for byte. */
ENGRAM_HD uint16_t engram_float_to_bf16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    if ((v.u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

/* The widest load, in bytes (16, 8 or 1), that every row of a table at `base` with rows of `row_bytes`
 * allows: rows start at base + i * row_bytes, so both must be multiples of it. safetensors promises only
 * 8-byte alignment of a tensor's data (a 1000-row fp8 table written by save_file starts at 8 mod 16), and a
 * misaligned vector load is a sticky CUDA error that ends the process. The CUDA gather picks its loads by
 * this, and the CPU twin walks rows in the same steps, so a CPU test covers the choice. */
ENGRAM_HD int engram_vector_bytes(uintptr_t base, int64_t row_bytes) {
    const uintptr_t both = base | (uintptr_t)row_bytes;
    return (both & 15) == 0 ? 16 : (both & 7) == 0 ? 8 : 1;
}

/* Gather output formats. */
enum { ENGRAM_OUT_RAW = 0, ENGRAM_OUT_F32 = 1, ENGRAM_OUT_BF16 = 2 };

/* One fp8 row with its block-32 scales, dequantised into out (f32 or bf16). */
ENGRAM_HD void engram_dequant_row(const uint8_t* w, const uint8_t* s, int64_t dim, int out_kind, uint8_t* out) {
    for (int64_t i = 0; i < dim; ++i) {
        float v = engram_e4m3_to_float(w[i]) * engram_e8m0_to_float(s[i >> 5]);
        if (out_kind == ENGRAM_OUT_F32) ((float*)out)[i] = v;
        else ((uint16_t*)out)[i] = engram_float_to_bf16(v);
    }
}

#endif
