/* ddp.h — DistributedDataParallel's reducer: gradient buckets all-reduced while backward runs.
 *
 * Buckets are slices of the model's flat gradient buffer (gradient_as_bucket_view=True in PyTorch
 * terms): the gradients already sit contiguously in parameter order, and a bucket is a run of
 * parameters, so it needs no buffer of its own, no copy in and no copy out — and no second
 * gradient-sized allocation per GPU. At first the buckets follow *reverse* parameter order (the
 * order backward roughly produces gradients), each closed once it reaches --bucket-mb. After the
 * first step they are rebuilt once, in the order the gradients really became ready, the first
 * closed at 1 MiB so the first all-reduce starts as early as possible. (A bucket is only closed
 * where its parameters form one contiguous slice, which can make it one small tensor larger than
 * PyTorch's.)
 *
 * model_backward calls ddp_grad_ready(p) as soon as parameter p's gradient is final. When the last
 * gradient of a bucket arrives, the whole bucket is divided by the world size (so the SUM all-reduce
 * gives the mean) and its all-reduce is launched on the communicator's stream, after an event on the
 * compute stream — while backward continues with the earlier layers. Buckets launch strictly in
 * index order, so every rank issues the same collectives in the same order. ddp_backward_end makes
 * the compute stream wait for all of them before the optimizer runs. --no-overlap instead
 * all-reduces the whole gradient once, after backward: the same bytes, nothing hidden.
 *
 * Every forward first broadcasts the buffers (BN running statistics) from rank 0, as DDP does by
 * default (broadcast_buffers=True); parameters and buffers are broadcast once at the start.
 *
 * Measured per step, without synchronising the step (read back three steps later): all-reduce time
 * (the communicator's time for every bucket), EXPOSED communication time (how long the compute
 * stream sat waiting for communication: from the end of backward until the last bucket was done,
 * plus the forward's buffer broadcast), bytes reduced, and algbw / busbw as nccl-tests define them:
 * algbw = bytes / time, busbw = algbw · 2(n−1)/n for an all-reduce over n ranks. */
#ifndef DDP_H
#define DDP_H

#include <stdint.h>

#include "comm.h"
#include "model.h"
#include "trainer.h"

#define DDP_FIRST_BUCKET_BYTES (1 << 20) /* torch.distributed._DEFAULT_FIRST_BUCKET_BYTES */
#define DDP_STATS_LAG 3                   /* steps between a step and the reading of its timings */

typedef struct DdpBucket {
    int64_t offset, count; /* the slice of grad_flat, in floats */
    int n_params;
    int pending;           /* gradients of this bucket not ready yet in this backward */
} DdpBucket;

typedef struct DdpStep { /* one step's measurements, until read back */
    int64_t step;
    int64_t first_op, n_ops, bytes, bcast_op;
    double t[4];         /* CPU backend: backward end, after the wait, before/after the broadcast */
#ifdef USE_CUDA
    cudaEvent_t ev[4];   /* the same four points as CUDA events on the compute stream */
#endif
    int pending;
} DdpStep;

typedef struct DdpSeries { /* per-step values, for medians */
    double *v;
    int n, cap;
} DdpSeries;

typedef struct Ddp {
    Run *run;
    Model *m;
    Comm *comm;
    Device *dev;
    int rank, world, overlap;
    size_t cap_bytes;          /* --bucket-mb */
    DdpBucket *buckets;
    int n_buckets;
    int *bucket_of;            /* parameter → bucket */
    int *ready_order, n_ready; /* gradient-ready order of the first backward */
    int rebuilt, next;         /* next: the next bucket to launch */
    int64_t iteration;         /* steps done by this process */
    DdpStep steps[DDP_STATS_LAG + 1];
    DdpSeries ar, exposed, bcast, ar_run, exposed_run, bcast_run; /* this epoch / whole run */
} Ddp;

/* Wrap run->model: check every rank built the same model, broadcast parameters and buffers from
 * rank 0, plan the buckets. Collective. bucket_mb as PyTorch's bucket_cap_mb (MiB). */
void ddp_init(Ddp *d, Run *run, Comm *comm, double bucket_mb, int overlap);
void ddp_destroy(Ddp *d);
/* Before each training forward: broadcast the buffers from rank 0; the bucket rebuild after step 1. */
void ddp_forward_begin(Ddp *d);
/* model_backward's gradient-ready hook (ctx = the Ddp). */
void ddp_grad_ready(void *ctx, int param);
/* After model_backward: --no-overlap's single all-reduce; the compute stream waits for all buckets. */
void ddp_backward_end(Ddp *d);
/* Before evaluation: rank 0's buffers everywhere (DDP's first forward in eval mode does this). */
void ddp_sync_buffers(Ddp *d);
/* After run_epoch_end / before run_finish: the communication line and JSON record ("comm_epoch",
 * "comm_summary"; every --log-every steps also a "comm" record for that step), medians over the
 * steps after warm-up, averaged over ranks. Collective. */
void ddp_epoch_end(Ddp *d);
void ddp_finish(Ddp *d);

#endif
