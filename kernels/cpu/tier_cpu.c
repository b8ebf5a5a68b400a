/* The RAM tier's bookkeeping (engram_kernels.h): which rows of a shard it holds and in which slots, an
 * open-addressing hash table with linear probing and backward-shift deletion (no tombstones, so it never
 * needs rebuilding), and CLOCK's sweep for slots to reuse. One pass over a lookup's ids, where the torch
 * version was a dozen tensor ops and a periodic rebuild of a sorted array. Single-threaded: a decode
 * step's few thousand ids take microseconds, less than waking a thread team. */
#include <stdint.h>

#include "../engram_common.h"
#include "../engram_kernels.h"

#define EMPTY_ENTRY (-1)
#define LOCAL_LIMIT (INT64_C(1) << 31) /* local rows and slots fit 31 bits: an entry is never EMPTY_ENTRY */

/* The bucket a local row starts probing at: Fibonacci hashing, then the high bits scaled to buckets (the
 * table's size need not be a power of two). */
static inline int64_t home_of(int64_t local, int64_t buckets) {
    const uint64_t mixed = ((uint64_t)local * UINT64_C(0x9E3779B97F4A7C15)) >> 32;
    return (int64_t)((mixed * (uint64_t)buckets) >> 32);
}

static inline int64_t entry_row(int64_t entry) { return entry >> 32; }
static inline int64_t entry_slot(int64_t entry) { return entry & 0xFFFFFFFF; }

/* The table's shape, checked before any entry is touched: more buckets than slots, so a table holding at
 * most `capacity` rows always has an empty bucket where a probe ends (and probe() is bounded anyway). */
static int table_ok(const int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows,
                    int64_t capacity) {
    return table && capacity >= 1 && capacity < LOCAL_LIMIT && buckets > capacity && buckets <= UINT32_MAX &&
           row_start >= 0 && shard_rows >= 0 && shard_rows <= LOCAL_LIMIT;
}

/* The bucket holding `local`, or the empty bucket its probe ends at (-1 - that bucket). */
static int64_t probe(const int64_t* table, int64_t buckets, int64_t local) {
    int64_t b = home_of(local, buckets);
    for (int64_t step = 0; step < buckets; ++step) {
        const int64_t entry = table[b];
        if (entry == EMPTY_ENTRY) return -1 - b;
        if (entry_row(entry) == local) return b;
        b = b + 1 == buckets ? 0 : b + 1;
    }
    return INT64_MIN; /* no empty bucket: the table was filled past its capacity */
}

int engram_tier_find(const int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows, int64_t capacity,
                     const int64_t* ids, int64_t n, int64_t* slots) {
    if (!table_ok(table, buckets, row_start, shard_rows, capacity) || n < 0 || (n && (!ids || !slots)))
        return ENGRAM_ERR_ARGUMENT;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t local = engram_local_row(ids[i], row_start, shard_rows);
        int64_t slot = -1;
        if (local >= 0) {
            const int64_t at = probe(table, buckets, local);
            if (at == INT64_MIN) return ENGRAM_ERR_ARGUMENT;
            if (at >= 0) slot = entry_slot(table[at]);
            if (slot >= capacity) return ENGRAM_ERR_ARGUMENT;
        }
        slots[i] = slot;
    }
    return ENGRAM_OK;
}

int engram_tier_insert(int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows, int64_t capacity,
                       const int64_t* rows, const int64_t* slots, int64_t n) {
    if (!table_ok(table, buckets, row_start, shard_rows, capacity) || n < 0 || (n && (!rows || !slots)))
        return ENGRAM_ERR_ARGUMENT;
    for (int64_t i = 0; i < n; ++i) { /* every row and slot checked before the first write */
        if (rows[i] < row_start || rows[i] - row_start >= shard_rows) return ENGRAM_ERR_RANGE;
        if (slots[i] < 0 || slots[i] >= capacity) return ENGRAM_ERR_ARGUMENT;
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t local = rows[i] - row_start, at = probe(table, buckets, local);
        if (at >= 0 || at == INT64_MIN) return ENGRAM_ERR_ARGUMENT; /* held already, or no room */
        table[-1 - at] = (local << 32) | slots[i];
    }
    return ENGRAM_OK;
}

int engram_tier_remove(int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows, int64_t capacity,
                       const int64_t* rows, int64_t n) {
    if (!table_ok(table, buckets, row_start, shard_rows, capacity) || n < 0 || (n && !rows))
        return ENGRAM_ERR_ARGUMENT;
    for (int64_t i = 0; i < n; ++i)
        if (rows[i] < row_start || rows[i] - row_start >= shard_rows) return ENGRAM_ERR_RANGE;
    for (int64_t i = 0; i < n; ++i) {
        int64_t hole = probe(table, buckets, rows[i] - row_start);
        if (hole < 0) return ENGRAM_ERR_ARGUMENT; /* not held */
        /* Backward shift: each later entry of the run moves into the hole unless its home lies cyclically
         * in (hole, b], where a probe for it would stop at the hole before reaching it. */
        for (int64_t b = hole + 1 == buckets ? 0 : hole + 1;; b = b + 1 == buckets ? 0 : b + 1) {
            const int64_t entry = table[b];
            if (entry == EMPTY_ENTRY) break;
            const int64_t home = home_of(entry_row(entry), buckets);
            const int stays = hole <= b ? (home > hole && home <= b) : (home > hole || home <= b);
            if (!stays) table[hole] = entry, hole = b;
        }
        table[hole] = EMPTY_ENTRY;
    }
    return ENGRAM_OK;
}

int engram_clock_sweep(uint8_t* referenced, int64_t capacity, int64_t* hand, int64_t count, int64_t* victims) {
    if (!referenced || !hand || capacity < 1 || *hand < 0 || *hand >= capacity || count < 0 || count > capacity ||
        (count && !victims))
        return ENGRAM_ERR_ARGUMENT;
    int64_t at = *hand, taken = 0;
    /* Every slot the hand passes without taking is cleared or pinned, so two laps find `count` slots when
     * that many are not pinned. */
    for (int64_t step = 0; taken < count && step < 2 * capacity; ++step) {
        const int64_t s = at;
        at = at + 1 == capacity ? 0 : at + 1;
        if (referenced[s] == ENGRAM_CLOCK_CLEAR) referenced[s] = ENGRAM_CLOCK_PINNED, victims[taken++] = s;
        else if (referenced[s] == ENGRAM_CLOCK_SET) referenced[s] = ENGRAM_CLOCK_CLEAR;
    }
    if (taken < count) { /* fewer slots unpinned than asked for: none taken */
        for (int64_t i = 0; i < taken; ++i) referenced[victims[i]] = ENGRAM_CLOCK_CLEAR;
        return ENGRAM_ERR_ARGUMENT;
    }
    *hand = at;
    return ENGRAM_OK;
}
