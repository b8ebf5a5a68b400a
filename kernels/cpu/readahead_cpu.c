/* engram_readahead_cpu (engram_kernels.h): the rows' pages sorted and deduplicated, neighbours coalesced
 * into ranges, one madvise(MADV_WILLNEED) a range. The reads of every range are then in flight together,
 * and rows a few pages apart cost one larger read instead of several (a device does fewer random reads a
 * second than it moves pages in sequence). */
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../engram_common.h"
#include "../engram_kernels.h"

static int ascending(const void* a, const void* b) {
    const int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
    return (x > y) - (x < y);
}

int engram_readahead_cpu(const uint8_t* const* bases, const int64_t* starts, int64_t segments, int64_t shard_rows,
                         int64_t row_bytes, int64_t row_start, const int64_t* ids, int64_t n, int64_t gap_bytes,
                         int64_t max_range_bytes, int64_t* scratch, int64_t scratch_n, int64_t* ranges, int64_t* bytes) {
    if (!bases || !starts || segments < 1 || shard_rows < 0 || row_bytes < 1 || row_start < 0 || n < 0 || (n && !ids))
        return ENGRAM_ERR_ARGUMENT;
    if (shard_rows > INT64_MAX / row_bytes || gap_bytes < 0 || max_range_bytes < 1) return ENGRAM_ERR_ARGUMENT;
    if (scratch_n < n || (n && !scratch) || starts[0] != 0) return ENGRAM_ERR_ARGUMENT;
    for (int64_t s = 0; s < segments; ++s) /* starts ascending within the shard, a base for each */
        if ((s && starts[s] <= starts[s - 1]) || (shard_rows && (starts[s] >= shard_rows || !bases[s])))
            return ENGRAM_ERR_ARGUMENT;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    int64_t m = 0; /* the addresses of the shard's rows asked for; ids outside the shard are another rank's */
    for (int64_t i = 0; i < n; ++i) {
        const int64_t local = engram_local_row(ids[i], row_start, shard_rows);
        if (local < 0) continue;
        int64_t lo = 0, hi = segments; /* the last segment starting at or before `local` */
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (starts[mid] <= local) lo = mid;
            else hi = mid;
        }
        scratch[m++] = (int64_t)((uintptr_t)bases[lo] + (uintptr_t)((local - starts[lo]) * row_bytes));
    }
    qsort(scratch, (size_t)m, sizeof *scratch, ascending);
    uintptr_t lo = 0, hi = 0; /* the range being built: [lo, hi), page-aligned; hi == 0 before the first */
    int64_t count = 0, asked = 0;
    for (int64_t k = 0; k < m; ++k) {
        if (k && scratch[k] == scratch[k - 1]) continue;
        const uintptr_t start = (uintptr_t)scratch[k];
        const uintptr_t first = start & ~(page - 1), end = (start + (uintptr_t)row_bytes + page - 1) & ~(page - 1);
        if (hi && first <= hi + (uintptr_t)gap_bytes && end - lo <= (uintptr_t)max_range_bytes) {
            hi = end > hi ? end : hi;
            continue;
        }
        if (hi) madvise((void*)lo, hi - lo, MADV_WILLNEED), ++count, asked += (int64_t)(hi - lo);
        lo = first, hi = end;
    }
    if (hi) madvise((void*)lo, hi - lo, MADV_WILLNEED), ++count, asked += (int64_t)(hi - lo);
    if (ranges) *ranges = count;
    if (bytes) *bytes = asked;
    return ENGRAM_OK;
}
