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

/* The shard-local row of table row `id`, or -1 when the shard does not hold it (DEAD_ID, another rank's
 * row, any negative id). Compared before it is subtracted: an id near INT64_MIN minus row_start would
 * overflow, which is undefined. Needs row_start >= 0, which every caller checks first. */
ENGRAM_HD int64_t engram_local_row(int64_t id, int64_t row_start, int64_t shard_rows) {
    return id >= row_start && id - row_start < shard_rows ? id - row_start : -1;
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

/* How dequantised rows are stored (out_kind F32 or BF16):
 * FP8_BLOCK32: e4m3 values, one ue8m0 scale per block of 32 (DeepSeek V4.1);
 * FP8_TABLE:   e4m3 values, one float scale for the whole table (Qwen4Exp FP8);
 * NVFP4:       two e2m1 values a byte (even element in the low nibble), one e4m3 scale per block of 16,
 *              times one float scale for the table (Qwen4Exp NVFP4). */
enum { ENGRAM_QUANT_FP8_BLOCK32 = 0, ENGRAM_QUANT_FP8_TABLE = 1, ENGRAM_QUANT_NVFP4 = 2 };

/* Stored bytes of a row of `dim` values, and its scale bytes, for each quant; 0 where dim does not fit. */
ENGRAM_HD int64_t engram_quant_row_bytes(int quant, int64_t dim) {
    if (quant == ENGRAM_QUANT_NVFP4) return dim % 16 ? 0 : dim / 2;
    if (quant == ENGRAM_QUANT_FP8_BLOCK32) return dim % 32 ? 0 : dim;
    return quant == ENGRAM_QUANT_FP8_TABLE ? dim : 0;
}

ENGRAM_HD int64_t engram_quant_scale_bytes(int quant, int64_t dim) {
    return quant == ENGRAM_QUANT_NVFP4 ? dim / 16 : quant == ENGRAM_QUANT_FP8_BLOCK32 ? dim / 32 : 0;
}

/* e2m1 code (the low 4 bits) -> float: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
ENGRAM_HD float engram_e2m1_to_float(uint8_t code) {
    const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = magnitude[code & 7];
    return (code & 8) ? -v : v;
}

/* The table scale as the output dtype holds it: vLLM multiplies FP8 PLE rows by the scale cast to the
 * activation dtype, so a bf16 output sees the scale rounded to bf16 first (the product of two bf16 values
 * is exact in float, then rounds once, as torch's bf16 multiply does). */
ENGRAM_HD float engram_table_scale(float scale, int out_kind) {
    if (out_kind != ENGRAM_OUT_BF16) return scale;
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)engram_float_to_bf16(scale) << 16;
    return v.f;
}

/* Value i of a row stored in `quant` (FP8_TABLE and NVFP4: `table_scale` as engram_table_scale gives it
 * for FP8_TABLE, the float scale for NVFP4, multiplied last as vLLM's NVFP4 kernel does). */
ENGRAM_HD float engram_dequant_value(int quant, const uint8_t* w, const uint8_t* s, int64_t i, float table_scale) {
    if (quant == ENGRAM_QUANT_NVFP4) {
        const uint8_t code = (uint8_t)(w[i >> 1] >> ((i & 1) * 4));
        return engram_e2m1_to_float(code) * engram_e4m3_to_float(s[i >> 4]) * table_scale;
    }
    if (quant == ENGRAM_QUANT_FP8_TABLE) return engram_e4m3_to_float(w[i]) * table_scale;
    return engram_e4m3_to_float(w[i]) * engram_e8m0_to_float(s[i >> 5]);
}

/* One fp8 row with its block-32 scales, dequantised into out (f32 or bf16). */
ENGRAM_HD void engram_dequant_row(const uint8_t* w, const uint8_t* s, int64_t dim, int out_kind, uint8_t* out) {
    for (int64_t i = 0; i < dim; ++i) {
        float v = engram_e4m3_to_float(w[i]) * engram_e8m0_to_float(s[i >> 5]);
        if (out_kind == ENGRAM_OUT_F32) ((float*)out)[i] = v;
        else ((uint16_t*)out)[i] = engram_float_to_bf16(v);
    }
}

#endif
