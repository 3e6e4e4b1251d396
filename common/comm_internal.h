/* comm_internal.h — what the communicator's backends share (comm.c, comm_nccl.c, comm_host.c).
 *
 * comm.c owns the Comm, the ring of remembered operations and the public calls; each public call
 * goes through the backend's table of operations (CommOps), one table per backend, as nccl-tests
 * does: comm_nccl.c (NCCL and its watchdog) and comm_host.c (the TCP ring and its thread). */
#ifndef COMM_INTERNAL_H
#define COMM_INTERNAL_H

#include <pthread.h>

#include "comm.h"

#ifdef USE_NCCL
#include <nccl.h>
#endif

#define OPS 1024 /* operations remembered; DDP issues at most a few hundred per 3 steps */

/* OP_ALLREDUCE_MEAN: each rank's values times 1/world, then summed (comm_allreduce_mean_async) */
typedef enum { OP_ALLREDUCE, OP_ALLREDUCE_MEAN, OP_BROADCAST, OP_SUM_F64 } OpKind;

/* Does NCCL's ncclAvg do a mean all-reduce's arithmetic (comm.h)? It multiplies each contribution
 * by 1/world rounded to the element type: fp32's 1/world for fp32, PyTorch's own factor; in 16 bits
 * a factor that is exact only for a power-of-two world — bf16(1/3) is 0.2% high, fp16(1/3) 0.02%
 * low, which would bias every averaged gradient of a 3-, 5-, 6- or 7-rank job. */
static inline int comm_avg_is_exact(int world, CommDtype t) { return t == COMM_F32 || (world & (world - 1)) == 0; }

typedef struct Op {
    OpKind kind;
    void *buf;      /* device memory (host memory on the CPU backend and for OP_SUM_F64) */
    int64_t count;
    int root;
    CommDtype type;  /* element type of an all-reduce (OP_SUM_F64: doubles) */
    double t_issue; /* host time when issued (the watchdog's clock) */
    double ms;      /* host ring: measured by the ring thread */
#ifdef USE_CUDA
    int have_events;
    cudaEvent_t ready; /* on the compute stream: the data is final */
    cudaEvent_t start, end; /* NCCL: on the communication stream around the collective */
#endif
} Op;

typedef struct CommOps CommOps;

struct Comm {
    CommKind kind;
    const CommOps *be;      /* the backend's table */
    Store *store;
    Device *dev;
    int rank, world;
    double timeout;
    char desc[96];
    Op ops[OPS];
    int64_t issued, done;   /* operations issued / known complete (in order) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;       /* host ring: the ring thread; NCCL: the watchdog */
    int have_thread, stop;
    /* host ring */
    int left, right;        /* sockets: we receive from rank−1 and send to rank+1 */
    char *scratch;          /* one received chunk */
    size_t scratch_bytes;
    void *staging;          /* GPU workers: the host copy of the buffer being reduced (pinned) */
    size_t staging_bytes;
#ifdef USE_CUDA
    cudaStream_t stream;    /* NCCL's stream, or the ring thread's copy stream */
#endif
#ifdef USE_NCCL
    ncclComm_t nccl;
    double *dscratch;       /* device doubles for comm_sum_doubles */
    double blocking_since;  /* a blocking NCCL call in progress (creation), watched by the watchdog */
    const char *blocking_what;
#endif
};

/* One backend: how it starts, issues an operation, and waits for its operations. */
struct CommOps {
    /* Connect (the store carries what the ranks must exchange, under keys "comm<seq>/…") and start
     * the backend's thread (c->thread, c->have_thread). */
    void (*create)(Comm *c, int seq);
    /* Issue an in-place all-reduce or broadcast of count elements of `type` at buf (device memory). */
    int64_t (*issue)(Comm *c, OpKind kind, void *buf, int64_t count, int root, CommDtype type);
    /* comm_wait / comm_wait_op: work issued on the compute stream from now on runs after operations
     * 0 … upto−1 (the stream runs them in order: after operation upto−1). */
    void (*wait)(Comm *c, int64_t upto);
    /* How long op (number id) ran, in ms, waiting for it to finish. */
    double (*op_ms)(Comm *c, Op *op, int64_t id);
    /* Blocking sum of n host doubles over all ranks. */
    void (*sum_doubles)(Comm *c, double *v, int n);
    /* Everything issued has finished (before a barrier or teardown). */
    void (*drain)(Comm *c);
    /* Free what create made, after the backend's thread has stopped (may be NULL). */
    void (*destroy)(Comm *c);
};
extern const CommOps comm_host_ops;
#ifdef USE_NCCL
extern const CommOps comm_nccl_ops;
#endif

/* The operation ring (comm.c). */
Op *comm_op_begin(Comm *c, OpKind kind, void *buf, int64_t count, int root, CommDtype type);
/* Bytes per element of an operation. */
static inline size_t comm_op_elem(const Op *op) {
    return op->kind == OP_SUM_F64 ? 8 : op->type == COMM_F32 ? 4 : 2;
}
int64_t comm_op_publish(Comm *c);
void comm_wait_done(Comm *c, int64_t upto);

/* A failure at run time, usually because another rank failed: "error: rank r: …", marked
 * collateral for the launcher, _exit(1). */
_Noreturn void comm_fail(const Comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
