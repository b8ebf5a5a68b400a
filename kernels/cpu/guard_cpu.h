/* Reads of a table that a file backs can fault: a checkpoint truncated while mapped turns the pages
 * past its new end into SIGBUS. A guarded region catches that fault on the thread that took it and
 * returns an error instead of killing the process. Every other SIGBUS goes to the handler that was
 * installed before ours (the default: the process dies, as it would have without engram).
 *
 *     if (ENGRAM_GUARD_ENTER()) { ... reads ... } else { ... the region faulted ... }
 *     engram_guard_leave();
 *
 * The handler runs with SA_NODEFER, so jumping out of it leaves SIGBUS unblocked without saving the
 * signal mask at every entry (sigsetjmp(..., 0) is a few instructions, no system call). */
#ifndef ENGRAM_GUARD_CPU_H
#define ENGRAM_GUARD_CPU_H

#include <setjmp.h>

typedef struct {
    volatile int active;
    sigjmp_buf jump;
} engram_guard_t;

extern __thread engram_guard_t engram_guard;

int engram_guard_install(void); /* 0, or -1 when the handler cannot be installed */
void engram_guard_leave(void);

#define ENGRAM_GUARD_ENTER() (sigsetjmp(engram_guard.jump, 0) == 0 && (engram_guard.active = 1))

#endif
