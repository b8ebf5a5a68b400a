/* A stand-in for the CUDA kernel library with the same C ABI, for testing the ctypes loading path and the
 * error handling without a GPU. stub_set() chooses what the next calls return. */
#include <stdint.h>
#include <string.h>

static int next_status = 0, cuda_error = 0, register_code = 0, pointer_code = 0, sticky = 0, registered = 0;

void stub_set(int status, int error, int reg, int ptr) {
    next_status = status;
    cuda_error = error;
    register_code = reg;
    pointer_code = ptr;
}
int stub_registered(void) { return registered; }

int engram_gather_cuda(const void* w, const void* s, int64_t rows, int64_t dim, int64_t rb, int64_t start, int64_t table,
                       const int64_t* ids, const int64_t* order, const int64_t* leader, int64_t n, void* out, int kind,
                       int quant, float table_scale, int* flag, int max_blocks, void* stream) {
    (void)w; (void)s; (void)rows; (void)dim; (void)rb; (void)start; (void)table; (void)ids; (void)order; (void)leader; (void)n;
    (void)out; (void)kind; (void)quant; (void)table_scale; (void)flag; (void)max_blocks; (void)stream;
    return next_status;
}
int engram_check_ids_cuda(const int64_t* ids, int64_t n, int64_t lo, int64_t hi, int* flag, void* stream) {
    (void)ids; (void)n; (void)lo; (void)hi; (void)flag; (void)stream;
    return next_status;
}
int engram_ngram_hash_cuda(const int64_t* e, const int64_t* st, int64_t t, int64_t c, const int64_t* m, const int64_t* p,
                           const int64_t* mg, const int64_t* o, int64_t l, int64_t n, int64_t h, int64_t f, int64_t* out, void* s) {
    (void)e; (void)st; (void)t; (void)c; (void)m; (void)p; (void)mg; (void)o; (void)l; (void)n; (void)h; (void)f; (void)out; (void)s;
    return next_status;
}
int engram_host_register(void* host, uint64_t size, unsigned int flags) {
    (void)host; (void)size; (void)flags;
    if (register_code) { sticky = register_code; return register_code; }
    registered += 1;
    return 0;
}
int engram_host_unregister(void* host) { (void)host; registered -= 1; return 0; }
int engram_host_get_device_pointer(void** device, void* host) {
    if (pointer_code) { sticky = pointer_code; return pointer_code; }
    *device = host;
    return 0;
}
/* Registered memory reports as page-locked host memory (1), anything else as unregistered (0); stub_lie
 * makes registration "succeed" without the driver knowing, the failure the check must catch. */
static int lie = 0;
void stub_lie(int value) { lie = value; }
int engram_pointer_memory_type(int* type, const void* pointer) {
    (void)pointer;
    *type = registered > 0 && !lie ? 1 : 0;
    return 0;
}
/* Device attribute 113 (read-only host registration supported) answers stub_set_read_only's value; 134
 * (the host NUMA node) -1: no host-NUMA cuMem here, so tables are registered. */
static int read_only_supported = 1;
void stub_set_read_only(int value) { read_only_supported = value; }
int engram_device_attribute(int* value, int attribute, int device) {
    (void)device;
    *value = attribute == 113 ? read_only_supported : attribute == 134 ? -1 : 0;
    return 0;
}
int engram_host_numa_map(uint64_t bytes, uint64_t chunk, int node, uint64_t* address, uint64_t* padded,
                         uint64_t* granularity, int* node_used, int* step) {
    (void)bytes; (void)chunk; (void)node;
    *address = *padded = *granularity = 0, *node_used = -1, *step = 3;
    return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
int engram_host_numa_unmap(uint64_t address, uint64_t padded, uint64_t chunk) { (void)address; (void)padded; (void)chunk; return 801; }
int engram_cuda_get_last_error(void) { int code = sticky; sticky = 0; return code; }
int engram_cuda_last_error(void) { return cuda_error; }
const char* engram_cuda_error_string(int code) { return code == 2 ? "out of memory" : code == 1 ? "invalid argument" : "unknown error"; }
