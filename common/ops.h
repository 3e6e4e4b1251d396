/* ops.h — every operation the trainer runs, one function each, dispatching on the device kind.
 *
 * DEV_CPU  → the plain C reference in ops_ref.c (the "CPU backend"; also the oracle for tests).
 * DEV_CUDA → ops_cuda.c: cuDNN for convolution, cuBLAS for linear, and our own kernels
 *            (kernels.cu) for batch norm and the rest.
 *
 * Conventions (all of them PyTorch's):
 *  - tensors are float32, NCHW, contiguous; pointers are in the device's memory;
 *  - conv weight [cout][cin][k][k]; linear weight [out][in], y = x·Wᵀ + b;
 *  - parameter gradients (dw, dgamma, dbeta, dW, db) ACCUMULATE (+=), as .grad does in PyTorch,
 *    so gradient accumulation (stage 4) and DP's reduce (stage 2) need nothing special; the
 *    trainer zeroes the flat gradient buffer once per optimizer step. One exception, for speed:
 *    conv_backward_filter takes accumulate, so the first backward after zero_grad can write its
 *    weight gradients (as PyTorch's first backward assigns into a .grad that zero_grad set to None);
 *  - activation gradients (dx) overwrite when accumulate == 0 and add when accumulate == 1 (a tensor
 *    read by two layers — a residual block's input — receives the sum of both gradients);
 *  - everything is issued on the device's compute stream; no op synchronises with the host.
 */
#ifndef OPS_H
#define OPS_H

#include <stdint.h>

#include "device.h"
#include "precision.h"

/* ---- 2-D convolution, no bias (ResNet's convolutions are followed by batch norm) ---------------- */
typedef struct ConvShape {
    int cin, cout, k, stride, pad; /* square kernel */
    int h, w;                      /* input spatial size */
    int hout, wout;                /* = (h + 2·pad − k)/stride + 1, filled by conv_shape() */
} ConvShape;
void conv_shape(ConvShape *s, int cin, int cout, int k, int stride, int pad, int h, int w);

/* A Conv holds the backend's plan (cuDNN descriptors and chosen algorithms) for batch sizes seen so
 * far. conv_prepare plans for batch n (growing the device's shared workspace, unless the owner
 * provides the workspace: own_workspace, below); it is called at
 * model setup for the batch sizes the run will use, so the step itself never allocates. Calling a
 * conv op with an n that was not prepared prepares it on the spot. */
typedef struct Conv {
    ConvShape s;
    Precision prec;    /* element type of x, w, y (fp32 unless the model runs under autocast) */
    int channels_last; /* CUDA: x, y NHWC and w, dw [cout][k][k][cin] (KRSC; see below) */
    void *plan;        /* backend-private; NULL on CPU */
    /* Workspace the owner provides (the model's planned arena), [0] for the forward, [1] for both
     * backward passes, ws_cap[] bytes each; a call needing more (or with none) uses the device's
     * shared workspace. own_workspace = 1: conv_prepare does not grow the device's workspace
     * for this conv — the owner sizes ws from conv_workspace_bytes and provides it. */
    int own_workspace;
    void *ws[2];
    size_t ws_cap[2], ws_off[2]; /* ws_off: the owner's bookkeeping (offsets in its arena) */
} Conv;
void conv_prepare(Device *d, Conv *c, int n);
void conv_release(Device *d, Conv *c);
/* The workspace the algorithms chosen for batch n need: the forward's (backward = 0) or the larger
 * of backward-data's and backward-filter's (backward = 1). 0 on the CPU, or n not prepared. */
size_t conv_workspace_bytes(Device *d, Conv *c, int n, int backward);
void conv_forward(Device *d, Conv *c, int n, const float *x, const float *w, float *y);
void conv_backward_data(Device *d, Conv *c, int n, const float *dy, const float *w, float *dx,
                        int accumulate);
