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
 *
 * model_backward calls on_grad_ready(ctx, p) as soon as parameter p's gradient is final — PyTorch's
 * autograd hook. Stage 1 passes NULL; DDP's gradient buckets hang off it. The model itself never
 * knows about communication. */
#ifndef MODEL_H
#define MODEL_H

#include <stdint.h>

#include "device.h"
#include "ops.h"

typedef enum { LAYER_CONV, LAYER_BN, LAYER_RELU, LAYER_ADD, LAYER_POOL, LAYER_LINEAR } LayerKind;

typedef struct Param {
    char name[48];  /* PyTorch state_dict name, e.g. "layer2.0.shortcut.1.weight" */
    int64_t offset; /* into the flat buffer (floats) */
    int64_t count;
    int ndim, shape[4];
} Param;

typedef struct Activation {
    int c, h, w;   /* per sample */
    float *x;      /* max_batch × c × h × w (activation 0 points at the caller's input) */
    float *dx;     /* its gradient; NULL for the input */
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
    uint64_t shape_hash;     /* fingerprint of names and shapes (checkpoints refuse a mismatch) */
} Model;

typedef void (*GradReadyFn)(void *ctx, int param_index);

/* Build the layer list and allocate every buffer for batches up to max_batch on dev (accounted).
 * arch: "resnet18" | "tiny"; norm_bn: 1 = bn, 0 = none. Parameters are initialised from `seed`
 * with PyTorch's default initialisers (kaiming-uniform(a=√5) for conv/linear weights — i.e.
 * U(±1/√fan_in) — U(±1/√fan_in) for biases, γ=1, β=0, running mean 0, running var 1). */
Model *model_create(Device *dev, const char *arch, int norm_bn, int max_batch, uint64_t seed);
void model_destroy(Model *m);
/* Plan convolutions for batch size n (cuDNN algorithm choice, workspace) ahead of the step. */
void model_prepare(Model *m, int n);

/* Forward n samples from x (device memory, [n][3][32][32]). train = 1: batch-norm uses batch
 * statistics and updates running stats; 0: running stats (evaluation). Logits: model_logits(m). */
void model_forward(Model *m, int n, const float *x, int train);
float *model_logits(Model *m);  /* [n][classes] */
float *model_dlogits(Model *m); /* the loss writes d(loss)/d(logits) here before backward */
/* Backward from model_dlogits; parameter gradients ACCUMULATE into grad_flat. */
void model_backward(Model *m, int n, GradReadyFn on_grad_ready, void *ctx);
void model_zero_grad(Model *m);

/* Parameter count and a one-line description ("resnet18 (bn): 11,173,962 parameters"). */
const char *model_describe(const Model *m, char *buf, int len);

#endif
