/* engram_read_direct_cpu (engram_kernels.h): rows of a file read from the disk straight into a RAM tier's
 * slots, through io_uring with O_DIRECT, not through the page cache. Under a memory limit a read through
 * the page cache first reclaims a page (most of a cold page's CPU: unmapping it, flushing TLBs); these
 * reads add no page, so nothing is reclaimed for them. Raw system calls, no liburing.
 *
 * The buffers the reads land in are this file's own mapping, never the caller's: a read still in flight
 * after a timeout may write there later, so that mapping is then left mapped rather than reused.
 *
 * Each thread keeps its ring between calls (setting one up costs a descriptor, three mappings and a
 * system call that a sandbox may forbid later): made on the thread's first call, made again for a new
 * depth, in a forked child (whose inherited ring is its parent's) and after a failure or a timeout
 * (reads still in flight), and released when the thread ends. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../engram_kernels.h"
#include "uring_cpu.h"

#define ALIGN 4096 /* O_DIRECT's alignment of offsets, lengths and buffers: a page covers every device's */
#define MAX_RANGE (INT64_C(1) << 30) /* a read's length is 32 bits */
#define MAX_DEPTH 4096

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The shard's pieces: piece s holds shard-local rows [starts[s], starts[s + 1]) at offsets[s] of fds[s]. */
typedef struct {
    const int* fds;
    const int64_t *offsets, *starts;
    int64_t segments, shard_rows, row_bytes;
} pieces_t;

static int64_t piece_end(const pieces_t* p, int64_t s) { return s + 1 < p->segments ? p->starts[s + 1] : p->shard_rows; }

/* The file offset of shard-local row `row`, in piece s. */
static int64_t row_offset(const pieces_t* p, int64_t s, int64_t row) {
    return p->offsets[s] + (row - p->starts[s]) * p->row_bytes;
}

/* The range of rows [first, last], all of piece `piece`, is read as [lo, hi) of its file: their pages,
 * aligned. */
typedef struct {
    int64_t first, last, lo, piece;
    int64_t need; /* bytes of the read that must come back: through the last row's end */
} range_t;

/* The next range from rows[*k] (in piece *s, which advances with the rows): rows of the same piece whose
 * pages lie at most gap_bytes past the range's end, while it spans at most max_range_bytes (one row longer
 * than that is a range of its own). */
static range_t next_range(const pieces_t* p, const int64_t* rows, int64_t n, int64_t* k, int64_t* s, int64_t gap_bytes,
                          int64_t max_range_bytes) {
    while (rows[*k] >= piece_end(p, *s)) ++*s;
    range_t r;
    r.first = r.last = *k, r.piece = *s;
    const int64_t start = row_offset(p, *s, rows[*k]), end_row = piece_end(p, *s);
    r.lo = start / ALIGN * ALIGN;
    int64_t end = start + p->row_bytes;
    for (++*k; *k < n && rows[*k] < end_row; ++*k) {
        const int64_t b = row_offset(p, *s, rows[*k]), e = b + p->row_bytes;
        const int64_t hi = (end + ALIGN - 1) / ALIGN * ALIGN;
        if (b / ALIGN * ALIGN > hi + gap_bytes || (e + ALIGN - 1) / ALIGN * ALIGN - r.lo > max_range_bytes) break;
        end = e, r.last = *k;
    }
    r.need = end - r.lo;
    return r;
}

/* Private anonymous memory for a call's buffers, or NULL. */
typedef struct {
    ring_t ring;
    unsigned depth;
    pid_t owner;
} kept_ring_t;

static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

static void kept_release(void* kept) {
    ring_close(&((kept_ring_t*)kept)->ring);
    free(kept);
}

static void kept_init(void) { (void)pthread_key_create(&kept_key, kept_release); }

/* This thread's ring of `depth` entries: kept from its last call when that one is still good, else made
 * now. 0, or -errno. */
static int kept_ring(unsigned depth, ring_t** ring) {
    pthread_once(&kept_once, kept_init);
    kept_ring_t* kept = pthread_getspecific(kept_key);
    if (!kept) {
        kept = calloc(1, sizeof *kept);
        if (!kept) return -ENOMEM;
        kept->ring.fd = -1;
        if (pthread_setspecific(kept_key, kept)) {
            free(kept);
            return -ENOMEM;
        }
    }
    if (kept->ring.fd >= 0 && (kept->owner != getpid() || kept->depth != depth))
        ring_close(&kept->ring); /* a forked child's copy unmaps and closes only the child's */
    if (kept->ring.fd < 0) {
        const int opened = ring_open(&kept->ring, depth);
        if (opened) return opened;
        kept->depth = depth, kept->owner = getpid();
    }
    *ring = &kept->ring;
    return 0;
}