/* accumulate = 1: dw += the gradient; 0: dw = the gradient. cuDNN adds with beta = 1, which its
 * backward-filter kernels for ResNet's shapes do in a second pass over a workspace (an extra
 * convertTensor kernel, measured on an H200: 0.1 ms of stage 1's 4.3 ms step); beta = 0 skips it. */
void conv_backward_filter(Device *d, Conv *c, int n, const float *x, const float *dy, float *dw,
                          int accumulate);

/* A forward algorithm held by the caller rather than by the Conv: a per-thread plan cache
 * (common/plan_cache.h) keeps one per (conv, batch size). conv_forward_plan runs conv_forward with
 * a->algo. When a->algo < 0 it instead chooses the algorithm, now, with calls made by this thread
 * — cuDNN's heuristics, or with d->benchmark a real search on x, w and y (y is scribbled on; its
 * workspace is accounted) — and returns without running it (call again to run): planning and
 * running are timed apart. The CPU reference has one algorithm (0) and nothing to plan. */
typedef struct ConvFwdAlgo {
    int algo;        /* < 0: not chosen yet */
    int math;        /* cudnnMathType_t the algorithm was chosen with */
    size_t ws_bytes; /* its workspace */
} ConvFwdAlgo;
void conv_forward_plan(Device *d, Conv *c, int n, ConvFwdAlgo *a, const float *x, const float *w,
                       float *y);

/* ---- batch norm over (N, H, W) per channel, PyTorch's BatchNorm2d(eps=1e-5, momentum=0.1) -------- */
/* Training: normalise with the batch's biased variance; update running_mean/var in place with the
 * *unbiased* variance: r = (1−momentum)·r + momentum·batch_stat. save_mean/save_invstd (c floats
 * each; invstd = 1/sqrt(var_biased + eps)) are kept for backward. */
void bn_forward_train(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                      const float *beta, float *running_mean, float *running_var, float momentum,
                      float eps, float *save_mean, float *save_invstd, float *y);
void bn_forward_eval(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                     const float *beta, const float *running_mean, const float *running_var,
                     float eps, float *y);
void bn_backward(Device *d, int n, int c, int hw, const float *x, const float *dy,
                 const float *gamma, const float *save_mean, const float *save_invstd, float eps,
                 float *dx, float *dgamma, float *dbeta, int accumulate);

/* ---- elementwise ------------------------------------------------------------------------------ */
void relu_forward(Device *d, int64_t count, const float *x, float *y); /* x == y allowed */
/* dx = dy · (y > 0); y is the forward OUTPUT (so ReLU can run in place). dx == dy allowed when
 * accumulate == 0. */
void relu_backward(Device *d, int64_t count, const float *y, const float *dy, float *dx,
                   int accumulate);
void add_forward(Device *d, int64_t count, const float *a, const float *b, float *y);
/* dst = src (accumulate 0) or dst += src (accumulate 1): the backward of add, fan-out, copies. */
void grad_pass(Device *d, int64_t count, const float *src, float *dst, int accumulate);

/* ---- global average pool: [n][c][hw] → [n][c] ------------------------------------------------- */
void avgpool_forward(Device *d, int n, int c, int hw, const float *x, float *y);
void avgpool_backward(Device *d, int n, int c, int hw, const float *dy, float *dx, int accumulate);

/* ---- linear: x [n][in], W [out][in], b [out] → y [n][out] ------------------------------------- */
void linear_forward(Device *d, int n, int in, int out, const float *x, const float *W,
                    const float *b, float *y);
void linear_backward(Device *d, int n, int in, int out, const float *x, const float *W,
                     const float *dy, float *dx, float *dW, float *db, int accumulate);

/* ---- fused softmax + cross-entropy (mean reduction) and its gradient --------------------------- */
/* For n rows of `classes` logits and int32 labels: per-sample loss_i = logsumexp(z_i) − z_i[label].
 * Writes *loss = scale · Σ loss_i, dlogits = scale · (softmax(z) − onehot(label)), and
 * *correct = number of rows whose argmax (first maximum; a NaN counts as the maximum, as in
 * torch.argmax) equals the label.
 * The mean loss of a batch of B is scale = 1/B; DataParallel passes 1/(global batch).
 * loss and correct are single device values (written, not accumulated). */
