/* syncbn.c — SyncBatchNorm's exchange over the job's communicator (see syncbn.h). */
#include "syncbn.h"

#include <stdio.h>

#include "report.h"
#include "trace.h"

/* The all-gather: an in-place SUM all-reduce (each rank's slot holds its values, every other slot
 * zeros), and the compute stream waits for it — on the host ring, the caller. */
static int64_t exchanges, exchange_bytes; /* this process's, for DDP's counts (syncbn_counts) */

static void exchange(void *ctx, float *buf, int64_t count) {
    Comm *c = ctx;
    exchanges++, exchange_bytes += count * (int64_t)sizeof(float);
    TraceSpan span = trace_begin("syncbn exchange", "comm", count);
    comm_wait_op(c, comm_allreduce_async(c, buf, count));
    trace_end(span);
}

void syncbn_counts(int64_t *calls, int64_t *bytes) { *calls = exchanges, *bytes = exchange_bytes; }

void sync_batchnorm_convert(Model *m, Comm *comm, int rank, int world) {
    if (!m->norm_bn || world < 2) { /* PyTorch: convert finds no layer / forward falls back to batch_norm */
        if (rank == 0)
            printf("note: --sync-bn changes nothing here: %s\n",
                   !m->norm_bn ? "the model has no batch norm (--norm none)"
                               : "one rank has no one to synchronise with (as PyTorch's SyncBatchNorm)");
        return;
    }
    model_set_bn_sync(m, &(BnSync){.sum = exchange, .ctx = comm, .rank = rank, .world = world});
    if (rank != 0) return;
    int layers = 0;
    double bytes = 0; /* per training step: each layer's exchange forward and backward */
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].kind == LAYER_BN)
            layers++, bytes += 2.0 * world * 3 * m->acts[m->layers[l].in].c * sizeof(float);
    char b[32];
    printf("syncbn: SyncBatchNorm over %d ranks: %d layers, each exchanging its per-channel statistics in forward "
           "(count, mean, M2) and its gradient sums in backward (count, Σg, Σg·x̂) — %d small all-reduces (%s) per "
           "micro-step, each on the compute's critical path%s\n",
           world, layers, 2 * layers, fmt_bytes(b, sizeof b, bytes),
           m->dev->kind == DEV_CUDA ? "; CUDA graphs off" : "");
}
