/* comm_nccl.c — the NCCL backend: one communicator per job (its unique id travels from rank 0
 * through the store) on its own high-priority CUDA stream, one GPU per rank.
 *
 * A watchdog thread polls ncclCommGetAsyncError and the age of the oldest unfinished operation; an
 * error or a timeout aborts the communicator and exits, never a silent hang. comm_wait makes the
 * compute stream — not the host — wait for the communication stream. Built only with NCCL. */
#ifdef USE_NCCL
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"
#include "errors.h"
#include "kernels.h" /* launch_scale_lp */
#include "trace.h"
#include "worker_status.h" /* launch_mark_collateral */

static const char *nccl_why(ncclResult_t r) {
    static __thread char buf[512];
    const char *last = ncclGetLastError(NULL);
    snprintf(buf, sizeof buf, "%s%s%s", ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
    return buf;
}
static const char *nccl_hint(ncclResult_t r) {
    switch (r) {
    case ncclInvalidUsage:
        return "every NCCL rank needs its own GPU: use one worker per GPU, or --comm host to share GPUs";
    case ncclSystemError:
    case ncclRemoteError:
        return "a peer failed, or the network / NVLink is unusable; NCCL_DEBUG=WARN says more";
    default:
        return "NCCL_DEBUG=WARN ./stage3 … says more";
    }
}
#define CHECK_NCCL(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) die_at(__FILE__, __LINE__, #call, nccl_why(r_), nccl_hint(r_));     \
    } while (0)

static const char *op_name(OpKind k) {
    return k == OP_ALLREDUCE        ? "all-reduce"
           : k == OP_ALLREDUCE_MEAN ? "mean all-reduce"
           : k == OP_BROADCAST      ? "broadcast"
                                    : "sum of doubles";
}

#define NCCL_SUM_SCRATCH 512 /* doubles in c->dscratch, comm_sum_doubles' device copy */

_Noreturn static void watchdog_fail(Comm *c, const char *what) {
    launch_quiet_if_output_gone(); /* NCCL's kernels end with the process */
    fflush(stdout);
    fprintf(stderr, "error: rank %d: %s; aborting the NCCL communicator\n", c->rank, what);
    fflush(stderr);
    launch_mark_collateral();
    if (c->nccl) ncclCommAbort(c->nccl); /* unblocks every kernel and call of this communicator */
    _exit(1);
}

/* The watchdog: every 20 ms, NCCL's asynchronous error, then the oldest unfinished operation's age.
 * NCCL reports a dead peer as an asynchronous error (or not at all: the kernel just waits), so
 * without this a failure elsewhere would hang this rank forever. */
static void *nccl_watchdog(void *arg) {
    Comm *c = arg;
    device_bind(c->dev);
    char msg[1024];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        int64_t issued = c->issued, done = c->done;
        ncclComm_t nc = c->nccl;
        const char *blocking = c->blocking_what;
        double since = c->blocking_since;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        if (nc) {
            ncclResult_t ae = ncclSuccess;
            if (ncclCommGetAsyncError(nc, &ae) == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) {
                snprintf(msg, sizeof msg, "NCCL reported an asynchronous error: %s", nccl_why(ae));
                watchdog_fail(c, msg);
            }
        }
        while (done < issued) {
            cudaError_t e = cudaEventQuery(c->ops[done % OPS].end);
            if (e == cudaErrorNotReady) break;
            if (e == cudaErrorCudartUnloading) return NULL; /* the process is exiting (its own error) */
            if (e != cudaSuccess) {
                snprintf(msg, sizeof msg, "CUDA error on the communication stream: %s", cudaGetErrorString(e));
                watchdog_fail(c, msg);
            }
            done++;
        }
        pthread_mutex_lock(&c->mu);
        c->done = done;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        double now = time_now();
        if (done < issued && now - c->ops[done % OPS].t_issue > c->timeout) {
            Op *op = &c->ops[done % OPS];
            snprintf(msg, sizeof msg, "NCCL %s #%lld of %lld floats has not completed %.0f s after it was "
                     "issued — another rank is hung or failed (see its error), or --comm-timeout is too short",
                     op_name(op->kind), (long long)done, (long long)op->count, now - op->t_issue);
            watchdog_fail(c, msg);
        }
        if (blocking && now - since > c->timeout) {
            snprintf(msg, sizeof msg, "%s has not returned after %.0f s — another rank did not get there",
                     blocking, now - since);
            watchdog_fail(c, msg);
        }
        usleep(20000);
    }
    return NULL;
}