void xent_forward_backward(Device *d, int n, int classes, const float *logits,
                           const int32_t *labels, float scale, float *loss, int32_t *correct,
                           float *dlogits);

/* ---- SGD, PyTorch's formula (dampening 0, nesterov off), one pass over a flat buffer ------------ */
/* g' = g + wd·p;  buf = first ? g' : momentum·buf + g';  p −= lr·buf.  (momentum 0 → p −= lr·g') */
void sgd_step(Device *d, int64_t count, float *params, const float *grads, float *momentum_buf,
              float lr, float momentum, float weight_decay, int first);

/* ---- small helpers used by the stages ---------------------------------------------------------- */
void scale_inplace(Device *d, int64_t count, float *x, float alpha); /* x *= alpha */
/* y += x (same shapes): DataParallel's reduce-add of replica gradients into GPU0's. */
void add_inplace(Device *d, int64_t count, const float *x, float *y);

/* ================================================================================================
 * Mixed precision (stage 5): the same ops on tensors of a low-precision type p (fp16 or bf16), as
 * PyTorch's CUDA autocast runs them — and, with p = fp32, the ops of every channels-last model (the
 * CUDA default: model.c's typed walk). A "p tensor" (void *) is, on CUDA, 16 bits per element
 * (__half / __nv_bfloat16; fp32: float); on the CPU backend, float elements each exactly
 * representable in p — the emulation computes every op in fp32 like the GPU and rounds where the
 * GPU stores a p value (precision.h), so values, overflow and underflow are the GPU's.
 * precision_bytes() says which.
 * Arithmetic is fp32 everywhere (cuDNN/cuBLAS compute type FLOAT, fp32 accumulators in our
 * kernels); batch-norm parameters, running and saved statistics stay fp32 (float *).
 * An accumulate into a p tensor stores round(old + new), one rounding.
 *
 * Channels-last (CUDA only, channels_last = 1): activations [n][h][w][c] and conv weights
 * [cout][k][k][cin] (cuDNN's NHWC / KRSC), the layout its tensor-core convolutions read natively,
 * as PyTorch's torch.channels_last. A channels-last model keeps its conv weights and their
 * gradients KRSC for good (model.h), so no op here reorders a weight. Only the layout changes,
 * never a value, so the CPU emulation (always NCHW) stays the reference; CPU calls must pass
 * channels_last = 0.
 * ============================================================================================== */

/* Bytes per element of a p tensor on d (2 on CUDA for fp16/bf16; 4 on the CPU; 4 for fp32). */
size_t precision_bytes(const Device *d, Precision p);
/* fp32 → p (round to nearest even): autocast's casts of weights and of the input batch. */
void cast_to(Device *d, Precision p, int64_t count, const float *src, void *dst);
/* p → fp32 (exact): the logits' cast for the loss, DDP's 16-bit all-reduced gradients back. */
void cast_from(Device *d, Precision p, int64_t count, const void *src, float *dst);
/* dst += (float)src where src ≠ 0, then src = 0: the backward of a weight cast — autocast's weight
 * gradients added into the fp32 .grad (autograd's cast backward + AccumulateGrad), several
 * layers at a time (model.c batches them), leaving the p buffer zero for the next batch — so the
 * places no layer wrote (batch norm's parameters, fp32 already, between two convolutions) are left
 * bit for bit as they were, wherever a batch ends. */
void cast_add_clear(Device *d, Precision p, int64_t count, void *src, float *dst);
/* Channels-last cast (CUDA): the input batch fp32 [n][c][hw] → p [n][hw][c]. Conv weights need
 * none: a channels-last model stores them KRSC already (model.h), so cast_to serves them. */
void cast_to_nhwc(Device *d, Precision p, int n, int c, int hw, const float *src, void *dst);

