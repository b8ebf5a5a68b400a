/* The C ABI of engram's kernels: raw pointers, sizes, an explicit stream for the CUDA entry points, and an
 * error code back (never an exception or an abort). Python loads it with ctypes (engram/ops/cuda.py). */
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
    ENGRAM_ERR_FAULT = 4,    /* a table read faulted: the file behind the table shrank (CPU only) */
    ENGRAM_ERR_IO = 5,       /* a read from a file failed, came back short or timed out (*os_error says) */
};

/* N-gram row ids for `tokens` new tokens of one request.
 * ext: int64 [context + tokens], the request's last `context` ids then the new ones.
 * start: int64 [tokens], the lowest index of ext that token t (at ext[context + t]) may read.
 * multipliers [layers, N], primes/magic/offsets [layers, (N-1)*K]; out: int64 [tokens, layers, (N-1)*K]. */
int engram_ngram_hash_cpu(const int64_t* ext, const int64_t* start, int64_t tokens, int64_t context,
                          const int64_t* multipliers, const int64_t* primes, const int64_t* magic,
                          const int64_t* offsets, int64_t layers, int64_t max_ngram, int64_t heads, int64_t fill,
                          int64_t* out, int num_threads);

/* Rows of a table shard for ids of the whole table. weight: [shard_rows, row_bytes] bytes; scale: the
 * per-row scales of the quant (engram_common.h: ue8m0 [shard_rows, dim / 32] for FP8_BLOCK32, e4m3
 * [shard_rows, dim / 16] for NVFP4) or NULL (FP8_TABLE). ids: int64 [n] global row ids. DEAD_ID (-1) and
 * ids outside [row_start, row_start + shard_rows) give zero rows; any id outside [-1, table_rows) makes
 * the call return ENGRAM_ERR_RANGE with *bad_id set, and nothing is read or written.
 * out_kind: ENGRAM_OUT_RAW copies row_bytes as stored; ENGRAM_OUT_F32 / ENGRAM_OUT_BF16 dequantise `dim`
 * values a row as `quant` says (row_bytes must be engram_quant_row_bytes), FP8_TABLE and NVFP4 with the
 * table's float scale `table_scale`.
 *
 * Sorted form: order and leader both given (else both NULL). ids are then sorted ascending, order [n] is
 * the permutation that sorted them (ids[i] belongs in out row order[i]) and leader [n] the first index of
 * i's run of equal ids. Each distinct row is read once, in address order, and copied to every position
 * of its run. The CPU twin checks that contract and returns ENGRAM_ERR_ARGUMENT when it does not hold. */
int engram_gather_cpu(const uint8_t* weight, const uint8_t* scale, int64_t shard_rows, int64_t dim, int64_t row_bytes,
                      int64_t row_start, int64_t table_rows, const int64_t* ids, const int64_t* order,
                      const int64_t* leader, int64_t n, uint8_t* out, int out_kind, int quant, float table_scale,
                      int64_t* bad_id, int num_threads);

/* As engram_gather_cpu, for a shard whose rows lie in `segments` pieces (a table a checkpoint splits into
 * parts, served from its files as they are): piece s holds shard-local rows [starts[s], starts[s + 1])
 * (the last one up to shard_rows) from weights[s] on, and their scales from scales[s] (NULL where the
 * quant has no per-row scales). starts[0] is 0 and they ascend, each below shard_rows; a piece's extent
 * is the caller's to check, as `weight`'s is. engram_gather_cpu is this with one piece. */
int engram_gather_segments_cpu(const uint8_t* const* weights, const uint8_t* const* scales, const int64_t* starts,
                               int64_t segments, int64_t shard_rows, int64_t dim, int64_t row_bytes, int64_t row_start,
                               int64_t table_rows, const int64_t* ids, const int64_t* order, const int64_t* leader,
                               int64_t n, uint8_t* out, int out_kind, int quant, float table_scale, int64_t* bad_id,
                               int num_threads);

/* engram_vector_bytes for a table at base with rows of row_bytes: the load width both gathers use. */
int engram_vector_bytes_cpu(const void* base, int64_t row_bytes);

