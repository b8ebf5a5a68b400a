/* engram_readahead_cpu (engram_kernels.h): one madvise(MADV_WILLNEED) per row that starts a new page. */
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../engram_kernels.h"

int engram_readahead_cpu(const uint8_t* base, int64_t shard_rows, int64_t row_bytes, int64_t row_start,
                         const int64_t* ids, int64_t n) {
    if (!base || shard_rows < 0 || row_bytes < 1 || row_start < 0 || n < 0 || (n && !ids)) return ENGRAM_ERR_ARGUMENT;
    if (shard_rows > INT64_MAX / row_bytes) return ENGRAM_ERR_ARGUMENT;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t last = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t local = ids[i] - row_start;
        if (ids[i] < 0 || local < 0 || local >= shard_rows) continue;
        const uintptr_t start = (uintptr_t)base + (uintptr_t)(local * row_bytes);
        const uintptr_t first = start & ~(page - 1);
        if (first == last) continue; /* the previous id's page (sorted or repeated ids) */
        madvise((void*)first, start + (uintptr_t)row_bytes - first, MADV_WILLNEED);
        last = first;
    }
    return ENGRAM_OK;
}
