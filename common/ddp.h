/* ddp.h — DistributedDataParallel's reducer: gradient buckets all-reduced while backward runs.
 *
 * Buckets are slices of the model's flat gradient buffer (gradient_as_bucket_view=True in PyTorch
 * terms): the gradients already sit contiguously in parameter order, and a bucket is a run of
 * parameters, so it needs no buffer of its own, no copy in and no copy out — and no second
 * gradient-sized allocation per GPU. At first the buckets follow *reverse* parameter order (the
 * order backward roughly produces gradients), each closed once it reaches --bucket-mb (PyTorch
 * 2.11 all-reduces its first step as one bucket instead: docs/semantics.md). After the
 * first synchronised step they are rebuilt once, in the order the gradients really became ready,
 * the first closed at 1 MiB so the first all-reduce starts as early as possible — only with
 * --bucket-mb left out: a cap given caps the first bucket too, as PyTorch's bucket_cap_mb does.
 * Under find_unused_parameters (never rebuilt) they are cut in forward order instead, the first
 * under the same first cap (1 MiB unless --bucket-mb is given), and the list reversed, as PyTorch's
 * constructor does — except with --last-bucket-mb (ours), which keeps the reverse-order plan: the
 * tail it cuts must be what backward reaches last, the first layers. tests/fixtures/ddp_buckets.txt
 * holds torch's buckets for every case. (A bucket is only closed where its parameters form one
 * contiguous slice, which could make it one small tensor larger than PyTorch's; in the fixture's
 * cases none is.)
 *
 * model_backward calls ddp_grad_ready(p) as soon as parameter p's gradient is final. When the last
 * gradient of a bucket arrives, its mean all-reduce is launched on the communicator's stream, after
 * an event on the compute stream — each rank's values times 1/world, then summed, by the
 * communicator (comm.h: inside NCCL's kernel where it can), not as a pass on the compute stream —
 * while backward continues with the earlier layers. Buckets launch strictly in index order, so
 * every rank issues the same collectives in the same order. ddp_backward_end makes the compute
 * stream wait for all of them before the optimizer runs. --no-overlap instead all-reduces the whole
 * gradient once, after backward: the same bytes, nothing hidden.
 *
 * no_sync (gradient accumulation, stages 4–5): ddp_set_sync(d, 0) is `with ddp_model.no_sync():`, and
 * like PyTorch's it must cover the forward as well as the backward. Under it the gradient-ready hook
 * does nothing: each backward ADDS its gradients to the flat buffer (model_backward accumulates) and
 * no bucket is reduced. The next backward with sync on reduces the buckets — views of the
 * accumulated buffer — as it produces them, overlapped with that backward, exactly as above.
 *
 * Buffers (BN running statistics) follow DDP's broadcast_buffers=True and its
 * require_forward_param_sync flag: before a forward, rank 0's buffers are broadcast if the flag is
 * set; after it, the flag becomes "this forward's backward will synchronise". So a training forward
 * after a synchronised step broadcasts, the forwards inside no_sync and the one after them do not,
 * and an evaluation (forwards without gradients) broadcasts once, if a synchronised step came
 * before it or no step at all (the flag starts set: --evaluate's one evaluation broadcasts), and
 * leaves the flag off. Parameters and buffers are broadcast once at the start.
 * The broadcast before a forward waits in the open: the compute stream can start nothing until the
 * ranks have met and the buffers arrived. --broadcast-buffers after-forward moves it (modelled on
 * PyTorch's _register_buffer_comm_hook with _BufferCommHookLocation.POST_FORWARD, whose futures are
 * awaited at the end of the next synchronising backward): a forward whose backward synchronises owes
 * the broadcast, and that backward's first gradient hook issues it, ahead of the first bucket, so it
 * runs on the communication stream while backward computes, and ddp_backward_end's wait covers it.
 * PyTorch's hook is tied to other forwards: _post_forward tests require_forward_param_sync before
 * setting it, so it fires after the forwards the default broadcasts before — under no_sync the
 * group's first, after an evaluation the evaluation's first, not the next training one — and the
 * ranks' buffers can differ again at the next forward. Ours keeps the default's values. Nothing
 * touches the buffers between that forward and the next one (backward and the optimizer do not
 * read them), so every forward and every evaluation sees the very buffers PyTorch's default gives
 * it — even under no_sync, since the forward that owes the broadcast is exactly the one after which
 * the default's flag is set — and the evaluation has nothing left to broadcast.
 *
 * --last-bucket-mb (ours, not a DDP argument; PyTorch's DDP_SET_LAST_BUCKET_CAP=1 is the nearest,
 * tests/torch/ddp_buckets_fixture.py): the last bucket's all-reduce can hide behind
 * nothing, since backward has ended when its last gradient (the first layer's) arrives. PyTorch's
 * plan leaves in it whatever the earlier buckets did not take (ResNet-18: 8 MiB). With the flag,
 * the smallest contiguous tail of the order that holds at least that many MiB becomes the last
 * bucket, and the rest is planned as before; the bucket before it then ends earlier, while there is
 * still backward left to hide it.
 *
 * A parameter that gets no gradient (the forward does not use it; --unused-param gives the model one)
 * leaves its bucket pending forever, so that bucket and every later one are never launched. As in
 * PyTorch, the reducer does not notice at the end of backward: it hears of gradients only through
 * their hooks, and PyTorch queues its end-of-backward work only once the last bucket is ready — when
 * one never is, backward simply returns and the optimizer steps on gradients that were not averaged.
 * The next training forward finds the reduction unfinished (PyTorch: "Expected to have finished
 * reduction in the prior iteration before starting a new one"): each rank stops there with one line
 * naming the parameters and the fix (the launcher stops any rank not there yet). A run whose last
 * step is that step ends without it; a warning says so. --find-unused-parameters is
 * find_unused_parameters=True, at PyTorch's price:
 * each synchronised backward first searches the graph from the output for the parameters it does not
 * reach (ours: the layer list, walked from the logits), and marks those ready, so their buckets
 * complete and their gradients — zeros — are all-reduced with the rest; after the last bucket, a map
 * of the parameters this rank used is all-reduced too (one more collective per step), and read back
 * when some parameter went unused here, to learn whether another rank used it; and the buckets are
 * never rebuilt (so, like PyTorch, we plan them once, in forward order with the first cap, as
 * above). The summary counts each of these. A parameter no rank used keeps a zero gradient here;
 * PyTorch leaves its .grad None and the optimizer skips it — the same update unless weight decay is
 * on, which shrinks ours.
 *
 * Measured per optimizer step, without synchronising the step (each micro-step's events are read
 * back three micro-steps later): all-reduce time (the communicator's time for every bucket),
 * EXPOSED communication time (how long the compute stream sat waiting for communication: from the
 * end of each synchronising backward — with --optimizer-overlap after-backward, from the end of the
 * steps that run beside the last all-reduce — until its last bucket was done, plus the forwards'
 * buffer broadcasts), bytes reduced, and algbw / busbw as nccl-tests define them: algbw = bytes / time,
 * busbw = algbw · 2(n−1)/n for an all-reduce over n ranks. Counted over the run: micro-steps,
 * optimizer steps, all-reduce calls and bytes, buffer broadcasts. */
