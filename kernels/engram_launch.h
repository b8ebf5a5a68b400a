/* Inside the CUDA library only: the status of the launch just made (ENGRAM_OK, or ENGRAM_ERR_CUDA with the
 * CUDA error kept for engram_cuda_last_error). Non-blocking: it never waits for the kernel. */
#ifndef ENGRAM_LAUNCH_H
#define ENGRAM_LAUNCH_H

int engram_launch_status();

#endif