/* c->prec must be p (conv_prepare planned that type). dw is OVERWRITTEN: the p gradient of the
 * cast weight, which the caller adds into the fp32 gradient with cast_add_clear. */
void conv_forward_lp(Device *d, Conv *c, Precision p, int n, const void *x, const void *w, void *y);
void conv_backward_data_lp(Device *d, Conv *c, Precision p, int n, const void *dy, const void *w,
                           void *dx, int accumulate);
void conv_backward_filter_lp(Device *d, Conv *c, Precision p, int n, const void *x, const void *dy,
                             void *dw);
/* Batch norm on p input and output with fp32 gamma/beta/statistics: the statistics are computed
 * in fp32 from the p values; dgamma/dbeta accumulate into the fp32 gradients. relu = 1 fuses the
 * ReLU that follows: y = max(0, bn(x)), and backward masks dy by y > 0 (y: that fused output; it
 * may be NULL when relu = 0). Call bn_prepare for every shape first (CUDA's scratch). */
void bn_prepare(Device *d, int channels_last, int n, int c, int hw);
void bn_forward_train_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                         const void *x, const float *gamma, const float *beta,
                         float *running_mean, float *running_var, float momentum, float eps,
                         float *save_mean, float *save_invstd, void *y, int relu);
void bn_forward_eval_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                        const void *x, const float *gamma, const float *beta,
                        const float *running_mean, const float *running_var, float eps, void *y);
void bn_backward_lp(Device *d, Precision p, int channels_last, int n, int c, int hw, const void *x,
                    const void *y, const void *dy, const float *gamma, const float *save_mean,
                    const float *save_invstd, float eps, void *dx, float *dgamma, float *dbeta,
                    int accumulate, int relu);
/* ---- SyncBatchNorm (syncbn.h): batch norm whose training statistics span every rank's batch -------
 * Each pass splits where the per-channel sums are complete: forward, every rank's (count, mean, M2)
 * of its own batch; backward, its (count, Σ g, Σ g·x̂), g the incoming gradient (ReLU-masked when
 * fused). A rank writes its c triples into its slot of buf, zeroes the others, and sum() adds buf
 * over the ranks — the zeros make that sum an exact all-gather — and returns once work issued next on
 * the compute stream will see the result. Every rank then merges the slots in rank order (Chan's
 * formula forward, plain sums backward), so all ranks get the same bits on any backend. What
 * follows is batch norm with those global statistics: normalise by them, running statistics from
 * the unbiased variance over the global count, dx from the global means of g and g·x̂. dgamma and
 * dbeta stay this rank's own sums, as PyTorch's SyncBatchNorm leaves them (DDP averages them). */
typedef struct BnSync {
    void (*sum)(void *ctx, float *buf, int64_t count); /* in-place SUM over the ranks */
    void *ctx;
    int rank, world;
    float *buf; /* the device's floats: world · 3 · (the most channels of any layer) */
} BnSync;
/* bn_forward_train_lp / bn_backward_lp across the ranks of s (s NULL: this rank's batch alone, exactly
 * those two — the model calls these either way). Every rank calls them with n·hw > 1
 * (PyTorch needs only the total above 1; the stages' equal shards always give each rank a batch). */
void bn_forward_train_sync(Device *d, Precision p, int channels_last, int n, int c, int hw,
                           const void *x, const float *gamma, const float *beta,
                           float *running_mean, float *running_var, float momentum, float eps,
                           float *save_mean, float *save_invstd, void *y, int relu, const BnSync *s);
void bn_backward_sync(Device *d, Precision p, int channels_last, int n, int c, int hw, const void *x,
                      const void *y, const void *dy, const float *gamma, const float *save_mean,
                      const float *save_invstd, float eps, void *dx, float *dgamma, float *dbeta,
                      int accumulate, int relu, const BnSync *s);