#ifndef DDP_H
#define DDP_H

#include <stdint.h>

#include "cli.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "precision.h"
#include "sampler.h"
#include "timemark.h"
#include "trainer.h"

#define DDP_FIRST_BUCKET_BYTES (1 << 20) /* torch.distributed._DEFAULT_FIRST_BUCKET_BYTES */
#define DDP_PER_RANK_MAX 64               /* ranks listed one by one in the summary's "per rank" line */
#define DDP_STATS_LAG 3                   /* micro-steps between a micro-step and the reading of its timings */

/* The flags of a DDP job — torchrun's, init_process_group's, DistributedDataParallel's,
 * DistributedSampler's — shared by every stage that runs under DDP. */
typedef struct DdpFlags {
    int nproc_per_node, nnodes, node_rank, master_port, standalone; /* torchrun */
    const char *master_addr;
    double rdzv_timeout;
    const char *comm;                                   /* all-reduce backend */
    double comm_timeout;
    double bucket_mb;                                   /* DistributedDataParallel bucket_cap_mb */
    int bucket_mb_given;  /* as if --bucket-mb were on the command line (for callers without one, the
                           * tests): the first bucket is capped at bucket_mb too — PyTorch's 1 MiB first
                           * bucket is only for a bucket_cap_mb left out */
    double last_bucket_mb;                              /* ours: a small last bucket (0: PyTorch's plan) */
    const char *broadcast_buffers;                      /* before-forward (PyTorch's default) | after-forward */
    int no_overlap;
    const char *optimizer_overlap;                      /* off | in-backward (_register_fused_optim) | after-backward */
    int find_unused;                                    /* find_unused_parameters=True */
    int sync_bn;                                        /* nn.SyncBatchNorm (syncbn.h) */
    int sync_each_micro_step; /* stages 4–5: the experiment of forgetting no_sync (no row here) */
    int drop_last, no_shuffle;                          /* DistributedSampler */
    SamplerShow show;                                   /* --show-sampler */
} DdpFlags;

