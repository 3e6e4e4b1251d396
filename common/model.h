/* model.h — ResNet-18 (CIFAR layout) and a tiny ResNet, as an ordered list of layers over flat buffers.
 *
 * A model is a list of layers in forward order. Each layer reads one or two activations and writes
 * one (ReLU writes in place, as PyTorch's resnet does). Backward walks the list in reverse; where an
 * activation is read by two layers (a residual block's input), the first gradient written
 * overwrites and the second accumulates — decided once, when the model is built.
 *
 * Parameters live in ONE flat buffer, their gradients in another, batch-norm running statistics
 * ("buffers") in a third, each parameter a view at an offset, in PyTorch's state_dict order. That
 * is what makes the later stages simple: one copy replicates a model (stage 2), one call
 * all-reduces all gradients and buckets are slices (stage 3), one kernel updates every parameter.
 * A channels-last model (CUDA) stores each conv weight, and so its gradient, as [cout][kh][kw][cin]
 * (cuDNN's KRSC) instead of PyTorch's [cout][cin][kh][kw] (OIHW), as model.to(memory_format=
 * torch.channels_last) does: cuDNN reads and writes them as they are, nothing is reordered per
 * step. Only the order inside a conv weight changes, so everything elementwise over the flat
 * buffers (optimizers, weight decay, DDP, GradScaler, zero_grad) never sees it; whatever reads or
 * writes a parameter by index from outside the model (initialisation, checkpoints, tests) goes
 * through the one seam below, "The public order".
 *
 * model_backward calls on_grad_ready(ctx, p) as soon as parameter p's gradient is final — PyTorch's
 * autograd hook. Stage 1 passes NULL; DDP's gradient buckets hang off it. The model itself never
 * knows about communication.
 *
 * Mixed precision (stage 5, model_create_mixed with fp16 or bf16) is PyTorch's CUDA autocast built
 * in: parameters, their gradients and the BN buffers stay fp32 (master weights); each forward casts
 * the parameters once to the low type (autocast's weight cache) and the input batch too; conv and
 * linear run in the low type, batch norm takes and gives the low type with fp32 statistics, ReLU,
 * add and pooling keep their input's type; every activation and activation gradient is stored in
 * the low type (16 bits on CUDA). The logits are cast to fp32 for the loss (cross-entropy is on
 * autocast's fp32 list), so model_logits / model_dlogits stay fp32. A weight's gradient comes out
 * in the low type and is added into the fp32 gradient — autograd's backward of the cast. */
#ifndef MODEL_H
#define MODEL_H

#include <stdint.h>

#include "device.h"
#include "graph.h"
#include "ops.h"
#include "precision.h"

typedef enum { LAYER_CONV, LAYER_BN, LAYER_RELU, LAYER_ADD, LAYER_POOL, LAYER_LINEAR } LayerKind;

typedef struct Param {
    char name[48];  /* PyTorch state_dict name, e.g. "layer2.0.shortcut.1.weight" */
    int64_t offset; /* into the flat buffer (floats) */
    int64_t count;
    int ndim, shape[4]; /* PyTorch's shape (OIHW for a conv weight, whatever the storage order) */
} Param;

typedef struct Activation {
    int c, h, w;   /* per sample */
    void *x;       /* max_batch × c × h × w of the model's activation type (fp32, or the autocast
                    * type); activation 0 is the input: the caller's batch, or its cast copy */
    void *dx;      /* its gradient; NULL for the input */
    /* The memory plan (see "Activation memory" below): each of x and dx is a view into the
     * model's one arena, valid from step `born` to step `dies` (inclusive) of the training step's
     * timeline; outside that window its bytes belong to other tensors. */
    int x_born, x_dies, dx_born, dx_dies;
    size_t x_off, dx_off, bytes; /* offsets into the arena; bytes of each (rounded up to 512) */
    int dx_alias;  /* > 0: dx IS that activation's dx — an add's first operand, whose gradient is
                    * the add's output gradient passed on unchanged (no copy, as in autograd) */
} Activation;

typedef struct Layer {
    LayerKind kind;
    char name[40];
    int in, in2, out;        /* activation indices (in2: ADD's second operand) */
    int acc_in, acc_in2;     /* backward: accumulate into d(in) / d(in2) rather than overwrite */
    int p0, p1;              /* parameter indices (conv: weight; bn: weight, bias; linear: W, b) */
    int b0;                  /* BN: buffer index of running_mean (running_var is b0 + 1) */
    Conv conv;               /* CONV */
    int fin, fout;           /* LINEAR */
    float *save_mean, *save_invstd; /* BN: batch statistics kept for backward */
    int fuse_relu;           /* BN, ADD: the in-place ReLU after it runs inside its kernels (CUDA) */
    int fused;               /* RELU: done by the BN before it; skipped */
} Layer;

