/* device.c — logical devices, accounted memory, copies (see device.h). */
#include "device.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* PyTorch's caching allocator hands out blocks in multiples of 512 bytes; rounding the same way
 * keeps our peak comparable with torch.cuda.max_memory_allocated(). */
#define ALLOC_ROUND 512

typedef struct AllocRecord {
    void *p;
    size_t bytes;
} AllocRecord;

char device_oom_fix[256] = "lower --batch-size, or use --model tiny";
int device_oom_smaller_model = 1;

/* The CPU backend's devices (stage 2's virtual ones among them) share the host's memory. Linux
 * overcommits: allocations that each fit, but not together, all succeed, and the run is killed
 * (exit 137, no message) as their pages fill. So their sum is held against what the kernel would
 * hand out when the first was made. */
static pthread_mutex_t cpu_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t cpu_mem_in_use;
static double cpu_mem_budget; /* 0: not read yet */
static int cpu_devices;

static int cpu_mem_take(size_t bytes) {
    pthread_mutex_lock(&cpu_mem_lock);
    if (cpu_mem_budget <= 0) cpu_mem_budget = host_mem_available() + (double)cpu_mem_in_use;
    int ok = (double)cpu_mem_in_use + (double)bytes <= cpu_mem_budget;
    if (ok) cpu_mem_in_use += bytes;
    pthread_mutex_unlock(&cpu_mem_lock);
    return ok;
}

static void cpu_mem_give(size_t bytes) {
    pthread_mutex_lock(&cpu_mem_lock);
    cpu_mem_in_use -= bytes;
    pthread_mutex_unlock(&cpu_mem_lock);
}

#ifdef USE_CUDA
const char *cuda_hint(cudaError_t e) {
    static _Thread_local char oom[320]; /* an error path: each thread formats its own */
    switch (e) {
    case cudaErrorMemoryAllocation:
        snprintf(oom, sizeof oom, "the GPU is out of memory: %s", device_oom_fix);
        return oom;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU/driver: run with --device cpu";
    case cudaErrorInvalidDevice:
        return "asked for a GPU that does not exist: check --gpus / CUDA_VISIBLE_DEVICES";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "binary not built for this GPU: rebuild with `make clean && make CUDA_ARCH=<cc>`";
    default:
        return NULL;
    }
}
const char *cudnn_hint(cudnnStatus_t s) {
    if (s == CUDNN_STATUS_NOT_SUPPORTED) return "this cuDNN does not support the configuration";
    if (s == CUDNN_STATUS_ALLOC_FAILED) return cuda_hint(cudaErrorMemoryAllocation);
    return NULL;
}
#endif

int device_cuda_count(void) {
#ifdef USE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

DeviceKind device_kind_from_flag(const char *flag, int quiet) {
    int n = device_cuda_count();
    if (!strcmp(flag, "cpu")) return DEV_CPU;
    if (!strcmp(flag, "cuda")) {
        if (n == 0)
            die_user("--device cuda: no CUDA GPU is visible%s — run with --device cpu",
#ifdef USE_CUDA
                     ""
#else
                     " (this binary was built without CUDA)"
#endif
            );
        return DEV_CUDA;
    }
    if (n > 0) return DEV_CUDA;
    if (!quiet) printf("note: no CUDA GPU visible — running on the CPU backend (%s)\n", cli_cpu_fallback_what());
    return DEV_CPU;
}

double device_memory_fraction = 1.0;

/* The cap --memory-fraction sets on a device of `total` bytes (0: none). A fraction whose product
 * truncates to 0 bytes (1e-30) caps at 1 byte: every allocation fails, as under PyTorch — a 0 here
 * would read as no cap at all. */
static size_t memory_cap(size_t total) {
    if (device_memory_fraction >= 1.0) return 0;
    const size_t cap = (size_t)(device_memory_fraction * (double)total);
    return cap ? cap : 1;
}

void device_init(Device *d, DeviceKind kind, int index, int ordinal) {
    /* Options (deterministic, benchmark, allow_tf32) were set by the caller; keep them. */
    d->kind = kind;
    d->index = index;
    d->ordinal = kind == DEV_CUDA ? ordinal : -1;
    d->mem_cur = d->mem_peak = 0;
    d->allocs = NULL;
    d->n_allocs = d->cap_allocs = 0;
    d->workspace = NULL;
    d->workspace_bytes = 0;
    d->bn_scratch = NULL;
    d->bn_scratch_bytes = 0;
    xmutex_init(&d->mem_lock);
    if (kind == DEV_CPU) {
        snprintf(d->name, sizeof d->name, "cpu%d", index);
        pthread_mutex_lock(&cpu_mem_lock);
        cpu_devices++;
        pthread_mutex_unlock(&cpu_mem_lock);
        d->mem_total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
        d->mem_limit = memory_cap(d->mem_total);
        return;
    }
#ifdef USE_CUDA
    int n = device_cuda_count();
    if (ordinal < 0 || ordinal >= n)
        die_user("GPU %d requested but only %d visible — lower --gpus/--nproc-per-node or check "
                 "CUDA_VISIBLE_DEVICES", ordinal, n);
    CHECK_CUDA(cudaSetDevice(ordinal));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, ordinal));
    snprintf(d->name, sizeof d->name, "cuda:%d (%.64s)", ordinal, prop.name);
    d->mem_total = prop.totalGlobalMem;
    d->mem_limit = memory_cap(d->mem_total);
    CHECK_CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking));
    CHECK_CUDNN(cudnnCreate(&d->cudnn));
    CHECK_CUDNN(cudnnSetStream(d->cudnn, d->stream));
    CHECK_CUBLAS(cublasCreate(&d->cublas));
    CHECK_CUBLAS(cublasSetStream(d->cublas, d->stream));
    /* Plain fp32 GEMMs, as PyTorch's default (torch.backends.cuda.matmul.allow_tf32 = False). */
    CHECK_CUBLAS(cublasSetMathMode(d->cublas, CUBLAS_DEFAULT_MATH));
    /* cuBLAS would otherwise allocate its own workspace outside our account; give it none. */
    CHECK_CUBLAS(cublasSetWorkspace(d->cublas, NULL, 0));
#else
    die_at(__FILE__, __LINE__, "device_init", "this binary was built without CUDA",
           "rebuild with a CUDA toolkit (see `make help`) or run with --device cpu");
#endif
}

void device_bind(Device *d) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) CHECK_CUDA(cudaSetDevice(d->ordinal));
#endif
}

void device_destroy(Device *d) {
    if (d->workspace) device_free(d, d->workspace);
    d->workspace = NULL;
    if (d->bn_scratch) device_free(d, d->bn_scratch);
    d->bn_scratch = NULL;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        device_bind(d);
        CHECK_CUDA(cudaStreamSynchronize(d->stream));
        for (int i = 0; i < d->n_allocs; i++) cudaFree(d->allocs[i].p);
        cudnnDestroy(d->cudnn);
        cublasDestroy(d->cublas);
        cudaStreamDestroy(d->stream);
        cudaStreamDestroy(d->copy_stream);
    }
#endif
    if (d->kind == DEV_CPU) {
        for (int i = 0; i < d->n_allocs; i++) free(d->allocs[i].p), cpu_mem_give(d->allocs[i].bytes);
        pthread_mutex_lock(&cpu_mem_lock);
        cpu_devices--;
        pthread_mutex_unlock(&cpu_mem_lock);
    }
    free(d->allocs);
    d->allocs = NULL;
    d->n_allocs = 0;
    pthread_mutex_destroy(&d->mem_lock);
}

size_t device_alloc_size(size_t bytes) {
    size_t rounded = (bytes + ALLOC_ROUND - 1) / ALLOC_ROUND * ALLOC_ROUND;
    return rounded ? rounded : ALLOC_ROUND;
}

/* The model's own state, whose size no batch flag changes: out of memory there, a smaller batch is no fix. */
static int batch_independent(const char *what) {
    return !strcmp(what, "parameters") || !strcmp(what, "gradients") || !strncmp(what, "optimizer ", 10);
}

/* Out of memory: the device itself (capped 0), --memory-fraction's cap (1), or the host's memory that
 * the CPU devices share (2). Not a bug, and not a bad flag as such: a run-time error (exit 1) that says
 * what did not fit and which flags would help. */
_Noreturn static void die_oom(const Device *d, size_t rounded, const char *what, int capped) {
    char cap[200] = "", fix[360];
    if (capped == 1)
        snprintf(cap, sizeof cap, ": --memory-fraction %g caps this process at %.3g MiB of the device's %.1f GiB",
                 device_memory_fraction, d->mem_limit / 1048576.0, d->mem_total / 1073741824.0);
    pthread_mutex_lock(&cpu_mem_lock);
    const int devices = cpu_devices;
    const double budget = cpu_mem_budget, in_use = (double)cpu_mem_in_use;
    pthread_mutex_unlock(&cpu_mem_lock);
    if (capped == 2)
        snprintf(cap, sizeof cap, ": this process's %d CPU device%s the host's memory, %.2f GiB available "
                 "at the start, and %.2f GiB of it is taken already", devices, devices == 1 ? " draws on" : "s share",
                 budget / 1073741824.0, in_use / 1073741824.0);
    if (batch_independent(what))
        snprintf(fix, sizeof fix, "%sthe model's own state does not fit, whatever the batch%s",
                 capped == 1 ? "raise --memory-fraction; " : "", device_oom_smaller_model ? ": use --model tiny" : "");
    else snprintf(fix, sizeof fix, "%s%s", capped == 1 ? "raise --memory-fraction, or " : "", device_oom_fix);
    if (capped == 2 && devices > 1) /* stage 2's virtual devices: each holds its replica and chunk */
        snprintf(fix + strlen(fix), sizeof fix - strlen(fix), "; or fewer devices (--gpus)");
    die_runtime("%s: cannot allocate %.1f MiB for %s (in use %.1f MiB, peak %.1f MiB)%s\n  hint: out of memory: %s",
                d->name, rounded / 1048576.0, what, d->mem_cur / 1048576.0, d->mem_peak / 1048576.0, cap, fix);
}

void *device_alloc(Device *d, size_t bytes, const char *what) {
    size_t rounded = device_alloc_size(bytes);
    void *p = NULL;
    pthread_mutex_lock(&d->mem_lock);
    int over = d->mem_limit && d->mem_cur + rounded > d->mem_limit;
    pthread_mutex_unlock(&d->mem_lock);
    if (over) die_oom(d, rounded, what, 1); /* as PyTorch's allocator past set_per_process_memory_fraction */
    if (d->kind == DEV_CPU) {
        if (!cpu_mem_take(rounded)) die_oom(d, rounded, what, 2);
        if (posix_memalign(&p, 64, rounded) != 0) cpu_mem_give(rounded), p = NULL;
    }
#ifdef USE_CUDA
    else {
        device_bind(d);
        cudaError_t e = cudaMalloc(&p, rounded);
        /* Only a failed allocation is out of memory. Any other error is an earlier kernel's fault
         * (an illegal address, say) that this call happened to report: name it, not the batch. */
        if (e != cudaSuccess && e != cudaErrorMemoryAllocation)
            die_at(__FILE__, __LINE__, "cudaMalloc", cudaGetErrorString(e), cuda_hint(e));
        if (e != cudaSuccess) {
            cudaGetLastError();
            p = NULL;
        }
    }
#endif
    if (!p) die_oom(d, rounded, what, 0);
    pthread_mutex_lock(&d->mem_lock);
    if (d->n_allocs == d->cap_allocs) {
        d->cap_allocs = d->cap_allocs ? 2 * d->cap_allocs : 64;
        d->allocs = xrealloc(d->allocs, (size_t)d->cap_allocs * sizeof *d->allocs);
    }
    d->allocs[d->n_allocs++] = (AllocRecord){p, rounded};
    d->mem_cur += rounded;
    if (d->mem_cur > d->mem_peak) d->mem_peak = d->mem_cur;
    pthread_mutex_unlock(&d->mem_lock);
    return p;
}

size_t device_mem_available(Device *d) {
    size_t avail = SIZE_MAX;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        size_t total = 0;
        device_bind(d);
        CHECK_CUDA(cudaMemGetInfo(&avail, &total));
    }
#endif
    pthread_mutex_lock(&d->mem_lock);
    if (d->mem_limit) {
        size_t left = d->mem_limit > d->mem_cur ? d->mem_limit - d->mem_cur : 0;
        if (left < avail) avail = left;
    }
    pthread_mutex_unlock(&d->mem_lock);
    return avail;
}

void device_free(Device *d, void *p) {
    if (!p) return;
    pthread_mutex_lock(&d->mem_lock);
    int i = 0;
    while (i < d->n_allocs && d->allocs[i].p != p) i++;
    ASSERT(i < d->n_allocs); /* freeing memory this device never handed out */
    size_t bytes = d->allocs[i].bytes;
    d->mem_cur -= bytes;
    d->allocs[i] = d->allocs[--d->n_allocs];
    pthread_mutex_unlock(&d->mem_lock);
    if (d->kind == DEV_CPU) free(p), cpu_mem_give(bytes);
#ifdef USE_CUDA
    else {
        device_bind(d);
        /* cudaFree synchronises the device; it only happens at setup/teardown, never in a step. */
        CHECK_CUDA(cudaFree(p));
    }
#endif
}

void *device_workspace(Device *d, size_t bytes) {
    if (bytes <= d->workspace_bytes) return d->workspace;
    if (d->workspace) {
#ifdef USE_CUDA
        if (d->kind == DEV_CUDA) CHECK_CUDA(cudaStreamSynchronize(d->stream));
#endif
        device_free(d, d->workspace);
    }
    d->workspace = device_alloc(d, bytes, "convolution workspace");
    d->workspace_bytes = bytes;
    return d->workspace;
}

void device_reset_peak(Device *d) {
    pthread_mutex_lock(&d->mem_lock);
    d->mem_peak = d->mem_cur;
    pthread_mutex_unlock(&d->mem_lock);
}

void *host_alloc(Device *d, size_t bytes, int pinned) {
#ifdef USE_CUDA
    if (pinned && d && d->kind == DEV_CUDA) {
        void *p = NULL;
        device_bind(d);
        cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
        /* page-locked host memory, not the GPU's: cuda_hint's "the GPU is out of memory" would mislead */
        if (e == cudaErrorMemoryAllocation)
            die_runtime("cannot page-lock %.1f MiB of host memory (cudaMallocHost)\n  hint: the host is short of "
                        "pinned memory: run without --pin-memory, or with fewer --workers or a smaller --batch-size",
                        bytes / 1048576.0);
        if (e != cudaSuccess) die_at(__FILE__, __LINE__, "cudaMallocHost", cudaGetErrorString(e), cuda_hint(e));
        return p;
    }
#endif
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        die_at(__FILE__, __LINE__, "posix_memalign", "out of host memory",
               "lower --batch-size or --workers (the loader's batches in flight are the largest host buffers)");
    return p;
}

void host_free(Device *d, void *p, int pinned) {
    if (!p) return;
#ifdef USE_CUDA
    if (pinned && d && d->kind == DEV_CUDA) {
        CHECK_CUDA(cudaFreeHost(p));
        return;
    }
#endif
    free(p);
}

void device_memset0(Device *d, void *p, size_t bytes) {
    if (d->kind == DEV_CPU) {
        memset(p, 0, bytes);
        return;
    }
#ifdef USE_CUDA
    CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, d->stream));
#endif
}

void device_copy_h2d(Device *d, void *dst, const void *src, size_t bytes) {
    if (d->kind == DEV_CPU) {
        memcpy(dst, src, bytes);
        return;
    }
#ifdef USE_CUDA
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->stream));
#endif
}

void device_copy_d2h(Device *d, void *dst, const void *src, size_t bytes) {
    if (d->kind == DEV_CPU) {
        memcpy(dst, src, bytes);
        return;
    }
#ifdef USE_CUDA
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->stream));
    CHECK_CUDA(cudaStreamSynchronize(d->stream));
#endif
}