/* Set f's defaults and return the option rows for its flags (malloc'd, terminated), followed by
 * `extra` (may be NULL) — to be passed on as config_options' extra rows. */
Option *ddp_options(DdpFlags *f, const Option *extra);

typedef struct DdpBucket {
    int64_t offset, count; /* the slice of grad_flat, in floats */
    int n_params;
    int pending;           /* gradients of this bucket not ready yet in this backward */
} DdpBucket;

typedef struct DdpStep { /* one micro-step's measurements, until read back */
    int64_t step;        /* the optimizer step it belongs to */
    int64_t *ops, n_ops; /* its all-reduces' ids, in launch order (bucket b's is ops[b]); not contiguous:
                          * SyncBatchNorm's exchanges come between them */
    int64_t bytes, bcast_op;
    int synced;          /* its backward all-reduced */
    TimeMark at[5];      /* backward end, after the wait, before the broadcast, forward start, wait start */
    int pending;
} DdpStep;

typedef struct DdpGroup { /* one optimizer step's sums over its micro-steps */
    int64_t step, bytes, n_ops, bcasts;
    int micro;
    double ar, exposed, bc, fb; /* fb: the synchronised micro-step's forward + backward */
} DdpGroup;

typedef struct DdpSeries { /* per-optimizer-step values, for medians */
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
    size_t first_bytes;        /* the first bucket's cap: 1 MiB with --bucket-mb left out, else cap_bytes */
    size_t last_bytes;         /* --last-bucket-mb; 0: the last bucket is whatever is left */
    int last_cut;              /* the plan has --last-bucket-mb's tail (no tail short of the whole order
                                * may hold last_bytes: then the plan is PyTorch's) */
    size_t last_most;          /* without it: the most a tail short of the whole order holds */
    DdpBucket *buckets;
    int n_buckets;
    int *bucket_of;            /* parameter → bucket */
    int *ready_order, n_ready; /* gradient-ready order of the first synchronised backward */
    int rebuilt, next;         /* next: the next bucket to launch */
    /* PyTorch's two flags */
    int sync;                  /* require_backward_grad_sync: off inside no_sync */
    int forward_param_sync;    /* require_forward_param_sync: broadcast buffers before the next forward */
    int bcast_after;           /* --broadcast-buffers after-forward: the broadcast overlaps backward */
    int bcast_owed;            /* after-forward: this backward's first gradient hook issues it */
    int64_t iteration;         /* micro-steps (forward + backward) done by this process */
    int64_t synced;            /* of them, those whose backward all-reduced */
    int64_t group_step;        /* the optimizer step of the micro-step in flight */
    /* counted over this process's run */
    int64_t opt_steps, allreduce_calls, allreduce_bytes, bcasts, eval_bcasts;
    DdpStep steps[DDP_STATS_LAG + 1];
    DdpGroup group;            /* the optimizer step being read back */
    int64_t groups_seen;
    DdpSeries ar, exposed, bcast, ar_run, exposed_run, bcast_run; /* this epoch / whole run */
    DdpSeries fb_run;          /* forward + backward on this rank's compute stream, whole run */
    int64_t *eval_idx, eval_n; /* this rank's test-set shard */
    /* which gradients this synchronised backward has produced; find_unused_parameters */
    char *got;                 /* parameter → its gradient is marked ready */
    int n_got;
    int unfinished;            /* the last synchronised backward left parameters without a gradient */
    int find_unused;
    char *reached, *reached_p; /* the search's scratch: activations, parameters reached from the output */
    int *unused, n_unused;     /* the parameters the last search did not reach */
    float *used_pinned;        /* PyTorch's local_used_map on the host: pinned, one per micro-step in
                                * flight, since each is copied to the device asynchronously */
    float *used_dev, *used_back; /* …all-reduced on the device; read back */
    int64_t searches, used_map_calls, used_map_readbacks, unused_bytes;
    DdpSeries search_ms;       /* the search's host time, per synchronised backward after warm-up */
    int overlap_optim;         /* --optimizer-overlap: DDP_OPTIM_* */
    Optimizer *fused_optim;    /* ddp_register_fused_optim: DDP steps the optimizer, bucket by bucket */
    SideStream optim_stream;   /* in-backward: the stream the steps run on while backward goes on */
    Precision hook;            /* gradient compression: fp16/bf16_compress_hook, or PREC_FP32 (none) */
    void *compressed;          /* hook: the 16-bit copy of the gradient buffer the all-reduce carries */
} Ddp;