void relu_forward_lp(Device *d, Precision p, int64_t count, const void *x, void *y);
void relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                      void *dx, int accumulate);
void add_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b, void *y);
void grad_pass_lp(Device *d, Precision p, int64_t count, const void *src, void *dst,
                  int accumulate);
/* add_forward_lp then an in-place ReLU, as one op; backward: dy masked by y > 0 (y: this op's
 * output) into da and db, each written or added (acc_a, acc_b). da may be dy itself. */
void add_relu_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b, void *y);
void add_relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                          void *da, int acc_a, void *db, int acc_b);
void avgpool_forward_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                        const void *x, void *y);
void avgpool_backward_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                         const void *dy, void *dx, int accumulate);
/* x, W, b in p; y = round(x·Wᵀ + b), one rounding. dW and db are OVERWRITTEN (p gradients of the
 * cast weight and bias, see conv_backward_filter_lp); dx may be NULL. */
void linear_forward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                       const void *W, const void *b, void *y);
void linear_backward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                        const void *W, const void *dy, void *dx, void *dW, void *db,
                        int accumulate);

/* ---- GradScaler's device side (amp.h). Its scalars live in device memory, so no step waits ----- */
/* x *= *alpha, alpha a device scalar: scaler.scale(loss).backward() scales the loss gradient. */
void scale_by_device(Device *d, int64_t count, float *x, const float *alpha);
/* PyTorch's _amp_foreach_non_finite_check_and_unscale_: grads *= *inv_scale, and *found_inf = 1
 * if any grad (as it was, scaled) is inf or NaN — or, unlike torch, if *inv_scale itself is inf
 * (a scale backed off below 1/FLT_MAX), which torch lets through as a NaN step; *found_inf is
 * left as it was otherwise. */
void amp_unscale_check(Device *d, int64_t count, float *grads, const float *inv_scale,
                       float *found_inf);
/* PyTorch's _amp_update_scale_: found_inf → scale = (float)(scale·backoff), tracker = 0 (and
 * ++*skipped); else ++tracker, and at growth_interval scale = (float)(scale·growth) if that is
 * finite, tracker = 0. Then inv_scale = (float)(1 / (double)scale) (unscale_'s reciprocal in
 * double) and found_inf = 0 for the next step. */
void amp_update_scale(Device *d, float *scale, float *inv_scale, int32_t *growth_tracker,
                      float *found_inf, int64_t *skipped, double growth_factor,
                      double backoff_factor, int growth_interval);
/* sgd_step, except that nothing at all is written when *skip != 0 (a device flag): the step a
 * GradScaler skips, decided on the device like PyTorch's fused optimizers' found_inf. */
void sgd_step_unless(Device *d, int64_t count, float *params, const float *grads,
                     float *momentum_buf, float lr, float momentum, float weight_decay, int first,
                     const float *skip);
/* counts[0] += number of x == 0, counts[1] += number of non-finite x (device int64 counters). */
void count_zero_nonfinite(Device *d, int64_t count, const float *x, int64_t *counts);

/* ---- gradient clipping (clip.h) --------------------------------------------------------------- */
/* Blocks of the norm's first pass on a GPU, and so the doubles of its partial sums: a fixed number
 * (enough threads to fill an H200's 132 SMs), so that the sum is taken in the same order on every run
 * and every GPU. */
#define CLIP_PARTS 1024
/* torch.nn.utils.clip_grad_norm_'s arithmetic, on the device: *norm = ‖g‖₂ (squares summed in double
 * in a fixed order: partials is CLIP_PARTS doubles of scratch on a GPU, unused on the CPU), *coef =
 * min(1, max_norm · 1/(*norm + 1e-6)) in fp32 as torch computes it (a NaN norm gives a NaN coef), and
 * *clipped += 1 when *coef < 1 and the norm is finite. Multiplying g by *coef (scale_by_device) is the
 * clipping itself. */
void clip_norm_coef(Device *d, int64_t count, const float *g, double *partials, float max_norm,
                    float *norm, float *coef, int64_t *clipped);

#endif