/* Ask the kernel to start reading the pages of rows `ids` of a file-backed shard (shard_rows rows of
 * row_bytes, holding global rows from row_start, in `segments` pieces as engram_gather_segments_cpu's:
 * piece s from bases[s], its first row shard-local row starts[s]) before a gather faults on them one by
 * one: on a disk file that is not in the page cache, the reads are then in flight together. The pages are
 * sorted and deduplicated, and pages at most gap_bytes apart are asked for as one range of at most
 * max_range_bytes; *ranges and *bytes (each when not NULL) are set to the number of ranges and the bytes
 * they span, the most the page cache can grow by. scratch: int64 [scratch_n >= n], the caller's workspace.
 * Ids outside the shard are skipped; nothing of the table is read or written, so a shrunken file cannot
 * fault here. */
int engram_readahead_cpu(const uint8_t* const* bases, const int64_t* starts, int64_t segments, int64_t shard_rows,
                         int64_t row_bytes, int64_t row_start, const int64_t* ids, int64_t n, int64_t gap_bytes,
                         int64_t max_range_bytes, int64_t* scratch, int64_t scratch_n, int64_t* ranges, int64_t* bytes);

/* Rows of a shard's files read from the disk straight into `dst` (direct_cpu.c: O_DIRECT through io_uring,
 * so the page cache gains no page). The shard's shard_rows rows of row_bytes lie in `segments` pieces, as
 * engram_gather_segments_cpu's: piece s holds shard-local rows from starts[s], at file offset offsets[s]
 * of the file fds[s] (opened with O_DIRECT, file_sizes[s] bytes), all within it. rows [n]: shard-local
 * rows, strictly ascending; slots [n]: the row of dst ([dst_rows, row_bytes]) each one goes to. Rows of
 * one piece whose pages lie at most gap_bytes apart are read as one range of at most max_range_bytes (a
 * multiple of 4096), at most `depth` reads in flight. A row, slot or piece out of bounds is
 * ENGRAM_ERR_ARGUMENT, nothing read. A read that fails, comes back short (the file shrank: *os_error 0) or
 * is not done timeout_ms after the call began is ENGRAM_ERR_IO with *os_error the errno (ENOSYS: no
 * io_uring here, or one that cannot bound a wait); the rows of the ranges that did complete are written,
 * the others not. *ranges and *bytes (when not NULL): the reads made and the bytes they brought. */
int engram_read_direct_cpu(const int* fds, const int64_t* file_sizes, const int64_t* offsets, const int64_t* starts,
                           int64_t segments, int64_t shard_rows, int64_t row_bytes, const int64_t* rows,
                           const int64_t* slots, int64_t n, uint8_t* dst, int64_t dst_rows, int64_t gap_bytes,
                           int64_t max_range_bytes, int64_t depth, int64_t timeout_ms, int64_t* ranges, int64_t* bytes,
                           int64_t* os_error);

/* The RAM tier's index (tier_cpu.c): which rows of a shard of shard_rows (global ids from row_start) it
 * holds, in which of its `capacity` slots. table: int64 [buckets], buckets > capacity (so a probe always
 * ends at an empty bucket), each entry (local row << 32 | slot) or -1; shard_rows and capacity are at most
 * 2^31. A table that breaks these rules (a slot past capacity, no empty bucket) returns ENGRAM_ERR_ARGUMENT.
 * find: slots[i] the slot of ids[i], -1 where not held (ids outside the shard, DEAD_ID among them).
 * insert: rows (each in the shard, else ENGRAM_ERR_RANGE, and not held) into slots [n] in [0, capacity).
 * remove: rows, each held. Both check every row and slot before writing; a row found held by insert or
 * missing for remove is ENGRAM_ERR_ARGUMENT. */
int engram_tier_find(const int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows, int64_t capacity,
                     const int64_t* ids, int64_t n, int64_t* slots);
int engram_tier_insert(int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows, int64_t capacity,
                       const int64_t* rows, const int64_t* slots, int64_t n);
int engram_tier_remove(int64_t* table, int64_t buckets, int64_t row_start, int64_t shard_rows, int64_t capacity,
                       const int64_t* rows, int64_t n);

/* CLOCK's choice of `count` slots to reuse into victims [count], in the order the hand reaches them, from
 * *hand (left past the last one taken). referenced: uint8 [capacity], a slot's state: a clear one is
 * taken (and pinned), a set one cleared and passed, a pinned one (a row the lookup in progress reads, or
 * one it just admitted) passed as it is. Fewer than `count` slots not pinned is ENGRAM_ERR_ARGUMENT, with
 * none taken. */
