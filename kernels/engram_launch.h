/* Inside the CUDA library only: the status of the launch just made (ENGRAM_OK, or ENGRAM_ERR_CUDA with the
 * CUDA error kept for engram_cuda_last_error). Non-blocking: it never waits for the kernel.
 *
 * ENGRAM_LAUNCH(grid, block, stream, kernel)(args...) is kernel<<<grid, block, 0, stream>>>(args...) under
 * nvcc, and a loop over the grid on the CPU in the emulated build (kernels/emulate/cuda_runtime.h), so
 * both run these same files. The kernel comes last: a template's commas stay inside the macro's "...". */
#ifndef ENGRAM_LAUNCH_H
#define ENGRAM_LAUNCH_H

#if defined(ENGRAM_EMULATED)
#define ENGRAM_LAUNCH(grid, block, stream, ...) ENGRAM_EMULATED_LAUNCH(grid, block, stream, __VA_ARGS__)
#else
#define ENGRAM_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif

int engram_launch_status();

#endif