typedef struct Model {
    Device *dev;
    char arch[16];           /* "resnet18" | "tiny" */
    int norm_bn;             /* 1: batch norm after every conv; 0: --norm none */
    int classes, max_batch;
    Layer *layers;
    int n_layers;
    Param *params, *buffers;
    int n_params, n_buffers;
    Activation *acts;
    int n_acts;
    int64_t n_param_floats, n_buffer_floats;
    float *param_flat, *grad_flat, *buffer_flat;
    int grad_fresh;          /* 1 from model_zero_grad to the end of the next backward, which
                              * writes fp32 conv weight gradients rather than adding them to zeros */
    uint64_t shape_hash;     /* fingerprint of names and shapes (checkpoints refuse a mismatch) */
    /* autocast (prec fp16 / bf16) or channels-last; all NULL for an fp32 NCHW model */
    Precision prec;          /* activation and conv/linear compute type */
    int channels_last;       /* CUDA: activations NHWC; conv weights and their gradients stored
                              * KRSC in param_flat / grad_flat (ops.h, and "The public order") */
    void *param_lp;          /* autocast only: param_flat cast to prec, once per forward (the
                              * weight cast cache); NULL in fp32, where cuDNN reads param_flat */
    void *wgrad_lp;          /* autocast only: weight (+ bias) gradients in prec, before they are
                              * added into grad_flat — a window of wgrad_cap floats of it (model.c) */
    int64_t wgrad_cap, wgrad_lo, wgrad_hi; /* the window's size; [lo, hi): written, not yet added */
    void *input_lp;          /* the input batch cast to prec (and NHWC when channels-last) */
    float *logits32, *dlogits32; /* the fp32 logits the loss reads, and their gradient */
    /* activation memory plan (model_create; see below) */
    int memory_plan;         /* 1: planned lifetimes; 0: all kept all step (MODEL_MEMORY_PLAN=0) */
    int plan_poison;         /* tests, CPU: NaN into each tensor as it dies (MODEL_PLAN_POISON=1) */
    int plan_workspaces;     /* 1 (CUDA, planned): each conv's cuDNN workspace is in the arena */
    int plan_steps;          /* the timeline's length: 2·n_layers + 1 */
    void *arena;             /* every x and dx of activations 1.. (one device_alloc) */
    size_t arena_bytes;      /* its size: the planned activation memory */
    size_t live_peak_bytes;  /* most bytes live at one step: no placement can do better */
    size_t unplanned_bytes;  /* every activation and gradient kept all step (the old way) */
    size_t alloc_bytes;      /* everything the model holds on its device (accounted, rounded) */
    int prepared[16], n_prepared; /* batch sizes model_prepare has planned */
    /* Forward passes of a batch size model_prepare never planned, and the last such size. On CUDA
     * each new size plans its convolutions inside the step (a cuDNN search under
     * --cudnn-benchmark) and that step's time holds it; the run's summary reports the count. */
    int64_t unprepared_forwards;
    int unprepared_last;
    int unused_params;       /* --unused-param: the last this many parameters (fc_unused) belong to no layer */
    GraphCache graphs;       /* CUDA graphs of the training forward and backward stretches (graph.h) */
    unsigned char *hook_stop; /* model_set_hook_stops; NULL: stop at every parameter */
    int hook_after_layer;     /* model_set_hook_after_layer */
    BnSync bn_sync;           /* model_set_bn_sync (SyncBatchNorm); .sum NULL: plain batch norm */
} Model;

/* GraphKey.part of the forward, and of a backward run without a hook (one stretch); with a hook,
 * backward stretch k is part k. */
#define GRAPH_FORWARD (-1)
#define GRAPH_BACKWARD (-2)