/* A blocking NCCL call in progress (NULL: none), for the watchdog to bound: creation waits for every
 * rank, and an enqueue can wait too — NCCL connects to the peers lazily, inside the first call of
 * each kind, so a peer that is alive but stuck would hold it forever, with nothing yet in flight. */
static void nccl_blocking(Comm *c, const char *what) {
    pthread_mutex_lock(&c->mu);
    c->blocking_what = what;
    if (what) c->blocking_since = time_now();
    pthread_mutex_unlock(&c->mu);
}

static void nccl_create(Comm *c, int seq) {
    if (c->dev->kind != DEV_CUDA) die_user("--comm nccl needs GPU workers; CPU workers use --comm host");
    /* NVLink SHARP (multicast) buys nothing for DDP's all-reduce over a few GPUs, and on shared
     * hosts it can leave GPUs unusable: off unless the user asks for it (set before any thread). */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    xthread_create(&c->thread, nccl_watchdog, c);
    c->have_thread = 1;
    int v = 0;
    ncclGetVersion(&v);
    snprintf(c->desc, sizeof c->desc, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    device_bind(c->dev);
    int lo, hi;
    CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    /* High priority: when a bucket is ready, its all-reduce gets SMs as soon as backward's kernels
     * free some, instead of queueing behind them. */
    CHECK_CUDA(cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, hi));
    c->dscratch = device_alloc(c->dev, NCCL_SUM_SCRATCH * sizeof(double), "nccl scratch");
    ncclUniqueId id;
    char key[64];
    snprintf(key, sizeof key, "comm%d/nccl_id", seq);
    if (c->rank == 0) {
        CHECK_NCCL(ncclGetUniqueId(&id));
        store_set(c->store, key, &id, sizeof id);
    } else if (store_get(c->store, key, &id, sizeof id) != sizeof id) {
        die_at(__FILE__, __LINE__, "store_get", "NCCL unique id of the wrong size", key);
    }
    /* Creation blocks until every rank has joined; the watchdog bounds it. */
    nccl_blocking(c, "ncclCommInitRank");
    ncclComm_t nc;
    CHECK_NCCL(ncclCommInitRank(&nc, c->world, id, c->rank));
    pthread_mutex_lock(&c->mu);
    c->nccl = nc;
    pthread_mutex_unlock(&c->mu);
    nccl_blocking(c, NULL);
}