/* Wrap run->model: check every rank built the same model and got the same flags, broadcast
 * parameters and buffers from rank 0, plan the buckets (f->bucket_mb as PyTorch's bucket_cap_mb,
 * in MiB). Collective. */
void ddp_init(Ddp *d, Run *run, Comm *comm, const DdpFlags *f);
/* ddp_model.register_comm_hook(None, fp16_compress_hook | bf16_compress_hook) for p = PREC_FP16 |
 * PREC_BF16 (PREC_FP32: nothing, DDP's default fp32 all-reduce). Each bucket is cast to 16 bits into
 * a 16-bit copy of the gradient buffer, averaged over the ranks in 16 bits by the all-reduce (each
 * value times fp32's 1/world and rounded once, as the hook's div_ on CUDA; half the bytes), and
 * cast back into the fp32 bucket before the optimizer reads it — cast first, then divided, as the
 * hook does. Call once, after ddp_init. */
void ddp_register_comm_hook(Ddp *d, Precision p);
/* --optimizer-overlap: DDP takes the optimizer step over, bucket by bucket, each a slice of the step
 * (optim_step_slice), and the caller does NOT call optim_step (d->fused_optim says so); the same
 * bits as optim_step after ddp_backward_end. With "off" (the default) this does nothing.
 *   in-backward     ddp_model._register_fused_optim(optim), PyTorch's optimizer overlap: each bucket
 *                   is stepped as soon as its all-reduce is done, on a side stream, while backward
 *                   computes the earlier layers. The hooks then come after each layer's whole
 *                   backward (model_set_hook_after_layer): a conv's input gradient reads the weight
 *                   the step overwrites.
 *   after-backward  ours: ddp_backward_end steps the buckets in order on the compute stream, each
 *                   as soon as its own all-reduce is done — the earlier buckets' were done during
 *                   backward, so their steps run while the last bucket is still being all-reduced,
 *                   and nothing runs beside backward.
 * config_resolve refuses it, with the fix named, with --no-overlap (no buckets), with
 * --sync-each-micro-step (it would step every micro-step) and with --clip-grad-norm (a bucket steps
 * before the whole gradient's norm exists). grad_scaler must be 0: amp_check refuses
 * --optimizer-overlap under fp16's GradScaler or the gradient statistics before the workers start
 * (they must see every gradient before any step; PyTorch's overlap has no scaler either). Call once,
 * after ddp_init and ddp_register_comm_hook. */
enum { DDP_OPTIM_OFF, DDP_OPTIM_IN_BACKWARD, DDP_OPTIM_AFTER_BACKWARD };
void ddp_register_fused_optim(Ddp *d, Optimizer *opt, int grad_scaler);
void ddp_destroy(Ddp *d);
/* sync = 0: the next forward and backward run inside `ddp_model.no_sync()`; 1 (the default): they
 * synchronise. Stays set until changed. */
void ddp_set_sync(Ddp *d, int sync);
/* Before each training forward: the check that the previous reduction finished (a user error naming
 * the parameters that got no gradient), the buffer broadcast (per require_forward_param_sync), the
 * bucket rebuild after the first synchronised step, and where this rank is (for the launcher's
 * report). */
void ddp_forward_begin(Ddp *d);
/* model_backward's gradient-ready hook (ctx = the Ddp). With find_unused_parameters, its first call
 * in a synchronised backward runs the search and marks the unused parameters ready first. */
void ddp_grad_ready(void *ctx, int param);
/* After model_backward: --no-overlap's single all-reduce, find_unused_parameters' used-parameter map;
 * the compute stream waits for all of them (nothing to wait for under no_sync). A parameter without a
 * gradient is noted here and reported by the next ddp_forward_begin. */
void ddp_backward_end(Ddp *d);
/* Evaluation the DDP way: every rank evaluates its DistributedSampler shard of the n_test samples
 * (shuffle off, the padding not counted), through DDP's forward without gradients (one buffer
 * broadcast first, per require_forward_param_sync), and the sums are all-reduced: every rank gets
 * the accuracy and mean loss over the whole test set, each sample counted once. Collective. */
void ddp_evaluate(Ddp *d, InputPipe *in, int64_t n_test, StepLog *scratch, double *accuracy,
                  double *loss);
/* After run_epoch_end / before run_finish: the communication line and JSON record ("comm_epoch",
 * "comm_summary"; every --log-every optimizer steps also a "comm" record for that step), medians
 * over the optimizer steps after warm-up, averaged over ranks; ddp_finish also hands the run's
 * counts to the summary. Collective. */
void ddp_epoch_end(Ddp *d);
void ddp_finish(Ddp *d);

#endif