/* Activation memory, planned as autograd frees: one training step is a timeline of 2·L + 1 steps
 * for L layers — forward of layer i at step i, the loss at step L, backward of layer i at step
 * 2L − i. An activation x lives from the forward that writes it to its last reader: forward
 * readers, and the backward passes that really read it (conv, batch norm and linear read their
 * input; ReLU reads its output; add and pooling read none) — so the output of a residual branch's
 * last batch norm, read only by the add, dies right there. A gradient dx lives from the first
 * backward that writes it to the backward of the layer that produced x; an add's first operand's
 * gradient is the add's output gradient itself (dx_alias). Offsets are assigned greedily, largest
 * tensor first, each at the lowest offset not overlapping a tensor whose lifetime overlaps its
 * own; the arena is one device_alloc. On CUDA, model_prepare adds each convolution's cuDNN
 * workspace (alive only at that convolution's forward step, and at its backward step) and lays
 * the arena out again. The logits and their gradient live all step (the loss reads them between
 * forward and backward) in allocations of their own, so pointers taken to them stay valid.
 * The plan is on by default; with MODEL_MEMORY_PLAN=0 in the environment every tensor lives the
 * whole step (nothing shared: the reference the plan is tested against). */

typedef void (*GradReadyFn)(void *ctx, int param_index);

/* --unused-param (stages 3–5, ddp_options), the DDP pitfall: when set, model_create also registers a
 * second classifier head, fc_unused (weight [classes][features], bias [classes]), after every other
 * parameter — in the parameter table and the flat buffers, so DDP's buckets hold it — but in no layer:
 * the forward never computes it and backward never produces its gradient, like an nn.Linear that
 * __init__ creates and forward never calls. The other parameters keep their initial values. */
extern int model_unused_param;

/* Build the layer list and allocate every buffer for batches up to max_batch on dev (accounted).
 * arch: "resnet18" | "tiny"; norm_bn: 1 = bn, 0 = none. Parameters are initialised from `seed`
 * with PyTorch's default initialisers (kaiming-uniform(a=√5) for conv/linear weights — i.e.
 * U(±1/√fan_in) — U(±1/√fan_in) for biases, γ=1, β=0, running mean 0, running var 1). */
Model *model_create(Device *dev, const char *arch, int norm_bn, int max_batch, uint64_t seed);
/* The same under autocast to prec. channels_last: 1 keeps the activations in NHWC on CUDA
 * (torch.channels_last; the CPU backend keeps NCHW, where the layout changes nothing computed),
 * 0 NCHW, −1 the process default (model_default_layout). model_create uses PREC_FP32 and −1. */
Model *model_create_mixed(Device *dev, const char *arch, int norm_bn, int max_batch, uint64_t seed,
                          Precision prec, int channels_last);
/* The layout models take when not told (--layout): like torch.backends flags, process-wide.
 * Channels-last by default: cuDNN's tensor-core kernels are NHWC, and an NCHW model pays a layout
 * transform around every convolution (docs/results.md measures it). */
void model_default_layout(int channels_last);
/* Refuses an explicit channels-last model (stage 5's --channels-last) under --layout nchw. */
void model_check_layout(void);
/* What --layout chose: 1 nhwc, 0 nchw, −1 auto. */
int model_layout_chosen(void);
/* Whether models created from now on replay their training steps as CUDA graphs (graph.h):
 * on by default; --no-cuda-graph, and stage 2 (whose replicas run op by op under the GIL), turn it
 * off. Evaluation, --trace windows and the CPU backend always run eagerly. */
void model_default_graphs(int on);
void model_destroy(Model *m);
/* Plan convolutions for batch size n (cuDNN algorithm choice, workspace) ahead of the step. Call it
 * at setup for every batch size the run will see — a short last batch included: a forward of a size
 * never prepared still runs, but plans on the spot and is counted (unprepared_forwards). */
void model_prepare(Model *m, int n);
/* Count a forward of batch n if n was never prepared. model_forward does; a caller that walks the
 * layers itself (DataParallel's replica threads) calls it once per forward. */
void model_count_forward(Model *m, int n);

/* Forward n samples from x (device memory, [n][3][32][32]). train = 1: batch-norm uses batch
 * statistics and updates running stats; 0: running stats (evaluation). Logits: model_logits(m). */
void model_forward(Model *m, int n, const float *x, int train);
float *model_logits(Model *m);  /* [n][classes] */
float *model_dlogits(Model *m); /* the loss writes d(loss)/d(logits) here before backward */
/* Backward from model_dlogits; parameter gradients ACCUMULATE into grad_flat (the first backward
 * after model_zero_grad writes the fp32 conv weight gradients instead: the same values, faster). */
void model_backward(Model *m, int n, GradReadyFn on_grad_ready, void *ctx);
/* Where a backward with a hook stops for it. With CUDA graphs every stop ends one graph and begins
 * the next (graph.h), so fewer stops mean fewer launches. stop == NULL (the default): after every
 * layer with parameters, as autograd fires hooks. Otherwise backward stops only after a layer
 * that produces a marked parameter (stop[p] != 0, n_params entries, copied) and there runs the hook
 * of every parameter made ready since the last stop, in order — DDP marks the last parameter of
 * each bucket, the only ones at which it launches anything. */