static int64_t nccl_issue(Comm *c, OpKind kind, void *buf, int64_t count, int root, CommDtype type) {
    Op *op = comm_op_begin(c, kind, buf, count, root, type);
    ncclDataType_t nt = type == COMM_F16 ? ncclHalf : type == COMM_BF16 ? ncclBfloat16 : ncclFloat;
    Device *d = c->dev;
    /* The comm stream waits for the compute stream (the bucket is final); the host does not. */
    CHECK_CUDA(cudaEventRecord(op->ready, d->stream));
    CHECK_CUDA(cudaStreamWaitEvent(c->stream, op->ready, 0));
    CHECK_CUDA(cudaEventRecord(op->start, c->stream));
    TraceDev span = trace_dev_begin(d, TRACE_COMM, c->stream, kind == OP_BROADCAST ? "broadcast" : "all-reduce",
                                    "comm", count);
    /* A mean: each contribution times 1/world, then the sum. ncclAvg does the multiply as it reads,
     * where its factor is exact; otherwise (16 bits, world not a power of two) a pass of our own on
     * this stream multiplies in fp32, as PyTorch's hook's div_ does, and the all-reduce sums. One
     * rank: the mean is the buffer itself (NCCL's one-rank ncclAvg would still run a kernel). */
    ncclRedOp_t red = ncclSum;
    if (kind == OP_ALLREDUCE_MEAN && c->world > 1) {
        if (comm_avg_is_exact(c->world, type)) red = ncclAvg;
        else launch_scale_lp(c->stream, (int)type, count, buf, 1.0f / (float)c->world);
    }
    nccl_blocking(c, kind != OP_BROADCAST ? "ncclAllReduce (enqueue)" : "ncclBroadcast (enqueue)");
    if (kind != OP_BROADCAST)
        CHECK_NCCL(ncclAllReduce(buf, buf, (size_t)count, nt, red, c->nccl, c->stream));
    else
        CHECK_NCCL(ncclBroadcast(buf, buf, (size_t)count, ncclFloat, root, c->nccl, c->stream));
    nccl_blocking(c, NULL);
    trace_dev_end(span);
    CHECK_CUDA(cudaEventRecord(op->end, c->stream));
    return comm_op_publish(c);
}

static void nccl_wait(Comm *c, int64_t upto) {
    /* The comm stream runs its operations in order: waiting for the last one waits for all. */
    CHECK_CUDA(cudaStreamWaitEvent(c->dev->stream, c->ops[(upto - 1) % OPS].end, 0));
}

static double nccl_op_ms(Comm *c, Op *op, int64_t id) {
    float ms = 0;
    CHECK_CUDA(cudaEventSynchronize(op->end));
    CHECK_CUDA(cudaEventElapsedTime(&ms, op->start, op->end));
    return ms;
}

/* One piece of nccl_sum_doubles, through the device scratch. */
static void nccl_sum_piece(Comm *c, double *v, int n) {
    ASSERT(n <= NCCL_SUM_SCRATCH);
    Op *op = comm_op_begin(c, OP_SUM_F64, v, n, 0, COMM_F32);
    size_t bytes = (size_t)n * sizeof(double);
    CHECK_CUDA(cudaEventRecord(op->start, c->stream));
    CHECK_CUDA(cudaMemcpyAsync(c->dscratch, v, bytes, cudaMemcpyHostToDevice, c->stream));
    nccl_blocking(c, "ncclAllReduce (enqueue)");
    CHECK_NCCL(ncclAllReduce(c->dscratch, c->dscratch, (size_t)n, ncclDouble, ncclSum, c->nccl, c->stream));
    nccl_blocking(c, NULL);
    CHECK_CUDA(cudaEventRecord(op->end, c->stream));
    comm_op_publish(c); /* published before we block below, so the watchdog bounds the wait */
    CHECK_CUDA(cudaMemcpyAsync(v, c->dscratch, bytes, cudaMemcpyDeviceToHost, c->stream));
    CHECK_CUDA(cudaStreamSynchronize(c->stream));
}

/* In pieces of the scratch's size: a vector may be longer (one value per rank, up to STORE_MAX_WORLD). */
static void nccl_sum_doubles(Comm *c, double *v, int n) {
    for (int at = 0; at < n; at += NCCL_SUM_SCRATCH)
        nccl_sum_piece(c, v + at, n - at < NCCL_SUM_SCRATCH ? n - at : NCCL_SUM_SCRATCH);
}

static void nccl_drain(Comm *c) { CHECK_CUDA(cudaStreamSynchronize(c->stream)); }

static void nccl_destroy(Comm *c) {
    if (c->nccl) CHECK_NCCL(ncclCommDestroy(c->nccl));
    if (c->dscratch) device_free(c->dev, c->dscratch);
}

const CommOps comm_nccl_ops = {
    .create = nccl_create,
    .issue = nccl_issue,
    .wait = nccl_wait,
    .op_ms = nccl_op_ms,
    .sum_doubles = nccl_sum_doubles,
    .drain = nccl_drain,
    .destroy = nccl_destroy,
};
#endif