static void* scratch(size_t bytes) {
    void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int engram_read_direct_cpu(const int* fds, const int64_t* file_sizes, const int64_t* offsets, const int64_t* starts,
                           int64_t segments, int64_t shard_rows, int64_t row_bytes, const int64_t* rows,
                           const int64_t* slots, int64_t n, uint8_t* dst, int64_t dst_rows, int64_t gap_bytes,
                           int64_t max_range_bytes, int64_t depth, int64_t timeout_ms, int64_t* ranges, int64_t* bytes,
                           int64_t* os_error) {
    if (!os_error) return ENGRAM_ERR_ARGUMENT;
    *os_error = 0;
    if (!fds || !file_sizes || !offsets || !starts || segments < 1 || shard_rows < 0 || n < 0 || dst_rows < 0)
        return ENGRAM_ERR_ARGUMENT;
    if (row_bytes < 1 || row_bytes > MAX_RANGE || (n && (!rows || !slots || !dst))) return ENGRAM_ERR_ARGUMENT;
    if (gap_bytes < 0 || depth < 1 || depth > MAX_DEPTH || timeout_ms < 1) return ENGRAM_ERR_ARGUMENT;
    if (max_range_bytes < ALIGN || max_range_bytes % ALIGN || max_range_bytes > MAX_RANGE) return ENGRAM_ERR_ARGUMENT;
    if (shard_rows > INT64_MAX / row_bytes || dst_rows > INT64_MAX / row_bytes || starts[0] != 0)
        return ENGRAM_ERR_ARGUMENT;
    const pieces_t p = {fds, offsets, starts, segments, shard_rows, row_bytes};
    for (int64_t s = 0; s < segments; ++s) { /* every piece ascending, and lying within its file */
        if ((s && starts[s] <= starts[s - 1]) || (shard_rows && starts[s] >= shard_rows)) return ENGRAM_ERR_ARGUMENT;
        const int64_t piece_rows = piece_end(&p, s) - starts[s];
        if (fds[s] < 0 || offsets[s] < 0 || file_sizes[s] < 0) return ENGRAM_ERR_ARGUMENT;
        if (piece_rows > (INT64_MAX - offsets[s]) / row_bytes || offsets[s] + piece_rows * row_bytes > file_sizes[s])
            return ENGRAM_ERR_ARGUMENT;
    }
    for (int64_t i = 0; i < n; ++i) { /* every row and slot in bounds, rows ascending, before any read */
        if (rows[i] < 0 || rows[i] >= shard_rows || (i && rows[i] <= rows[i - 1])) return ENGRAM_ERR_ARGUMENT;
        if (slots[i] < 0 || slots[i] >= dst_rows) return ENGRAM_ERR_ARGUMENT;
    }
    if (ranges) *ranges = 0;
    if (bytes) *bytes = 0;
    if (!n) return ENGRAM_OK;
    /* A buffer holds any range: next_range keeps them within it, and a row alone spans at most this. */
    const int64_t one_row = (row_bytes + 2 * ALIGN - 2) / ALIGN * ALIGN;
    const int64_t span = max_range_bytes > one_row ? max_range_bytes : one_row;

    ring_t* kept;
    const int opened = kept_ring((unsigned)depth, &kept);
    if (opened) {
        *os_error = -opened;
        return ENGRAM_ERR_IO;
    }
    ring_t ring = *kept;
    const size_t buffer_bytes = (size_t)depth * (size_t)span, book_bytes = (size_t)depth * sizeof(range_t);
    uint8_t* buffers = scratch(buffer_bytes);
    range_t* in_flight = scratch(book_bytes); /* each buffer's range, and the free buffers' stack */
    int64_t* free_buffers = scratch((size_t)depth * sizeof(int64_t));
    if (!buffers || !in_flight || !free_buffers) {
        if (buffers) munmap(buffers, buffer_bytes);
        if (in_flight) munmap(in_flight, book_bytes);
        if (free_buffers) munmap(free_buffers, (size_t)depth * sizeof(int64_t));
        *os_error = ENOMEM;
        return ENGRAM_ERR_IO;
    }
    int64_t free_count = depth;
    for (int64_t b = 0; b < depth; ++b) free_buffers[b] = b;

    int64_t k = 0, piece = 0, queued = 0, made = 0, read_bytes = 0;
    const int64_t deadline = now_ms() + timeout_ms;
    unsigned unconsumed = 0; /* entries queued that the kernel has not taken yet: not in flight */
    int error = 0;           /* the first failure: -errno, or 1 for a short read */
    while (queued || (!error && k < n)) { /* after a failure, wait only for the reads in flight */
        unsigned tail = *ring.sq_tail, added = 0;
        for (; !error && k < n && free_count; ++added, ++tail) {
            const int64_t b = free_buffers[--free_count];
            const range_t r = in_flight[b] = next_range(&p, rows, n, &k, &piece, gap_bytes, span);
            struct io_uring_sqe* e = &ring.sqes[tail & *ring.sq_mask];
            memset(e, 0, sizeof *e);
            e->opcode = IORING_OP_READ, e->fd = fds[r.piece], e->off = (uint64_t)r.lo;
            e->addr = (uint64_t)(uintptr_t)(buffers + (size_t)b * (size_t)span);
            e->len = (unsigned)((r.need + ALIGN - 1) / ALIGN * ALIGN), e->user_data = (uint64_t)b;
            ring.sq_array[tail & *ring.sq_mask] = tail & *ring.sq_mask;
        }
        __atomic_store_n(ring.sq_tail, tail, __ATOMIC_RELEASE);
        queued += added, made += added, unconsumed += added;
        int64_t left = deadline - now_ms();
        left = left < 1 ? 1 : left > 1000 ? 1000 : left;
        struct __kernel_timespec wait = {.tv_sec = left / 1000, .tv_nsec = left % 1000 * 1000000};
        struct io_uring_getevents_arg arg = {.sigmask = 0, .sigmask_sz = _NSIG / 8, .pad = 0, .ts = (uint64_t)(uintptr_t)&wait};
        const long taken = syscall(__NR_io_uring_enter, ring.fd, unconsumed, 1,
                                   IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof arg);
        if (taken < 0 && errno != EINTR && errno != ETIME && errno != EAGAIN && errno != EBUSY) {
            error = error ? error : -errno;
            if (queued == (int64_t)unconsumed) break; /* none in flight: the entries left are dropped with the ring */
        }
        unconsumed -= taken > 0 ? (unsigned)taken : 0;
        unsigned head = *ring.cq_head;
        const unsigned end = __atomic_load_n(ring.cq_tail, __ATOMIC_ACQUIRE);
        for (; head != end; ++head, --queued) {
            const struct io_uring_cqe* c = &ring.cqes[head & *ring.cq_mask];
            const int64_t b = (int64_t)c->user_data;
            const range_t r = in_flight[b];
            if (c->res < 0) {
                error = error ? error : c->res;
            } else if (c->res < r.need) { /* the file ends before the range's last row does: it shrank */
                error = error ? error : 1;
            } else {
                const uint8_t* got = buffers + (size_t)b * (size_t)span;
                for (int64_t i = r.first; i <= r.last; ++i)
                    memcpy(dst + slots[i] * row_bytes, got + (row_offset(&p, r.piece, rows[i]) - r.lo), (size_t)row_bytes);
                read_bytes += c->res;
            }
            free_buffers[free_count++] = b;
        }
        __atomic_store_n(ring.cq_head, head, __ATOMIC_RELEASE);
        if (queued && now_ms() > deadline) { /* the device stopped answering */
            *os_error = error < 0 ? -error : ETIMEDOUT;
            ring_close(kept); /* reads still in flight may land in `buffers` later: they stay mapped */
            munmap(in_flight, book_bytes);
            munmap(free_buffers, (size_t)depth * sizeof(int64_t));
            return ENGRAM_ERR_IO;
        }
    }
    if (error) ring_close(kept); /* the next call starts from a fresh ring */
    munmap(buffers, buffer_bytes);
    munmap(in_flight, book_bytes);
    munmap(free_buffers, (size_t)depth * sizeof(int64_t));
    if (ranges) *ranges = made;
    if (bytes) *bytes = read_bytes;
    if (error) {
        *os_error = error == 1 ? 0 : -error;
        return ENGRAM_ERR_IO;
    }
    return ENGRAM_OK;
}
