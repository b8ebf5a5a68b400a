/* The two other ways of reading scattered rows that bench_cold_rows.py sets beside engram's readahead,
 * in C so that neither is slowed by Python: one pread per row from a pool of threads, and the same reads
 * submitted through io_uring (raw system calls, no liburing) with a fixed number in flight. Both read
 * `n` extents (offsets[i], lengths[i] <= max_length) of the file `fd` and return 0, or -errno. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int bench_pread_pool(int fd, const int64_t* offsets, const int64_t* lengths, int64_t n, int64_t max_length,
                     int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(min : failed)
    {
        char* buffer = malloc((size_t)max_length);
        if (!buffer) failed = -ENOMEM;
#pragma omp for schedule(dynamic, 16)
        for (int64_t i = 0; i < n; ++i) {
            if (buffer && pread(fd, buffer, (size_t)lengths[i], offsets[i]) != lengths[i]) failed = -EIO;
        }
        free(buffer);
    }
    return failed;
}

#include "../../kernels/cpu/uring_cpu.h" /* ring_open, ring_close: engram's own */

int bench_uring_reads(int fd, const int64_t* offsets, const int64_t* lengths, int64_t n, int64_t max_length,
                      unsigned depth) {
    ring_t ring;
    int status = ring_open(&ring, depth);
    char* buffers = malloc((size_t)depth * (size_t)max_length);
    unsigned* free_slots = malloc(depth * sizeof *free_slots);
    unsigned free_count = depth;
    for (unsigned s = 0; s < depth && free_slots; ++s) free_slots[s] = s;
    if (!status && (!buffers || !free_slots)) status = -ENOMEM;
    int64_t submitted = 0, done = 0;
    unsigned unconsumed = 0; /* queued entries the kernel has not taken yet (an interrupted enter) */
    while (done < submitted || (!status && submitted < n)) { /* after an error, wait for what is in flight */
        unsigned tail = *ring.sq_tail, queued = 0;
        for (; !status && submitted < n && free_count; ++submitted, ++queued, ++tail) {
            const unsigned slot = free_slots[--free_count], at = tail & *ring.sq_mask;
            struct io_uring_sqe* e = &ring.sqes[at];
            memset(e, 0, sizeof *e);
            e->opcode = IORING_OP_READ, e->fd = fd, e->off = (uint64_t)offsets[submitted];
            e->addr = (uint64_t)(uintptr_t)(buffers + (size_t)slot * (size_t)max_length);
            e->len = (unsigned)lengths[submitted], e->user_data = slot | (uint64_t)lengths[submitted] << 32;
            ring.sq_array[at] = at;
        }
        __atomic_store_n(ring.sq_tail, tail, __ATOMIC_RELEASE);
        unconsumed += queued;
        const long taken = syscall(__NR_io_uring_enter, ring.fd, unconsumed, 1, IORING_ENTER_GETEVENTS, NULL, 0);
        if (taken < 0 && errno != EINTR) {
            status = -errno;
            ring_close(&ring);
            return status; /* reads may still be in flight into the buffers: leave them allocated */
        }
        unconsumed -= taken > 0 ? (unsigned)taken : 0;
        unsigned head = *ring.cq_head;
        for (const unsigned end = __atomic_load_n(ring.cq_tail, __ATOMIC_ACQUIRE); head != end; ++head, ++done) {
            const struct io_uring_cqe* c = &ring.cqes[head & *ring.cq_mask];
            if (c->res != (int)(c->user_data >> 32)) status = c->res < 0 ? c->res : -EIO;
            free_slots[free_count++] = (unsigned)c->user_data;
        }
        __atomic_store_n(ring.cq_head, head, __ATOMIC_RELEASE);
    }
    ring_close(&ring);
    free(buffers);
    free(free_slots);
    return status;
}