enum engram_clock_state { ENGRAM_CLOCK_CLEAR = 0, ENGRAM_CLOCK_SET = 1, ENGRAM_CLOCK_PINNED = 2 };
int engram_clock_sweep(uint8_t* referenced, int64_t capacity, int64_t* hand, int64_t count, int64_t* victims);

/* ---- CUDA (the .cu files). `stream` is a cudaStream_t; nothing here allocates or synchronises, so the
 * calls can be captured in CUDA graphs. A launch failure returns ENGRAM_ERR_CUDA; the CUDA error code is
 * then engram_cuda_last_error(). */

/* As engram_gather_cpu (plain or sorted form), for device tables or UVA views of registered host tables.
 * Ids outside the table, and order or leader entries outside [0, n), read or write nothing and set
 * *error_flag to 1 (device memory, or registered host memory the host reads without a sync): a kernel
 * cannot raise. max_blocks > 0 caps the grid, so a lookup running beside compute leaves it SMs. */
int engram_gather_cuda(const void* weight, const void* scale, int64_t shard_rows, int64_t dim, int64_t row_bytes,
                       int64_t row_start, int64_t table_rows, const int64_t* ids, const int64_t* order,
                       const int64_t* leader, int64_t n, void* out, int out_kind, int quant, float table_scale,
                       int* error_flag, int max_blocks, void* stream);

/* A range check over ids [n]: sets *error_flag for any id outside [lo, hi). With lo = -1 and hi the table's
 * rows, engram_gather_cuda's check, for a rank that gathers some columns of a step whose other columns its
 * peers read; with [0, vocab), the n-gram hash's check of its token ids. */
int engram_check_ids_cuda(const int64_t* ids, int64_t n, int64_t lo, int64_t hi, int* error_flag, void* stream);

/* As engram_ngram_hash_cpu, all pointers in device memory. */
int engram_ngram_hash_cuda(const int64_t* ext, const int64_t* start, int64_t tokens, int64_t context,
                           const int64_t* multipliers, const int64_t* primes, const int64_t* magic,
                           const int64_t* offsets, int64_t layers, int64_t max_ngram, int64_t heads, int64_t fill,
                           int64_t* out, void* stream);

/* Host registration for UVA (engram/memory/registration.py), each returning the cudaError_t. */
int engram_host_register(void* host, uint64_t size, unsigned int flags);
int engram_host_unregister(void* host);
int engram_host_get_device_pointer(void** device, void* host);
/* cudaPointerGetAttributes(pointer).type into *type: 0 unregistered, 1 page-locked host, 2 device, 3 managed */
int engram_pointer_memory_type(int* type, const void* pointer);
/* cudaDeviceGetAttribute(attribute, device; -1 the current one) into *value, e.g. 113: read-only host
 * registration supported */
int engram_device_attribute(int* value, int attribute, int device);
/* Host memory the GPU maps with 2 MiB pages (engram_runtime.cu): `bytes` (rounded up to the allocation
 * granularity, *padded) of pinned cuMem on host NUMA node `numa_node` (-1: the current GPU's nearest),
 * created in chunks of chunk_bytes (a multiple of the granularity) and mapped at one address (*address) the
 * host and the current GPU both read and write; *granularity the page size, *node_used the node. Returns
 * a CUresult; on failure nothing is left allocated or mapped, and *step names the call that failed (1:
 * finding the driver's calls, 2 cuDeviceGet, 3 the NUMA node, 4 the granularity, 5 cuMemCreate, 6
 * cuMemAddressReserve, 7 cuMemMap, 8 cuMemSetAccess). unmap undoes a map of `padded` bytes at `address`. */
int engram_host_numa_map(uint64_t bytes, uint64_t chunk_bytes, int numa_node, uint64_t* address, uint64_t* padded,
                         uint64_t* granularity, int* node_used, int* step);
int engram_host_numa_unmap(uint64_t address, uint64_t padded, uint64_t chunk_bytes);
int engram_cuda_get_last_error(void); /* cudaGetLastError: returns and clears the sticky error */
int engram_cuda_last_error(void);     /* the error behind the last ENGRAM_ERR_CUDA of this library */
const char* engram_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif
