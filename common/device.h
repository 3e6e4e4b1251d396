/* device.h — a *logical* device: where memory lives and work runs, with an honest memory account.
 *
 * A Device is either the CPU backend (plain C reference ops, host memory) or one CUDA GPU with its
 * own compute stream, copy stream, cuDNN and cuBLAS handles. Several logical devices may share one
 * physical GPU (stage 2 and 3 on a one-GPU machine): each keeps its own streams and memory account.
 *
 * Every byte the trainer asks for goes through device_alloc, so mem_peak is the number
 * torch.cuda.max_memory_allocated() would report (sizes are rounded up to 512 bytes, as PyTorch's
 * caching allocator does), cuDNN workspaces included. Nothing in the training step allocates.
 *
 * Built without CUDA (no toolkit found), only DEV_CPU exists and the CUDA macros compile away. */
#ifndef DEVICE_H
#define DEVICE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h" /* time_now, for host-side timing */
#include "errors.h"

#ifdef USE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

typedef enum { DEV_CPU = 0, DEV_CUDA = 1 } DeviceKind;

typedef struct Device {
    DeviceKind kind;
    int index;         /* logical index within this process (replica / rank number) */
    int ordinal;       /* physical CUDA ordinal; -1 for CPU */
    char name[96];     /* "cpu0" (cpuN: the index) or e.g. "cuda:0 (NVIDIA H200)" */
    /* options, set before device_init by the caller (or left 0) */
    int deterministic; /* deterministic cuDNN algorithms only */
    int benchmark;     /* choose conv algorithms by measurement (cudnnFind*) */
    int allow_tf32;    /* PyTorch's default for cuDNN convolutions is True */
    /* memory account (bytes, rounded as PyTorch rounds) */
    size_t mem_cur, mem_peak;
    size_t mem_total;  /* the device's memory: the GPU's, or the host's RAM for the CPU backend */
    size_t mem_limit;  /* --memory-fraction × mem_total (0: no cap but the device's own) */
    pthread_mutex_t mem_lock;
    struct AllocRecord *allocs; /* live allocations, to know a pointer's size on free */
    int n_allocs, cap_allocs;
    /* one conv workspace per device, grown on demand at setup time (never during a step) */
    void *workspace;
    size_t workspace_bytes;
    /* batch norm's per-chunk partial sums (kernels.cu), grown at setup by bn_prepare */
    void *bn_scratch;
    size_t bn_scratch_bytes;
#ifdef USE_CUDA
    cudaStream_t stream;      /* compute */
    cudaStream_t copy_stream; /* host-to-device batch copies, overlapping compute */
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
#endif
} Device;

/* --memory-fraction, torch.cuda.set_per_process_memory_fraction: each device this process opens
 * caps what it hands out at this fraction of its total memory (a GPU's, or the host's RAM for the
 * CPU backend); an allocation past the cap fails like a real out-of-memory, with the same error.
 * 1 (the default) sets no cap. Read by device_init. */
extern double device_memory_fraction;
/* What the out-of-memory error tells the user to change, in this run's terms (config_resolve sets
 * it from the flags: the batch size now, a smaller model when there is one, accumulation where the
 * stage has it). The default suits a program that set nothing. */
extern char device_oom_fix[256];
/* Whether a smaller model than this run's exists (--model tiny): the advice when the model's own
 * state does not fit, where no batch size helps. Set by config_resolve, like device_oom_fix. */
extern int device_oom_smaller_model;

/* How many CUDA devices are visible (0 when built without CUDA or no driver/GPU). Never dies. */
int device_cuda_count(void);

/* Initialise a logical device. kind DEV_CUDA with ordinal o; index is the logical number. */
void device_init(Device *d, DeviceKind kind, int index, int ordinal);
void device_destroy(Device *d);
/* Make this device current for the calling thread (cudaSetDevice); no-op on CPU. */
void device_bind(Device *d);

/* Memory: all accounted. Device memory on CUDA, 64-byte aligned host memory on CPU. Dies with a
 * clear out-of-memory message naming the device, the request and the current/peak use. */
void *device_alloc(Device *d, size_t bytes, const char *what);
/* The bytes device_alloc accounts for a request of `bytes` (rounded up to 512, at least 512). */
size_t device_alloc_size(size_t bytes);
void device_free(Device *d, void *p);
/* What an allocation may still take now: the GPU's free memory, within --memory-fraction's cap
 * (the cudnn.benchmark search sizes its scratch workspace from it). */
size_t device_mem_available(Device *d);
/* Make sure the device's shared conv workspace has at least `bytes` (accounted). */
void *device_workspace(Device *d, size_t bytes);
void device_reset_peak(Device *d);

/* Page-locked host memory (for --pin-memory); falls back to malloc on CPU. Not in the device account. */
void *host_alloc(Device *d, size_t bytes, int pinned);
void host_free(Device *d, void *p, int pinned);

/* Copies, ordered on the device's compute stream (async on CUDA; plain memcpy on CPU). */
void device_memset0(Device *d, void *p, size_t bytes);
void device_copy_h2d(Device *d, void *dst, const void *src, size_t bytes);
void device_copy_d2h(Device *d, void *dst, const void *src, size_t bytes); /* synchronous */
void device_copy_d2d(Device *d, void *dst, const void *src, size_t bytes);
void device_sync(Device *d); /* wait for everything issued on the device's streams */


/* --device flag: "auto" | "cuda" | "cpu" → kind. auto = CUDA when a GPU is visible, else CPU with
 * a one-line notice on stdout. "cuda" without a GPU is a user error. */
DeviceKind device_kind_from_flag(const char *flag, int quiet);

#ifdef USE_CUDA
#define CHECK_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die_at(__FILE__, __LINE__, #call, cudaGetErrorString(e_), cuda_hint(e_));              \
    } while (0)
#define CHECK_CUDNN(call)                                                                          \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                            \
            die_at(__FILE__, __LINE__, #call, cudnnGetErrorString(s_), cudnn_hint(s_));            \
    } while (0)
#define CHECK_CUBLAS(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            die_at(__FILE__, __LINE__, #call, cublasGetStatusString(s_), NULL);                    \
    } while (0)
/* After a kernel launch: catches bad launch configurations at the launch site. */
#define CHECK_LAUNCH() CHECK_CUDA(cudaGetLastError())
const char *cuda_hint(cudaError_t e);
const char *cudnn_hint(cudnnStatus_t s);
#endif

/* ---- a second stream ------------------------------------------------------------------------- */
/* A side stream of a device (PyTorch: a torch.cuda.Stream()), for work that overlaps the compute
 * stream — DDP's --optimizer-overlap in-backward steps each bucket on one while backward goes on. Between
 * side_stream_enter and side_stream_leave, everything issued on the device runs on the side stream
 * (`with torch.cuda.stream(s):`): our own kernels, and comm_wait, which then makes the side stream
 * wait. cuDNN's and cuBLAS's handles stay bound to the compute stream: no conv or GEMM in between.
 * The CPU backend has no streams: the work runs at once, in order. */
typedef struct SideStream {
    Device *dev;
#ifdef USE_CUDA
    cudaStream_t stream, saved;
    cudaEvent_t mark;
#endif
    int entered;
} SideStream;
void side_stream_init(SideStream *s, Device *d);
void side_stream_destroy(SideStream *s);
void side_stream_enter(SideStream *s);
void side_stream_leave(SideStream *s);
/* The side stream waits for everything issued so far on the compute stream (s.wait_stream(current)). */
void side_stream_wait_compute(SideStream *s);
/* The compute stream waits for everything issued so far on the side stream (current.wait_stream(s)). */
void side_stream_join(SideStream *s);

/* ---- copies between logical devices (stage 2's scatter, broadcast, gather, reduce) ------------- */
/* Copy `bytes` from src (memory of src_dev) to dst (memory of dst_dev), ordered on the compute
 * stream of `on`, which must be src_dev or dst_dev; the caller orders the other device's stream
 * with events. CPU: memcpy. CUDA: cudaMemcpyPeerAsync — direct over NVLink/PCIe when peer access is
 * on (device_enable_peer), staged through host memory by the driver when it is not, and a plain
 * device-to-device copy when both logical devices share one GPU. */
void device_copy_peer(Device *on, void *dst, const Device *dst_dev, const void *src,
                      const Device *src_dev, size_t bytes);
/* Turn on peer access between the GPUs of two logical devices, both ways. Returns 1 when copies
 * between them are direct (peer access on, or the same GPU, or CPU), 0 when the GPUs cannot reach
 * each other directly (copies then go through host memory). */
int device_enable_peer(Device *a, Device *b);

#endif
