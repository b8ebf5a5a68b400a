/* io_uring by raw system calls (no liburing): a ring's setup, its three shared mappings and its teardown,
 * for the reads past the page cache (direct_cpu.c) and the benchmark's readers. */
#ifndef ENGRAM_URING_CPU_H
#define ENGRAM_URING_CPU_H

#include <errno.h>
#include <linux/io_uring.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe* sqes;
    struct io_uring_cqe* cqes;
    void *sq_ring, *cq_ring;
    size_t sq_bytes, cq_bytes, sqe_bytes;
} ring_t;

/* Everything the ring holds released, once: a second call does nothing. */
static inline void ring_close(ring_t* r) {
    if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqe_bytes);
    if (r->cq_ring && r->cq_ring != MAP_FAILED) munmap(r->cq_ring, r->cq_bytes);
    if (r->sq_ring && r->sq_ring != MAP_FAILED) munmap(r->sq_ring, r->sq_bytes);
    if (r->fd >= 0) close(r->fd);
    r->sqes = NULL, r->cq_ring = r->sq_ring = NULL, r->fd = -1;
}

/* 0, or -errno; ENOSYS also where the kernel cannot bound a wait (no IORING_FEAT_EXT_ARG, before 5.11). */
static inline int ring_open(ring_t* r, unsigned depth) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    memset(r, 0, sizeof *r);
    r->fd = (int)syscall(__NR_io_uring_setup, depth, &p);
    if (r->fd < 0) return -errno;
    if (!(p.features & IORING_FEAT_EXT_ARG)) {
        ring_close(r);
        return -ENOSYS;
    }
    r->sq_bytes = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_bytes = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    r->sqe_bytes = p.sq_entries * sizeof(struct io_uring_sqe);
    const int prot = PROT_READ | PROT_WRITE, flags = MAP_SHARED | MAP_POPULATE;
    r->sq_ring = mmap(NULL, r->sq_bytes, prot, flags, r->fd, IORING_OFF_SQ_RING);
    r->cq_ring = mmap(NULL, r->cq_bytes, prot, flags, r->fd, IORING_OFF_CQ_RING);
    r->sqes = mmap(NULL, r->sqe_bytes, prot, flags, r->fd, IORING_OFF_SQES);
    if (r->sq_ring == MAP_FAILED || r->cq_ring == MAP_FAILED || r->sqes == MAP_FAILED) {
        ring_close(r);
        return -ENOMEM;
    }
    char *sq = r->sq_ring, *cq = r->cq_ring;
    r->sq_tail = (unsigned*)(sq + p.sq_off.tail), r->sq_mask = (unsigned*)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned*)(sq + p.sq_off.array);
    r->cq_head = (unsigned*)(cq + p.cq_off.head), r->cq_tail = (unsigned*)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned*)(cq + p.cq_off.ring_mask), r->cqes = (struct io_uring_cqe*)(cq + p.cq_off.cqes);
    return 0;
}

#endif
