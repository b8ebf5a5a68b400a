#define _POSIX_C_SOURCE 200809L
#include "guard_cpu.h"

#include <signal.h>
#include <string.h>

__thread engram_guard_t engram_guard;
static struct sigaction previous;

static void on_sigbus(int sig, siginfo_t* info, void* context) {
    (void)sig, (void)info, (void)context;
    if (engram_guard.active) {
        engram_guard.active = 0;
        siglongjmp(engram_guard.jump, 1);
    }
    /* Not a guarded read: put the old disposition back; returning re-runs the access, which faults again
     * under it. */
    sigaction(SIGBUS, &previous, NULL);
}

int engram_guard_install(void) {
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return 0;
    /* Installed on every call that finds it missing: a handler set after ours (faulthandler, say) is
     * kept as the one to fall back to. */
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&ours.sa_mask);
    return sigaction(SIGBUS, &ours, &previous) == 0 ? 0 : -1;
}

void engram_guard_leave(void) { engram_guard.active = 0; }
