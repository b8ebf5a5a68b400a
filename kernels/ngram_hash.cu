// N-gram row ids on the GPU: one thread per (token, layer), the per-token math shared with the CPU twin
// (engram_hash_token). Blocking (dead positions, Qwen EOS segments, the request's start) arrives as each
// token's lowest readable index, computed with a running maximum beside the launch.
#include <cuda_runtime.h>

#include "engram_common.h"
#include "engram_kernels.h"
#include "engram_launch.h"

namespace {

__global__ void ngram_hash(const int64_t* __restrict__ ext, const int64_t* __restrict__ start, int64_t tokens,
                           int64_t context, const int64_t* __restrict__ multipliers, const int64_t* __restrict__ primes,
                           const int64_t* __restrict__ magic, const int64_t* __restrict__ offsets, int64_t layers,
                           int64_t max_ngram, int64_t heads, int64_t fill, int64_t* __restrict__ out) {
    const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (item >= tokens * layers) return;
    const int64_t t = item / layers, l = item % layers;
    const int64_t columns = (max_ngram - 1) * heads;
    engram_hash_token(ext, context + t, start[t], fill, multipliers + l * max_ngram, primes + l * columns,
                      magic + l * columns, offsets + l * columns, max_ngram, heads, out + item * columns);
}

}  // namespace

extern "C" int engram_ngram_hash_cuda(const int64_t* ext, const int64_t* start, int64_t tokens, int64_t context,
                                      const int64_t* multipliers, const int64_t* primes, const int64_t* magic,
                                      const int64_t* offsets, int64_t layers, int64_t max_ngram, int64_t heads,
                                      int64_t fill, int64_t* out, void* stream) {
    if (tokens < 0 || context < 0 || layers < 1 || max_ngram < 2 || heads < 1) return ENGRAM_ERR_ARGUMENT;
    if (tokens == 0) return ENGRAM_OK;
    if (!ext || !start || !multipliers || !primes || !magic || !offsets || !out) return ENGRAM_ERR_ARGUMENT;
    const int64_t items = tokens * layers;
    const int threads = 256;
    ENGRAM_LAUNCH(static_cast<unsigned int>((items + threads - 1) / threads), threads, static_cast<cudaStream_t>(stream), ngram_hash)(
        ext, start, tokens, context, multipliers, primes, magic, offsets, layers, max_ngram, heads, fill, out);
    return engram_launch_status();
}