void model_set_hook_stops(Model *m, const unsigned char *stop);
/* on = 1: report a layer's parameters only once the layer's whole backward is issued — a conv's
 * input gradient too, which reads the weight — instead of as soon as they are final. Whoever
 * updates a parameter in the hook (DDP's --optimizer-overlap in-backward) needs that; an all-reduce, which
 * only reads the gradient, does not, and starts earlier without it (0, the default). */
void model_set_hook_after_layer(Model *m, int on);
/* nn.SyncBatchNorm.convert_sync_batchnorm (syncbn.h does it for a job): from now on every training
 * forward and backward of a batch-norm layer takes its statistics over the ranks of s (ops.h; the
 * exchange buffer is allocated here, s->buf ignored). Evaluation is unchanged (running statistics).
 * Turns CUDA graphs off: each exchange is a host call between two kernels. */
void model_set_bn_sync(Model *m, const BnSync *s);
/* The ready point at which backward reports parameter p: 0 for the first layer backward reaches
 * that has parameters, 1 for the next, …; −1 if no layer produces p (fc_unused). */
int model_hook_point(const Model *m, int p);
/* The classifier head's floats (weight + bias): what --unused-param's second head adds. */
int64_t model_head_floats(const Model *m);
/* The shape fingerprint this model would have with --unused-param's head (its own if it has one), so
 * that --evaluate can take a checkpoint trained with it into a model without: the head is last. */
uint64_t model_shape_hash_with_head(const Model *m);
void model_zero_grad(Model *m);

/* ---- The public order: the one seam between the model's storage and everyone else ------------
 * Outside the model, parameters are in PyTorch's order (a conv weight OIHW): checkpoints, the CPU
 * reference, the torch fixtures, tests. A channels-last model stores conv weights KRSC (see the
 * top of this file). These convert any array laid out like param_flat — parameters, gradients, the
 * optimizer's momentum: n_param_floats floats — between the two; for a model that is not
 * channels-last (every CPU model) they are plain copies. */

/* Host arrays: the model's storage order → PyTorch's, and back. src == dst is allowed. */
void model_params_to_oihw(const Model *m, const float *src, float *dst);
void model_params_from_oihw(const Model *m, const float *src, float *dst);
/* Device buffers laid out like param_flat (m->param_flat, m->grad_flat, a momentum buffer on m's
 * device): read one into host memory in PyTorch's order, or write one from it. Both wait for the
 * copy to finish. */
void model_read_oihw(Model *m, const float *flat, float *host);
void model_write_oihw(Model *m, const float *host, float *flat);
/* One conv weight on the host, kk = kh·kw: OIHW [cout][cin][kk] ↔ KRSC [cout][kk][cin]; the
 * element (o, i, r) sits at (o·cin + i)·kk + r in OIHW and at (o·kk + r)·cin + i in KRSC. src and
 * dst must not overlap. */
void conv_weight_oihw_to_krsc(int cout, int cin, int kk, const float *src, float *dst);
void conv_weight_krsc_to_oihw(int cout, int cin, int kk, const float *src, float *dst);

/* A one-line description: parameters, layers, type and the planned activation memory
 * ("resnet18 (norm bn): 11,173,962 parameters, 67 layers, activations 286.9 MiB planned"). */
const char *model_describe(const Model *m, char *buf, int len);

/* Floating-point operations of one training step (forward + backward) on n samples; *forward (may
 * be NULL) gets the forward's share. Convention (PyTorch's torch.utils.flop_counter): 2 FLOPs per
 * multiply-add, counted for convolutions and the linear layer only — the tensor-core work. A conv's
 * forward is 2·n·cout·hout·wout·cin·k·k; its backward is that twice (data gradient + filter
 * gradient), except the first conv, whose input (the batch) needs no gradient; linear likewise with
 * 2·n·in·out. Batch norm, ReLU, add, pooling, the bias, the loss and the optimizer are elementwise
 * (well under 1% of ResNet-18's total) and not counted. ResNet-18 (CIFAR): 1.11 GFLOP forward
 * (0.56 G multiply-adds) and 3.33 GFLOP per training image (tests/test_flops.c). */
int64_t model_flops(const Model *m, int n, int64_t *forward);

#endif