void device_copy_d2d(Device *d, void *dst, const void *src, size_t bytes) {
    if (d->kind == DEV_CPU) {
        memmove(dst, src, bytes);
        return;
    }
#ifdef USE_CUDA
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream));
#endif
}

void device_sync(Device *d) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        device_bind(d);
        CHECK_CUDA(cudaStreamSynchronize(d->copy_stream));
        CHECK_CUDA(cudaStreamSynchronize(d->stream));
    }
#endif
}

/* ---- a second stream ------------------------------------------------------------------------- */

void side_stream_init(SideStream *s, Device *d) {
    memset(s, 0, sizeof *s);
    s->dev = d;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        device_bind(d);
        CHECK_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
        CHECK_CUDA(cudaEventCreateWithFlags(&s->mark, cudaEventDisableTiming));
    }
#endif
}

void side_stream_destroy(SideStream *s) {
    ASSERT(!s->entered);
#ifdef USE_CUDA
    if (s->dev && s->dev->kind == DEV_CUDA) {
        CHECK_CUDA(cudaStreamSynchronize(s->stream));
        cudaEventDestroy(s->mark);
        cudaStreamDestroy(s->stream);
    }
#endif
    s->dev = NULL;
}

void side_stream_enter(SideStream *s) {
    ASSERT(!s->entered);
    s->entered = 1;
#ifdef USE_CUDA
    if (s->dev->kind == DEV_CUDA) s->saved = s->dev->stream, s->dev->stream = s->stream;
#endif
}

void side_stream_leave(SideStream *s) {
    ASSERT(s->entered);
    s->entered = 0;
#ifdef USE_CUDA
    if (s->dev->kind == DEV_CUDA) s->dev->stream = s->saved;
#endif
}

void side_stream_wait_compute(SideStream *s) {
    ASSERT(!s->entered);
#ifdef USE_CUDA
    if (s->dev->kind == DEV_CUDA) {
        CHECK_CUDA(cudaEventRecord(s->mark, s->dev->stream));
        CHECK_CUDA(cudaStreamWaitEvent(s->stream, s->mark, 0));
    }
#endif
}

void side_stream_join(SideStream *s) {
    ASSERT(!s->entered);
#ifdef USE_CUDA
    if (s->dev->kind == DEV_CUDA) {
        CHECK_CUDA(cudaEventRecord(s->mark, s->stream));
        CHECK_CUDA(cudaStreamWaitEvent(s->dev->stream, s->mark, 0));
    }
#endif
}

/* ---- copies between logical devices ---------------------------------------------------------- */

void device_copy_peer(Device *on, void *dst, const Device *dst_dev, const void *src,
                      const Device *src_dev, size_t bytes) {
    ASSERT(on == dst_dev || on == src_dev);
    ASSERT(dst_dev->kind == src_dev->kind);
    if (bytes == 0) return;
    if (on->kind == DEV_CPU) {
        memcpy(dst, src, bytes);
        return;
    }
#ifdef USE_CUDA
    device_bind(on); /* the stream belongs to `on`'s GPU */
    CHECK_CUDA(cudaMemcpyPeerAsync(dst, dst_dev->ordinal, src, src_dev->ordinal, bytes, on->stream));
#endif
}

int device_enable_peer(Device *a, Device *b) {
    if (a->kind == DEV_CPU || a->ordinal == b->ordinal) return 1;
#ifdef USE_CUDA
    int ab = 0, ba = 0;
    CHECK_CUDA(cudaDeviceCanAccessPeer(&ab, a->ordinal, b->ordinal));
    CHECK_CUDA(cudaDeviceCanAccessPeer(&ba, b->ordinal, a->ordinal));
    if (!ab || !ba) return 0;
    Device *from[2] = {a, b}, *to[2] = {b, a};
    for (int i = 0; i < 2; i++) {
        device_bind(from[i]);
        cudaError_t e = cudaDeviceEnablePeerAccess(to[i]->ordinal, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError(); /* enabled by an earlier pair */
        else CHECK_CUDA(e);
    }
    return 1;
#else
    return 0;
#endif
}
