/* model.c — building ResNets as a layer list, PyTorch-default initialisation, forward, backward,
 * and the same forward and backward under autocast (mixed precision, see model.h). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h" /* fnv1a64 */
#include "data.h"
#include "rng.h"
#include "trace.h"

#define MAX_LAYERS 128
#define MAX_PARAMS 128
#define MAX_ACTS 96

static const float BN_MOMENTUM = 0.1f, BN_EPS = 1e-5f; /* nn.BatchNorm2d defaults */

int model_unused_param = 0;

/* ---- building -------------------------------------------------------------------------------- */

typedef struct Builder {
    Model *m;
    int64_t pfloats, bfloats;
} Builder;

static int add_act(Builder *b, int c, int h, int w) {
    Model *m = b->m;
    ASSERT(m->n_acts < MAX_ACTS);
    m->acts[m->n_acts] = (Activation){.c = c, .h = h, .w = w};
    return m->n_acts++;
}

static int add_param(Builder *b, Param *table, int *n, int64_t *floats, const char *prefix,
                     const char *suffix, int ndim, const int *shape) {
    ASSERT(*n < MAX_PARAMS);
    Param *p = &table[*n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s%s%s", prefix, prefix[0] ? "." : "", suffix);
    p->ndim = ndim;
    p->count = 1;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i], p->count *= shape[i];
    p->offset = *floats;
    *floats += p->count;
    return (*n)++;
}

static Layer *add_layer(Builder *b, LayerKind kind, const char *name, int in, int out) {
    Model *m = b->m;
    ASSERT(m->n_layers < MAX_LAYERS);
    Layer *l = &m->layers[m->n_layers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->in = in, l->in2 = -1, l->out = out, l->p0 = l->p1 = l->b0 = -1;
    return l;
}

static int conv(Builder *b, int in, int cout, int k, int stride, int pad, const char *name) {
    Activation *a = &b->m->acts[in];
    ConvShape s;
    conv_shape(&s, a->c, cout, k, stride, pad, a->h, a->w);
    int out = add_act(b, cout, s.hout, s.wout);
    Layer *l = add_layer(b, LAYER_CONV, name, in, out);
    l->conv.s = s;
    l->conv.prec = b->m->prec; /* cuDNN plans the convolution for the activation type */
    l->conv.channels_last = b->m->channels_last;
    int shape[4] = {cout, s.cin, k, k};
    l->p0 = add_param(b, b->m->params, &b->m->n_params, &b->pfloats, name, "weight", 4, shape);
    return out;
}

/* Batch norm (or nothing, for --norm none), then an in-place ReLU when asked. */
static int bn_relu(Builder *b, int in, const char *name, int relu) {
    Model *m = b->m;
    int out = in;
    if (m->norm_bn) {
        Activation *a = &m->acts[in];
        out = add_act(b, a->c, a->h, a->w);
        Layer *l = add_layer(b, LAYER_BN, name, in, out);
        int shape[1] = {a->c};
        l->p0 = add_param(b, m->params, &m->n_params, &b->pfloats, name, "weight", 1, shape);
        l->p1 = add_param(b, m->params, &m->n_params, &b->pfloats, name, "bias", 1, shape);
        l->b0 = add_param(b, m->buffers, &m->n_buffers, &b->bfloats, name, "running_mean", 1, shape);
        add_param(b, m->buffers, &m->n_buffers, &b->bfloats, name, "running_var", 1, shape);
    }
    if (relu) add_layer(b, LAYER_RELU, "relu", out, out);
    return out;
}

/* torchvision-style BasicBlock (as in the common CIFAR ResNet): two 3×3 convs and a shortcut that
 * is a 1×1 strided conv + BN when the shape changes, the identity otherwise. */
static int basic_block(Builder *b, int in, int cout, int stride, const char *prefix) {
    char n[40];
    int cin = b->m->acts[in].c;
    snprintf(n, sizeof n, "%s.conv1", prefix);
    int x = conv(b, in, cout, 3, stride, 1, n);
    snprintf(n, sizeof n, "%s.bn1", prefix);
    x = bn_relu(b, x, n, 1);
    snprintf(n, sizeof n, "%s.conv2", prefix);
    x = conv(b, x, cout, 3, 1, 1, n);
    snprintf(n, sizeof n, "%s.bn2", prefix);
    x = bn_relu(b, x, n, 0);
    int sc = in;
    if (stride != 1 || cin != cout) {
        snprintf(n, sizeof n, "%s.shortcut.0", prefix);
        sc = conv(b, in, cout, 1, stride, 0, n);
        snprintf(n, sizeof n, "%s.shortcut.1", prefix);
        sc = bn_relu(b, sc, n, 0);
    }
    Activation *a = &b->m->acts[x];
    int out = add_act(b, a->c, a->h, a->w);
    Layer *l = add_layer(b, LAYER_ADD, "add", x, out);
    l->in2 = sc;
    add_layer(b, LAYER_RELU, "relu", out, out);
    return out;
}

static void build(Builder *b, const char *arch) {
    Model *m = b->m;
    int resnet18 = !strcmp(arch, "resnet18");
    int widths18[4] = {64, 128, 256, 512}, widthsT[2] = {16, 32};
    int *widths = resnet18 ? widths18 : widthsT;
    int stages = resnet18 ? 4 : 2, blocks = resnet18 ? 2 : 1;

    int x = add_act(b, IMG_C, IMG_H, IMG_W); /* activation 0: the input batch */
    x = conv(b, x, widths[0], 3, 1, 1, "conv1"); /* CIFAR stem: 3×3, stride 1, no max-pool */
    x = bn_relu(b, x, "bn1", 1);
    for (int s = 0; s < stages; s++) {
        /* tiny (16-32-64, one block per stage): every stage halves the resolution and doubles
         * the width, so it is cheap enough for the CPU backend */
        int cout = resnet18 ? widths[s] : widths[s] * 2;
        for (int k = 0; k < blocks; k++) {
            char prefix[24];
            snprintf(prefix, sizeof prefix, "layer%d.%d", s + 1, k);
            int stride = (k == 0 && (s > 0 || !resnet18)) ? 2 : 1;
            x = basic_block(b, x, cout, stride, prefix);
        }
    }
    Activation *a = &m->acts[x];
    int pooled = add_act(b, a->c, 1, 1);
    add_layer(b, LAYER_POOL, "avgpool", x, pooled);
    int logits = add_act(b, m->classes, 1, 1);
    Layer *l = add_layer(b, LAYER_LINEAR, "linear", pooled, logits);
    l->fin = a->c, l->fout = m->classes;
    int wshape[2] = {m->classes, a->c}, bshape[1] = {m->classes};
    l->p0 = add_param(b, m->params, &m->n_params, &b->pfloats, "linear", "weight", 2, wshape);
    l->p1 = add_param(b, m->params, &m->n_params, &b->pfloats, "linear", "bias", 1, bshape);
    if (model_unused_param) { /* a second head, registered last, that no layer reads (model.h) */
        add_param(b, m->params, &m->n_params, &b->pfloats, "fc_unused", "weight", 2, wshape);
        add_param(b, m->params, &m->n_params, &b->pfloats, "fc_unused", "bias", 1, bshape);
        m->unused_params = 2;
    }
}

/* Which backward writes overwrite and which accumulate: walking the layers in reverse (the order
 * backward runs), the first gradient to reach an activation overwrites, later ones add. In-place
 * ReLU rewrites its own gradient in place, so it neither starts nor ends a sum. */
static void plan_gradient_accumulation(Model *m) {
    char written[MAX_ACTS] = {0};
    for (int i = m->n_layers - 1; i >= 0; i--) {
        Layer *l = &m->layers[i];
        if (l->kind == LAYER_RELU) continue;
        l->acc_in = written[l->in];
        written[l->in] = 1;
        if (l->in2 >= 0) {
            l->acc_in2 = written[l->in2];
            written[l->in2] = 1;
        }
    }
}

/* device_alloc, counted in m->alloc_bytes: what the model holds, for the plan's report and test */
static void *model_alloc(Model *m, size_t bytes, const char *what) {
    m->alloc_bytes += device_alloc_size(bytes);
    return device_alloc(m->dev, bytes, what);
}

/* ---- the activation memory plan (model.h: "Activation memory") ------------------------------- */

#define PLAN_ALIGN 512 /* every tensor starts on a 512-byte boundary, like an allocator's block */
#define ALIGNED(b) (((b) + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN)

typedef struct PlanBuf {
    size_t bytes, off;
    int born, dies;
} PlanBuf;

static int overlaps_in_time(const PlanBuf *a, const PlanBuf *b) {
    return a->born <= b->dies && b->born <= a->dies;
}

/* Lifetimes from the layer list: see model.h. fwd(i) = i, the loss = L, bwd(i) = 2L − i. */
static void plan_lifetimes(Model *m) {
    const int L = m->n_layers, last = m->n_acts - 1, T = 2 * L + 1;
    m->plan_steps = T;
    for (int a = 1; a < m->n_acts; a++) {
        Activation *A = &m->acts[a];
        A->x_born = A->dx_born = T, A->x_dies = A->dx_dies = -1;
    }
#define BORN(v, t) ((v) = (t) < (v) ? (t) : (v))
#define USED(v, t) ((v) = (t) > (v) ? (t) : (v))
    for (int i = 0; i < L; i++) {
        const Layer *l = &m->layers[i];
        const int fwd = i, bwd = 2 * L - i;
        Activation *in = &m->acts[l->in], *out = &m->acts[l->out];
        /* forward: writes out, reads in (and in2) */
        BORN(out->x_born, fwd), USED(out->x_dies, fwd);
        if (l->in > 0) USED(in->x_dies, fwd);
        if (l->in2 > 0) USED(m->acts[l->in2].x_dies, fwd);
        /* backward: what each op's backward reads of the forward (ops.h) */
        switch (l->kind) {
        case LAYER_CONV: case LAYER_BN: case LAYER_LINEAR:
            if (l->in > 0) USED(in->x_dies, bwd);
            if (l->fuse_relu) USED(out->x_dies, bwd); /* the fused ReLU's mask: its output */
            break;
        case LAYER_ADD: if (l->fuse_relu) USED(out->x_dies, bwd); break;
        case LAYER_RELU: USED(out->x_dies, bwd); break; /* dx = dy·(y > 0): its output */
        case LAYER_POOL: break;                         /* shapes only */
        }
        /* backward: reads d(out) (its last reader is out's producer, the earliest layer), writes
         * d(in) and d(in2) (its first writer is in's last forward reader, the latest layer) */
        USED(out->dx_dies, bwd), BORN(out->dx_born, bwd);
        if (l->in > 0) BORN(in->dx_born, bwd), USED(in->dx_dies, bwd);
        if (l->in2 > 0) BORN(m->acts[l->in2].dx_born, bwd), USED(m->acts[l->in2].dx_dies, bwd);
    }
#undef BORN
#undef USED
    /* An add's backward hands its output gradient to its inputs unchanged. Where it overwrites
     * d(in), d(in) can simply BE d(out), which is dead after the add: one buffer, no copy. */
    for (int i = 0; i < L && m->memory_plan; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind == LAYER_ADD && !l->acc_in && l->in > 0) m->acts[l->in].dx_alias = l->out;
    }
    for (int a = 1; a < m->n_acts; a++) {
        Activation *A = &m->acts[a];
        if (a == last || !m->memory_plan) { /* the logits: read around the loss; or no plan */
            A->x_born = A->dx_born = 0;
            A->x_dies = A->dx_dies = T - 1;
        }
        ASSERT(A->x_born <= A->x_dies && A->dx_born <= A->dx_dies);
    }
}

/* Greedy placement, largest first (ties: earlier birth, then list order): each buffer goes at the
 * lowest offset where it overlaps no already placed buffer that is alive at the same time. */
static size_t plan_offsets(PlanBuf *b, int n) {
    int *order = xmalloc((size_t)n * sizeof *order), *near = xmalloc((size_t)n * sizeof *near);
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) { /* insertion sort: n is a few hundred at most */
        int k = order[i], j = i - 1;
        while (j >= 0 && (b[order[j]].bytes < b[k].bytes ||
                          (b[order[j]].bytes == b[k].bytes && b[order[j]].born > b[k].born)))
            order[j + 1] = order[j], j--;
        order[j + 1] = k;
    }
    size_t top = 0;
    for (int i = 0; i < n; i++) {
        PlanBuf *p = &b[order[i]];
        int nn = 0; /* placed buffers alive with p, sorted by offset */
        for (int j = 0; j < i; j++) {
            int q = order[j], k = nn++;
            if (!overlaps_in_time(p, &b[q])) { nn--; continue; }
            while (k > 0 && b[near[k - 1]].off > b[q].off) near[k] = near[k - 1], k--;
            near[k] = q;
        }
        size_t off = 0;
        for (int k = 0; k < nn; k++) {
            const PlanBuf *q = &b[near[k]];
            if (off + p->bytes <= q->off) break; /* fits in the gap below q */
            if (q->off + q->bytes > off) off = q->off + q->bytes;
        }
        p->off = off;
        if (off + p->bytes > top) top = off + p->bytes;
    }
    free(order), free(near);
    return top;
}

/* Lifetimes, then offsets, for every x and dx of activations 1.. and — on CUDA, once
 * model_prepare has sized them — each convolution's cuDNN workspace, one for its forward step and
 * one for its backward step: a workspace lives one step, so it fits in whatever is free then. */
static void plan_memory(Model *m, size_t esz) {
    plan_lifetimes(m);
    const int last = m->n_acts - 1, na = 2 * (last - 1), L = m->n_layers;
    PlanBuf *b = xcalloc((size_t)(na + 2 * L), sizeof *b);
    m->unplanned_bytes = 0;
    for (int a = 1; a < last; a++) {
        Activation *A = &m->acts[a];
        size_t bytes = (size_t)m->max_batch * A->c * A->h * A->w * esz;
        A->bytes = ALIGNED(bytes);
        b[2 * (a - 1)] = (PlanBuf){.bytes = A->bytes, .born = A->x_born, .dies = A->x_dies};
        b[2 * (a - 1) + 1] = (PlanBuf){.bytes = A->bytes, .born = A->dx_born, .dies = A->dx_dies};
        m->unplanned_bytes += 2 * A->bytes;
    }
    for (int a = 1; a < last; a++) { /* an aliased dx takes no bytes; its target lives on for it */
        int t = m->acts[a].dx_alias;
        if (!t) continue;
        ASSERT(t < last && !m->acts[t].dx_alias && m->acts[t].bytes == m->acts[a].bytes);
        PlanBuf *own = &b[2 * (a - 1) + 1], *to = &b[2 * (t - 1) + 1];
        if (own->dies > to->dies) to->dies = own->dies;
        own->bytes = 0;
    }
    int n = na, slot[MAX_LAYERS][2]; /* slot[l][k]: the buffer of layer l's workspace k, or -1 */
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 2; k++) {
            size_t cap = m->layers[l].kind == LAYER_CONV ? m->layers[l].conv.ws_cap[k] : 0;
            slot[l][k] = cap ? n : -1;
            if (!cap) continue;
            int t = k ? 2 * L - l : l; /* the conv's forward step, or its backward step */
            b[n++] = (PlanBuf){.bytes = ALIGNED(cap), .born = t, .dies = t};
        }
    m->arena_bytes = plan_offsets(b, n);
    m->live_peak_bytes = 0;
    for (int t = 0; t < m->plan_steps; t++) {
        size_t live = 0;
        for (int i = 0; i < n; i++) live += b[i].born <= t && t <= b[i].dies ? b[i].bytes : 0;
        if (live > m->live_peak_bytes) m->live_peak_bytes = live;
    }
    for (int a = 1; a < last; a++)
        m->acts[a].x_off = b[2 * (a - 1)].off, m->acts[a].dx_off = b[2 * (a - 1) + 1].off;
    for (int a = 1; a < last; a++)
        if (m->acts[a].dx_alias) m->acts[a].dx_off = m->acts[m->acts[a].dx_alias].dx_off;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 2; k++)
            m->layers[l].conv.ws_off[k] = slot[l][k] >= 0 ? b[slot[l][k]].off : 0;
    free(b);
}

/* (Re)allocate the arena for the current plan and point every tensor and workspace into it. Only
 * at setup (model_create, model_prepare): nothing in the arena outlives a training step. */
static void place_arena(Model *m) {
    if (m->arena) {
        device_sync(m->dev);
        m->alloc_bytes -= device_alloc_size(m->arena_bytes);
        device_free(m->dev, m->arena);
    }
    plan_memory(m, precision_bytes(m->dev, m->prec));
    m->arena = model_alloc(m, m->arena_bytes, "activations and their gradients (planned arena)");
    for (int i = 1; i < m->n_acts - 1; i++) { /* 0 is the caller's input; the logits are apart */
        Activation *a = &m->acts[i];
        a->x = (char *)m->arena + a->x_off;
        a->dx = (char *)m->arena + a->dx_off;
    }
    for (int l = 0; l < m->n_layers; l++) {
        Conv *c = &m->layers[l].conv;
        if (m->layers[l].kind != LAYER_CONV) continue;
        for (int k = 0; k < 2; k++)
            c->ws[k] = c->ws_cap[k] ? (char *)m->arena + c->ws_off[k] : NULL;
    }
}

/* PyTorch's defaults: Conv2d/Linear reset_parameters use kaiming_uniform_(a=√5), whose bound works
 * out to 1/√fan_in; Linear's bias is U(±1/√fan_in); BatchNorm: weight 1, bias 0, running mean 0,
 * running var 1. Drawn with mt19937(seed) in parameter order, so runs are reproducible. */
static void init_params(Model *m, uint64_t seed) {
    float *hp = xmalloc((size_t)m->n_param_floats * sizeof(float));
    float *hb = xmalloc((size_t)(m->n_buffer_floats ? m->n_buffer_floats : 1) * sizeof(float));
    Mt19937 g;
    mt_seed(&g, seed);
    for (int l = 0; l < m->n_layers; l++) {
        Layer *L = &m->layers[l];
        if (L->kind == LAYER_CONV || L->kind == LAYER_LINEAR) {
            Param *w = &m->params[L->p0];
            int64_t fan_in = w->count / w->shape[0];
            double bound = 1.0 / sqrt((double)fan_in);
            for (int64_t i = 0; i < w->count; i++)
                hp[w->offset + i] = (float)((2.0 * mt_uniform(&g) - 1.0) * bound);
            if (L->p1 >= 0) {
                Param *bias = &m->params[L->p1];
                for (int64_t i = 0; i < bias->count; i++)
                    hp[bias->offset + i] = (float)((2.0 * mt_uniform(&g) - 1.0) * bound);
            }
        } else if (L->kind == LAYER_BN) {
            Param *gm = &m->params[L->p0], *bt = &m->params[L->p1];
            Param *rm = &m->buffers[L->b0], *rv = &m->buffers[L->b0 + 1];
            for (int64_t i = 0; i < gm->count; i++) {
                hp[gm->offset + i] = 1.0f, hp[bt->offset + i] = 0.0f;
                hb[rm->offset + i] = 0.0f, hb[rv->offset + i] = 1.0f;
            }
        }
    }
    /* fc_unused (--unused-param): nn.Linear's defaults too, drawn after everything else */
    for (int p = m->n_params - m->unused_params; p < m->n_params; p++) {
        const Param *q = &m->params[p];
        double bound = 1.0 / sqrt((double)m->params[m->n_params - m->unused_params].shape[1]); /* fan_in */
        for (int64_t i = 0; i < q->count; i++) hp[q->offset + i] = (float)((2.0 * mt_uniform(&g) - 1.0) * bound);
    }
    /* drawn in PyTorch's order, so a channels-last model starts from the very same weights */
    model_params_from_oihw(m, hp, hp);
    device_copy_h2d(m->dev, m->param_flat, hp, (size_t)m->n_param_floats * sizeof(float));
    if (m->n_buffer_floats)
        device_copy_h2d(m->dev, m->buffer_flat, hb, (size_t)m->n_buffer_floats * sizeof(float));
    device_sync(m->dev);
    free(hp);
    free(hb);
}

/* The typed walk (activations in m->prec, NHWC when channels-last; weight copies under autocast)
 * serves autocast and channels-last models; only an fp32 NCHW model takes the plain one. */
static int typed(const Model *m) { return m->prec != PREC_FP32 || m->channels_last; }

static int default_channels_last = -1; /* −1: not chosen (--layout auto): channels-last */
static int default_graphs = 1;          /* --no-cuda-graph, stage 2: 0 */
void model_default_graphs(int on) { default_graphs = on; }
void model_default_layout(int channels_last) { default_channels_last = channels_last; }
int model_layout_chosen(void) { return default_channels_last; }

Model *model_create(Device *dev, const char *arch, int norm_bn, int max_batch, uint64_t seed) {
    return model_create_mixed(dev, arch, norm_bn, max_batch, seed, PREC_FP32, -1);
}

/* A BN or an add followed by an in-place ReLU on its output becomes one op (CUDA's typed walk):
 * the ReLU's forward pass over the activation and its backward pass over the gradient disappear. */
static void fuse_relus(Model *m) {
    for (int l = 0; l + 1 < m->n_layers; l++) {
        Layer *op = &m->layers[l], *r = &m->layers[l + 1];
        if ((op->kind == LAYER_BN || op->kind == LAYER_ADD) && r->kind == LAYER_RELU &&
            r->in == op->out && r->out == op->out)
            op->fuse_relu = r->fused = 1;
    }
}

void model_check_layout(void) {
    if (default_channels_last == 0)
        die_user("--channels-last and --layout nchw contradict each other: give one of them (channels-last, "
                 "--layout nhwc, is the default)");
}

/* The shape fingerprint (checkpoints refuse a mismatch): each parameter's name, then its shape as
 * four ints (unused dimensions 0), in state_dict order. */
static uint64_t shape_hash_add(uint64_t h, const char *name, const int shape[4]) {
    h = fnv1a64(h, name, strlen(name));
    return fnv1a64(h, shape, 4 * sizeof(int));
}

Model *model_create_mixed(Device *dev, const char *arch, int norm_bn, int max_batch, uint64_t seed,
                          Precision prec, int channels_last) {
    if (strcmp(arch, "resnet18") && strcmp(arch, "tiny"))
        die_user("unknown model '%s' (choose resnet18 or tiny)", arch);
    Model *m = xcalloc(1, sizeof *m);
    m->dev = dev;
    m->prec = prec;
    if (channels_last > 0) model_check_layout();
    if (channels_last < 0) channels_last = default_channels_last != 0;
    m->channels_last = channels_last && dev->kind == DEV_CUDA;
    graph_init(&m->graphs, dev, default_graphs);
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    m->norm_bn = norm_bn;
    m->classes = NUM_CLASSES;
    m->max_batch = max_batch;
    m->layers = xcalloc(MAX_LAYERS, sizeof *m->layers);
    m->params = xcalloc(MAX_PARAMS, sizeof *m->params);
    m->buffers = xcalloc(MAX_PARAMS, sizeof *m->buffers);
    m->acts = xcalloc(MAX_ACTS, sizeof *m->acts);
    Builder b = {.m = m};
    build(&b, arch);
    /* cuDNN's tensor descriptors and our batch norm index an activation with 32-bit integers, so
     * the largest activation must hold fewer than 2^31 elements: a ceiling on the batch (32767 for
     * ResNet-18, whose stem output is 64×32×32 an image). Refused here, before any allocation. */
    int64_t per_image = 0;
    for (int i = 0; i < m->n_acts; i++) {
        const int64_t elems = (int64_t)m->acts[i].c * m->acts[i].h * m->acts[i].w;
        if (elems > per_image) per_image = elems;
    }
    if (per_image > 0 && (int64_t)max_batch * per_image > INT32_MAX)
        die_user("--batch-size %d is too large for %s: its largest activation would hold %lld elements, more than "
                 "the 2^31 - 1 that cuDNN's descriptors and the kernels index — use --batch-size %lld or less per "
                 "device (for a larger effective batch: more devices, or stage 4's --accum-steps)",
                 max_batch, arch, (long long)max_batch * per_image, (long long)(INT32_MAX / per_image));
    /* CUDA's typed walk only: on the CPU it would save nothing. MODEL_FUSE_RELU=1 fuses there too, for
     * the tests: the plan's liveness rules for the fused ops are then checked by the CPU backend. */
    const char *fuse = getenv("MODEL_FUSE_RELU");
    if (typed(m) && (dev->kind == DEV_CUDA || (fuse && !strcmp(fuse, "1")))) fuse_relus(m);
    m->n_param_floats = b.pfloats;
    m->n_buffer_floats = b.bfloats;
    plan_gradient_accumulation(m);

    uint64_t h = FNV1A64_INIT;
    for (int i = 0; i < m->n_params; i++) h = shape_hash_add(h, m->params[i].name, m->params[i].shape);
    m->shape_hash = h;

    size_t pbytes = (size_t)m->n_param_floats * sizeof(float);
    m->param_flat = model_alloc(m, pbytes, "parameters");
    m->grad_flat = model_alloc(m, pbytes, "gradients");
    m->buffer_flat = model_alloc(m, (size_t)(m->n_buffer_floats + 1) * sizeof(float), "bn buffers");
    /* Activations in the model's type: 16 bits each on CUDA under autocast — half the memory. */
    size_t esz = precision_bytes(dev, prec);
    /* Planned lifetimes by default (MODEL_MEMORY_PLAN=0: every tensor kept all step, the reference
     * the plan is tested against). On an H200 the plan costs no time (5.01–5.05 ms/iter either way
     * for stage 1, channels-last) and halves the activation memory (docs/results.md). */
    const char *env = getenv("MODEL_MEMORY_PLAN");
    m->memory_plan = !env || strcmp(env, "0") != 0;
    env = getenv("MODEL_PLAN_POISON");
    m->plan_poison = dev->kind == DEV_CPU && env && !strcmp(env, "1");
    /* on CUDA the plan also holds each convolution's cuDNN workspace (sized by model_prepare) */
    m->plan_workspaces = m->memory_plan && dev->kind == DEV_CUDA;
    for (int l = 0; l < m->n_layers; l++) m->layers[l].conv.own_workspace = m->plan_workspaces;
    place_arena(m);
    /* The logits and their gradient live all step and outside the arena, so the pointers the
     * trainer and DataParallel take once stay valid when model_prepare re-plans the arena. */
    Activation *lg = &m->acts[m->n_acts - 1];
    lg->bytes = (size_t)max_batch * lg->c * esz;
    lg->x = model_alloc(m, lg->bytes, "logits");
    lg->dx = model_alloc(m, lg->bytes, "logits' gradient");
    if (typed(m)) {
        if (prec != PREC_FP32) { /* fp32 channels-last computes on param_flat and grad_flat */
            int64_t most = 0; /* the largest weight + bias of one layer */
            for (int l = 0; l < m->n_layers; l++) {
                Layer *L = &m->layers[l];
                if (L->kind != LAYER_CONV && L->kind != LAYER_LINEAR) continue;
                int64_t k = m->params[L->p0].count + (L->p1 >= 0 ? m->params[L->p1].count : 0);
                if (k > most) most = k;
            }
            m->param_lp = model_alloc(m, (size_t)m->n_param_floats * esz, "autocast weight copies");
            m->wgrad_lp = model_alloc(m, (size_t)most * esz, "autocast weight gradient");
            m->wgrad_cap = most;
            device_memset0(dev, m->wgrad_lp, (size_t)most * esz); /* every flush leaves it so */
        }
        size_t logits = (size_t)max_batch * m->classes * sizeof(float);
        m->input_lp = model_alloc(m, (size_t)max_batch * IMG_C * IMG_H * IMG_W * esz,
                                   "activations");
        m->logits32 = model_alloc(m, logits, "activations");
        m->dlogits32 = model_alloc(m, logits, "activation gradients");
    }
    for (int l = 0; l < m->n_layers; l++) {
        Layer *L = &m->layers[l];
        if (L->kind != LAYER_BN) continue;
        int c = m->acts[L->in].c;
        /* CUDA's scratch: its size never shrinks with the batch, so max_batch covers them all */
        bn_prepare(dev, m->channels_last, max_batch, c, m->acts[L->in].h * m->acts[L->in].w);
        L->save_mean = model_alloc(m, (size_t)c * sizeof(float), "bn saved stats");
        L->save_invstd = model_alloc(m, (size_t)c * sizeof(float), "bn saved stats");
    }
    init_params(m, seed);
    model_zero_grad(m);
    return m;
}

void model_destroy(Model *m) {
    if (!m) return;
    Device *d = m->dev;
    device_sync(d);
    graph_destroy(&m->graphs);
    free(m->hook_stop);
    for (int l = 0; l < m->n_layers; l++) {
        Layer *L = &m->layers[l];
        if (L->kind == LAYER_CONV) conv_release(d, &L->conv);
        if (L->kind == LAYER_BN) device_free(d, L->save_mean), device_free(d, L->save_invstd);
    }
    if (m->bn_sync.buf) device_free(d, m->bn_sync.buf);
    device_free(d, m->arena);
    device_free(d, m->acts[m->n_acts - 1].x), device_free(d, m->acts[m->n_acts - 1].dx);
    if (typed(m)) {
        device_free(d, m->param_lp); /* NULL (nothing to free) for fp32 channels-last */
        device_free(d, m->wgrad_lp);
        device_free(d, m->input_lp);
        device_free(d, m->logits32);
        device_free(d, m->dlogits32);
    }
    device_free(d, m->param_flat);
    device_free(d, m->grad_flat);
    device_free(d, m->buffer_flat);
    free(m->layers), free(m->params), free(m->buffers), free(m->acts);
    free(m);
}

static int is_prepared(const Model *m, int n) {
    for (int i = 0; i < m->n_prepared; i++)
        if (m->prepared[i] == n) return 1;
    return 0;
}

void model_count_forward(Model *m, int n) {
    if (!is_prepared(m, n)) m->unprepared_forwards++, m->unprepared_last = n;
}

void model_prepare(Model *m, int n) {
    ASSERT(n >= 1 && n <= m->max_batch);
    if (is_prepared(m, n)) return;
    ASSERT(m->n_prepared < (int)(sizeof m->prepared / sizeof m->prepared[0]));
    m->prepared[m->n_prepared++] = n;
    /* With the workspaces in the plan (CUDA), the arena is laid out again below. Free it first:
     * nothing in it outlives a step, and planning (with --cudnn-benchmark, cudnnFind's scratch
     * tensors and search workspace) then does not sit on top of it in the peak. */
    const int own = m->plan_workspaces;
    if (own && m->arena) {
        device_sync(m->dev);
        m->alloc_bytes -= device_alloc_size(m->arena_bytes);
        device_free(m->dev, m->arena);
        m->arena = NULL;
    }
    for (int l = 0; l < m->n_layers; l++) {
        Conv *c = &m->layers[l].conv;
        if (m->layers[l].kind != LAYER_CONV) continue;
        conv_prepare(m->dev, c, n);
        for (int k = 0; c->own_workspace && k < 2; k++) {
            size_t need = conv_workspace_bytes(m->dev, c, n, k);
            if (need > c->ws_cap[k]) c->ws_cap[k] = need;
        }
    }
    if (own) place_arena(m); /* the workspaces join the plan */
    /* New addresses (the arena, a grown shared workspace): every captured graph is stale. */
    graph_clear(&m->graphs);
}

/* ---- forward and backward -------------------------------------------------------------------- */

static float *P(Model *m, int p) { return m->param_flat + m->params[p].offset; }
static float *G(Model *m, int p) { return m->grad_flat + m->params[p].offset; }
static float *B(Model *m, int b) { return m->buffer_flat + m->buffers[b].offset; }
static int64_t numel(const Activation *a, int n) { return (int64_t)n * a->c * a->h * a->w; }

static void forward_typed(Model *m, int n, const float *x, int train);
static void forward_plain(Model *m, int n, int train);

typedef struct ForwardRun {
    Model *m;
    int n;
    const float *x;
} ForwardRun;

/* MODEL_PLAN_POISON=1 (the tests, CPU backend): when training time t ends, every tensor whose planned
 * life ends there is filled with NaN (all-ones bytes: a NaN in fp32, fp16 and bf16). Its bytes belong
 * to others from then on, so a read past its death — a liveness rule missing from plan_lifetimes —
 * now reads NaN instead of whatever happened to survive there, and the bitwise tests against the
 * unplanned model fail. An aliased gradient has no bytes of its own: its target's live on until
 * both have died (plan_memory). */
static void poison_dead(Model *m, int t) {
    if (!m->plan_poison) return;
    const int last = m->n_acts - 1; /* neither the input nor the logits is in the arena */
    for (int a = 1; a < last; a++) {
        Activation *A = &m->acts[a];
        if (A->x_dies == t) memset(A->x, 0xff, A->bytes);
        int dies = A->dx_alias ? -1 : A->dx_dies;
        for (int b = 1; b < last && dies >= 0; b++)
            if (m->acts[b].dx_alias == a && m->acts[b].dx_dies > dies) dies = m->acts[b].dx_dies;
        if (dies == t) memset(A->dx, 0xff, A->bytes);
    }
}

static void forward_walk(Model *m, int n, const float *x, int train) {
    if (typed(m))
        forward_typed(m, n, x, train);
    else
        forward_plain(m, n, train);
}

static void forward_train(void *arg) {
    const ForwardRun *a = arg;
    forward_walk(a->m, a->n, a->x, 1);
}

void model_forward(Model *m, int n, const float *x, int train) {
    ASSERT(n >= 1 && n <= m->max_batch);
    model_count_forward(m, n);
    /* what the walks and backward read as the input: set here, since a replayed graph runs no host code */
    m->acts[0].x = typed(m) ? m->input_lp : (float *)x;
    if (!train) { /* evaluation stays eager: it is not what a step's time is made of */
        forward_walk(m, n, x, 0);
        return;
    }
    ForwardRun a = {m, n, x};
    graph_run(&m->graphs, (GraphKey){x, n, GRAPH_FORWARD, 0}, forward_train, &a);
}

/* The exchange a training batch norm runs across the ranks (model_set_bn_sync), or NULL: its own batch. */
static const BnSync *bn_sync(const Model *m) { return m->bn_sync.sum ? &m->bn_sync : NULL; }

/* The plain walk reads its input as m->acts[0].x (set by model_forward). */
static void forward_plain(Model *m, int n, int train) {
    Device *d = m->dev;
    /* --trace: the whole forward (a one-layer view is DataParallel's op-by-op forward: its replica
     * thread traces the replica's whole forward instead) */
    int whole = m->n_layers > 1;
    TraceDev span;
    if (whole) span = trace_dev_begin(d, TRACE_COMPUTE, NULL, "forward", "forward", n);
    for (int l = 0; l < m->n_layers; l++) {
        Layer *L = &m->layers[l];
        Activation *in = &m->acts[L->in], *out = &m->acts[L->out];
        switch (L->kind) {
        case LAYER_CONV: conv_forward(d, &L->conv, n, in->x, P(m, L->p0), out->x); break;
        case LAYER_BN:
            if (train) /* fp32, NCHW: bn_forward_train's arithmetic, across the ranks under SyncBatchNorm */
                bn_forward_train_sync(d, PREC_FP32, 0, n, in->c, in->h * in->w, in->x, P(m, L->p0),
                                      P(m, L->p1), B(m, L->b0), B(m, L->b0 + 1), BN_MOMENTUM, BN_EPS,
                                      L->save_mean, L->save_invstd, out->x, 0, bn_sync(m));
            else
                bn_forward_eval(d, n, in->c, in->h * in->w, in->x, P(m, L->p0), P(m, L->p1),
                                B(m, L->b0), B(m, L->b0 + 1), BN_EPS, out->x);
            break;
        case LAYER_RELU: relu_forward(d, numel(in, n), in->x, out->x); break;
        case LAYER_ADD: add_forward(d, numel(in, n), in->x, m->acts[L->in2].x, out->x); break;
        case LAYER_POOL: avgpool_forward(d, n, in->c, in->h * in->w, in->x, out->x); break;
        case LAYER_LINEAR:
            linear_forward(d, n, L->fin, L->fout, in->x, P(m, L->p0), P(m, L->p1), out->x);
            break;
        }
        if (train) poison_dead(m, l);
    }
    if (whole) trace_dev_end(span);
}

float *model_logits(Model *m) {
    return typed(m) ? m->logits32 : m->acts[m->n_acts - 1].x;
}
float *model_dlogits(Model *m) {
    return typed(m) ? m->dlogits32 : m->acts[m->n_acts - 1].dx;
}

static void ready(Layer *L, GradReadyFn fn, void *ctx) {
    if (!fn) return;
    if (L->p0 >= 0) fn(ctx, L->p0);
    if (L->p1 >= 0) fn(ctx, L->p1);
}

/* Backward is a sequence of positions: each layer, from the last, in two halves around its ready
 * point. Half 0 makes the layer's parameter gradients final (a conv's weight gradient; all of batch
 * norm's and linear's backward; all of the parameter-free layers'); half 1 is the rest (a conv's
 * input gradient). DDP's hook runs between the two, so the all-reduce of a bucket starts while the
 * input gradients are still being computed — or after both (model_set_hook_after_layer). */
static void backward_half(Model *m, int n, int l, int half) {
    Device *d = m->dev;
    Layer *L = &m->layers[l];
    Activation *in = &m->acts[L->in], *out = &m->acts[L->out];
    float *dx = in->dx; /* NULL for the input batch: no gradient needed there */
    if (half == 1) { /* only a conv has a second half: its input gradient */
        if (L->kind == LAYER_CONV && dx) conv_backward_data(d, &L->conv, n, out->dx, P(m, L->p0), dx, L->acc_in);
        return;
    }
    switch (L->kind) {
    case LAYER_CONV: /* weight gradient first: it is final now, so DDP can start reducing it */
        conv_backward_filter(d, &L->conv, n, in->x, out->dx, G(m, L->p0), !m->grad_fresh);
        break;
    case LAYER_BN:
        bn_backward_sync(d, PREC_FP32, 0, n, in->c, in->h * in->w, in->x, NULL, out->dx, P(m, L->p0), L->save_mean,
                         L->save_invstd, BN_EPS, dx, G(m, L->p0), G(m, L->p1), L->acc_in, 0, bn_sync(m));
        break;
    case LAYER_RELU: relu_backward(d, numel(out, n), out->x, out->dx, dx, 0); break;
    case LAYER_ADD: /* d(in) may BE d(out) (the plan's alias): then there is nothing to copy */
        if (dx != out->dx) grad_pass(d, numel(out, n), out->dx, dx, L->acc_in);
        grad_pass(d, numel(out, n), out->dx, m->acts[L->in2].dx, L->acc_in2);
        break;
    case LAYER_POOL: avgpool_backward(d, n, in->c, in->h * in->w, out->dx, dx, L->acc_in); break;
    case LAYER_LINEAR:
        linear_backward(d, n, L->fin, L->fout, in->x, P(m, L->p0), out->dx, dx, G(m, L->p0), G(m, L->p1),
                        L->acc_in);
        break;
    }
}

static void backward_prologue_typed(Model *m, int n);
static void backward_half_typed(Model *m, int n, int l, int half);
static void wgrad_flush(Model *m);

/* Positions [from, to) of the backward: one stretch between two ready points (a CUDA graph). */
typedef struct BackwardStretch {
    Model *m;
    int n, from, to;
} BackwardStretch;

static void backward_stretch(void *arg) {
    const BackwardStretch *a = arg;
    Model *m = a->m;
    const int L = m->n_layers;
    if (a->from == 0 && typed(m)) backward_prologue_typed(m, a->n);
    for (int pos = a->from; pos < a->to; pos++) {
        if (typed(m))
            backward_half_typed(m, a->n, L - 1 - pos / 2, pos % 2);
        else
            backward_half(m, a->n, L - 1 - pos / 2, pos % 2);
        if (pos % 2) poison_dead(m, L + 1 + pos / 2); /* layer i's backward is time 2L − i (plan_lifetimes) */
    }
    if (m->wgrad_lp) wgrad_flush(m); /* the stretch's weight gradients are final when it ends */
}

static int stops_at(const Model *m, const Layer *ly) {
    return !m->hook_stop || m->hook_stop[ly->p0] || (ly->p1 >= 0 && m->hook_stop[ly->p1]);
}

void model_backward(Model *m, int n, GradReadyFn on_grad_ready, void *ctx) {
    TraceDev span = trace_dev_begin(m->dev, TRACE_COMPUTE, NULL, "backward", "backward", n);
    /* Without a hook the whole backward is one stretch; with one, a stretch ends at each stop and
     * the hook runs between stretches — host work the graphs leave out (graph.h). The plain walk's
     * first conv reads the input batch itself: its address is part of the key. */
    const int L = m->n_layers, end = 2 * L;
    const void *x = typed(m) ? NULL : m->acts[0].x;
    int from = 0, seg = 0, waiting[MAX_LAYERS], n_waiting = 0; /* ready since the last stop */
    for (int pos = 0; pos < end; pos++) {
        Layer *ly = &m->layers[L - 1 - pos / 2];
        int point = on_grad_ready && pos % 2 == m->hook_after_layer && ly->p0 >= 0, stop = point && stops_at(m, ly);
        if (point && !stop) waiting[n_waiting++] = L - 1 - pos / 2;
        if (!stop && pos + 1 < end) continue;
        BackwardStretch a = {m, n, from, pos + 1};
        graph_run(&m->graphs, (GraphKey){x, n, on_grad_ready ? seg++ : GRAPH_BACKWARD, m->grad_fresh},
                  backward_stretch, &a);
        for (int i = 0; i < n_waiting; i++) ready(&m->layers[waiting[i]], on_grad_ready, ctx);
        n_waiting = 0;
        if (stop) ready(ly, on_grad_ready, ctx);
        from = pos + 1;
    }
    m->grad_fresh = 0; /* the next backward (gradient accumulation, DP's replicas) adds */
    trace_dev_end(span);
}

void model_set_hook_stops(Model *m, const unsigned char *stop) {
    if (stop && m->hook_stop && !memcmp(stop, m->hook_stop, (size_t)m->n_params)) return;
    free(m->hook_stop);
    m->hook_stop = NULL;
    if (stop) {
        m->hook_stop = xmalloc((size_t)m->n_params);
        memcpy(m->hook_stop, stop, (size_t)m->n_params);
    }
    graph_clear(&m->graphs); /* the stretches changed */
}

void model_set_bn_sync(Model *m, const BnSync *s) {
    ASSERT(!m->bn_sync.sum && s->sum && s->world >= 1);
    int most = 0; /* the exchange holds every rank's triples of the widest batch-norm layer */
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].kind == LAYER_BN && m->acts[m->layers[l].in].c > most) most = m->acts[m->layers[l].in].c;
    m->bn_sync = *s;
    m->bn_sync.buf = device_alloc(m->dev, (size_t)s->world * 3 * (size_t)(most ? most : 1) * sizeof(float),
                                  "SyncBatchNorm exchange");
    /* each exchange is a host call between two kernels, which a replayed graph would skip */
    graph_clear(&m->graphs);
    m->graphs.enabled = 0;
}

void model_set_hook_after_layer(Model *m, int on) {
    if (m->hook_after_layer == (on != 0)) return;
    m->hook_after_layer = on != 0;
    graph_clear(&m->graphs); /* the stretches changed */
}

int64_t model_head_floats(const Model *m) {
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == LAYER_LINEAR) return m->params[m->layers[i].p0].count + m->params[m->layers[i].p1].count;
    return 0;
}

uint64_t model_shape_hash_with_head(const Model *m) {
    if (m->unused_params) return m->shape_hash; /* it has the head already */
    const Layer *fc = NULL;
    for (int i = 0; i < m->n_layers && !fc; i++)
        if (m->layers[i].kind == LAYER_LINEAR) fc = &m->layers[i];
    if (!fc) return 0;
    /* what model_create's fingerprint adds for fc_unused: the linear head's shapes under its name */
    uint64_t h = shape_hash_add(m->shape_hash, "fc_unused.weight", m->params[fc->p0].shape);
    return shape_hash_add(h, "fc_unused.bias", m->params[fc->p1].shape);
}

int model_hook_point(const Model *m, int p) {
    int point = 0;
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const Layer *ly = &m->layers[l];
        if (ly->p0 < 0) continue;
        if (ly->p0 == p || ly->p1 == p) return point;
        point++;
    }
    return -1;
}

/* ---- the typed walk: autocast, channels-last ---------------------------------------------------- */
/* The same walk as above with every activation in m->prec (fp32 too, for a channels-last model),
 * NHWC when channels-last. Under autocast the weights are cast once per forward, and each weight
 * gradient comes back in the low type and is added into the fp32 one; which op runs in which type
 * is PyTorch's CUDA autocast (see model.h and the stage 5 lesson). A channels-last model's conv
 * weights are KRSC in param_flat itself (model.h), so the cast is elementwise, and in fp32 there is
 * no copy at all: cuDNN reads param_flat and adds into grad_flat, as the plain walk does. On CUDA
 * a ReLU after a BN or an add is fused into it (fuse_relus). */

static void *PL(Model *m, int p) { /* parameter p's low-precision copy */
    return (char *)m->param_lp + (size_t)m->params[p].offset * precision_bytes(m->dev, m->prec);
}
/* The weight (or bias) conv and linear compute with: the cast copy under autocast, else itself. */
static void *PW(Model *m, int p) { return m->param_lp ? PL(m, p) : P(m, p); }

static void forward_typed(Model *m, int n, const float *x, int train) {
    Device *d = m->dev;
    Precision p = m->prec;
    TraceDev span = trace_dev_begin(d, TRACE_COMPUTE, NULL, "forward", "forward", n);
    /* autocast's casts: every weight once for this forward (the cast cache; one pass over the flat
     * buffer, BN's fp32 parameters too: never read, but simpler), and the input (NHWC when
     * channels-last: the batch arrives NCHW, as a DataLoader gives it) */
    if (m->param_lp) cast_to(d, p, m->n_param_floats, m->param_flat, m->param_lp);
    if (m->channels_last) cast_to_nhwc(d, p, n, IMG_C, IMG_H * IMG_W, x, m->input_lp);
    else cast_to(d, p, (int64_t)n * IMG_C * IMG_H * IMG_W, x, m->input_lp);
    const int cl = m->channels_last;
    for (int l = 0; l < m->n_layers; l++) {
        Layer *L = &m->layers[l];
        Activation *in = &m->acts[L->in], *out = &m->acts[L->out];
        switch (L->kind) {
        case LAYER_CONV: conv_forward_lp(d, &L->conv, p, n, in->x, PW(m, L->p0), out->x); break;
        case LAYER_BN: /* half in, half out; fp32 weight, bias and statistics */
            if (train)
                bn_forward_train_sync(d, p, cl, n, in->c, in->h * in->w, in->x, P(m, L->p0),
                                      P(m, L->p1), B(m, L->b0), B(m, L->b0 + 1), BN_MOMENTUM,
                                      BN_EPS, L->save_mean, L->save_invstd, out->x, L->fuse_relu,
                                      bn_sync(m));
            else /* evaluation leaves the fused ReLU to its own layer */
                bn_forward_eval_lp(d, p, cl, n, in->c, in->h * in->w, in->x, P(m, L->p0),
                                   P(m, L->p1), B(m, L->b0), B(m, L->b0 + 1), BN_EPS, out->x);
            break;
        case LAYER_RELU:
            if (!L->fused || !train) relu_forward_lp(d, p, numel(in, n), in->x, out->x);
            break;
        case LAYER_ADD:
            if (L->fuse_relu && train)
                add_relu_forward_lp(d, p, numel(in, n), in->x, m->acts[L->in2].x, out->x);
            else
                add_forward_lp(d, p, numel(in, n), in->x, m->acts[L->in2].x, out->x);
            break;
        case LAYER_POOL:
            avgpool_forward_lp(d, p, cl, n, in->c, in->h * in->w, in->x, out->x);
            break;
        case LAYER_LINEAR:
            if (m->param_lp)
                linear_forward_lp(d, p, n, L->fin, L->fout, in->x, PL(m, L->p0), PL(m, L->p1), out->x);
            else /* fp32: the plain walk's linear (PyTorch's fp32 matmul) */
                linear_forward(d, n, L->fin, L->fout, in->x, P(m, L->p0), P(m, L->p1), out->x);
            break;
        }
        if (train) poison_dead(m, l);
    }
    /* cross-entropy is on autocast's fp32 list: the loss reads the logits cast to fp32 */
    cast_from(d, p, (int64_t)n * m->classes, m->acts[m->n_acts - 1].x, m->logits32);
    trace_dev_end(span);
}

/* the backward of the logits' cast to fp32 is a cast back to the low type */
static void backward_prologue_typed(Model *m, int n) {
    cast_to(m->dev, m->prec, (int64_t)n * m->classes, m->dlogits32, m->acts[m->n_acts - 1].dx);
}

/* Autocast's weight gradients, added into the fp32 .grad several layers at a time. A conv or linear
 * layer writes its p gradient (cuDNN and cuBLAS overwrite) into wgrad_lp at the place its slice of
 * grad_flat has in a window [hi − cap, hi) of the flat buffer; backward visits the layers last to
 * first, so the written range [lo, hi) grows downward. One cast_add_clear adds the whole range into
 * grad_flat — when the next layer falls outside the window, and at the end of every backward
 * stretch (before DDP's hooks read the gradients) — and leaves wgrad_lp zero, so the places between
 * two layers (batch norm's parameters, fp32 already) keep their bits. ResNet-18: 7 casts a backward
 * instead of 22 (a few more where DDP's buckets end stretches), in the same memory — the window is
 * the largest layer, so layer 4's weights still go one at a time and layers 1–3 in two casts. */
/* The window's slot for grad_flat[off]. */
static void *wgrad_at(const Model *m, int64_t off) {
    return (char *)m->wgrad_lp + (size_t)(off - (m->wgrad_hi - m->wgrad_cap)) * precision_bytes(m->dev, m->prec);
}

static void wgrad_flush(Model *m) {
    if (m->wgrad_lo == m->wgrad_hi) return;
    cast_add_clear(m->dev, m->prec, m->wgrad_hi - m->wgrad_lo, wgrad_at(m, m->wgrad_lo), m->grad_flat + m->wgrad_lo);
    m->wgrad_lo = m->wgrad_hi = 0;
}

/* Where the p gradient of grad_flat[off, off + count) goes; flushes first when it does not fit. */
static void *wgrad_slot(Model *m, int64_t off, int64_t count) {
    ASSERT(count <= m->wgrad_cap);
    if (m->wgrad_lo == m->wgrad_hi || off + count > m->wgrad_lo || off < m->wgrad_hi - m->wgrad_cap) {
        wgrad_flush(m);
        m->wgrad_hi = off + count;
    }
    m->wgrad_lo = off;
    return wgrad_at(m, off);
}

static void backward_half_typed(Model *m, int n, int l, int half) {
    Device *d = m->dev;
    Precision p = m->prec;
    size_t esz = precision_bytes(d, p);
    const int cl = m->channels_last;
    Layer *L = &m->layers[l];
    Activation *in = &m->acts[L->in], *out = &m->acts[L->out];
    void *dx = in->dx;
    if (half == 1) { /* only a conv has a second half: its input gradient */
        if (L->kind == LAYER_CONV && dx) conv_backward_data_lp(d, &L->conv, p, n, out->dx, PW(m, L->p0), dx, L->acc_in);
        return;
    }
    switch (L->kind) {
    case LAYER_CONV:
        if (m->wgrad_lp) {
            /* the low-precision gradient of the cast weight; the cast's backward (+= into the fp32
             * gradient, both in the model's order) comes with its neighbours' (wgrad_flush) */
            const Param *w = &m->params[L->p0];
            conv_backward_filter_lp(d, &L->conv, p, n, in->x, out->dx, wgrad_slot(m, w->offset, w->count));
        } else { /* fp32: cuDNN adds straight into .grad (beta = 1) or writes it, as the plain walk */
            conv_backward_filter(d, &L->conv, n, in->x, out->dx, G(m, L->p0), !m->grad_fresh);
        }
        break;
    case LAYER_BN: /* dgamma, dbeta are fp32 already; a fused ReLU masks out->dx by out->x */
        bn_backward_sync(d, p, cl, n, in->c, in->h * in->w, in->x, out->x, out->dx, P(m, L->p0),
                         L->save_mean, L->save_invstd, BN_EPS, dx, G(m, L->p0), G(m, L->p1),
                         L->acc_in, L->fuse_relu, bn_sync(m));
        break;
    case LAYER_RELU:
        if (!L->fused) relu_backward_lp(d, p, numel(out, n), out->x, out->dx, dx, 0);
        break;
    case LAYER_ADD:
        if (L->fuse_relu) {
            add_relu_backward_lp(d, p, numel(out, n), out->x, out->dx, dx, L->acc_in,
                                 m->acts[L->in2].dx, L->acc_in2);
            break;
        }
        if (dx != out->dx) grad_pass_lp(d, p, numel(out, n), out->dx, dx, L->acc_in);
        grad_pass_lp(d, p, numel(out, n), out->dx, m->acts[L->in2].dx, L->acc_in2);
        break;
    case LAYER_POOL:
        avgpool_backward_lp(d, p, cl, n, in->c, in->h * in->w, out->dx, dx, L->acc_in);
        break;
    case LAYER_LINEAR: {
        if (!m->wgrad_lp) { /* fp32: the plain walk's linear, adding into .grad */
            linear_backward(d, n, L->fin, L->fout, in->x, P(m, L->p0), out->dx, dx, G(m, L->p0),
                            G(m, L->p1), L->acc_in);
            break;
        }
        const Param *w = &m->params[L->p0], *b = &m->params[L->p1];
        ASSERT(b->offset == w->offset + w->count); /* one slot for both: the bias follows its weight */
        void *dW = wgrad_slot(m, w->offset, w->count + b->count), *db = (char *)dW + (size_t)w->count * esz;
        linear_backward_lp(d, p, n, L->fin, L->fout, in->x, PL(m, L->p0), out->dx, dx, dW, db,
                           L->acc_in);
        break;
    }
    }
}

/* Zeros, and a note for the next backward: its conv weight gradients may be written (cuDNN beta = 0)
 * instead of added to these zeros (beta = 1, for which cuDNN's backward-filter kernels run a second
 * pass: ops.h). PyTorch gets the same from zero_grad(set_to_none=True): the first backward assigns
 * each .grad. The zeros stay for everything else — batch norm's and the linear layer's gradients
 * still add, and a parameter backward never reaches keeps zeros (DDP's unused parameters). */
void model_zero_grad(Model *m) {
    device_memset0(m->dev, m->grad_flat, (size_t)m->n_param_floats * sizeof(float));
    m->grad_fresh = 1;
}

/* ---- the public order (model.h): conv weights OIHW outside the model ------------------------------ */

void conv_weight_oihw_to_krsc(int cout, int cin, int kk, const float *src, float *dst) {
    for (int o = 0; o < cout; o++)
        for (int i = 0; i < cin; i++)
            for (int r = 0; r < kk; r++)
                dst[((int64_t)o * kk + r) * cin + i] = src[((int64_t)o * cin + i) * kk + r];
}

/* Both are a transpose of each [cin][kk] (or [kk][cin]) block: the inverse swaps the two sizes. */
void conv_weight_krsc_to_oihw(int cout, int cin, int kk, const float *src, float *dst) {
    conv_weight_oihw_to_krsc(cout, kk, cin, src, dst);
}

/* Parameter by parameter (they tile the flat buffer): a conv weight of a channels-last model is
 * reordered through a scratch copy (so src may be dst), everything else copied. */
static void convert_params(const Model *m, const float *src, float *dst, int to_oihw) {
    if (!m->channels_last) {
        if (src != dst) memcpy(dst, src, (size_t)m->n_param_floats * sizeof(float));
        return;
    }
    int64_t most = 1;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].count > most) most = m->params[i].count;
    float *tmp = xmalloc((size_t)most * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        const Param *q = &m->params[i];
        const float *s = src + q->offset;
        float *t = dst + q->offset;
        if (q->ndim != 4) { /* only conv weights have a layout */
            if (s != t) memcpy(t, s, (size_t)q->count * sizeof(float));
            continue;
        }
        memcpy(tmp, s, (size_t)q->count * sizeof(float));
        int kk = q->shape[2] * q->shape[3];
        if (to_oihw) conv_weight_krsc_to_oihw(q->shape[0], q->shape[1], kk, tmp, t);
        else conv_weight_oihw_to_krsc(q->shape[0], q->shape[1], kk, tmp, t);
    }
    free(tmp);
}

void model_params_to_oihw(const Model *m, const float *src, float *dst) { convert_params(m, src, dst, 1); }
void model_params_from_oihw(const Model *m, const float *src, float *dst) { convert_params(m, src, dst, 0); }

void model_read_oihw(Model *m, const float *flat, float *host) {
    device_copy_d2h(m->dev, host, flat, (size_t)m->n_param_floats * sizeof(float)); /* waits */
    model_params_to_oihw(m, host, host);
}

void model_write_oihw(Model *m, const float *host, float *flat) {
    size_t bytes = (size_t)m->n_param_floats * sizeof(float);
    float *t = xmalloc(bytes);
    model_params_from_oihw(m, host, t);
    device_copy_h2d(m->dev, flat, t, bytes);
    device_sync(m->dev); /* the copy may still read t */
    free(t);
}

const char *model_describe(const Model *m, char *buf, int len) {
    char num[32];
    int64_t v = m->n_param_floats;
    snprintf(num, sizeof num, "%lld", (long long)v);
    /* thousands separators make "11,173,962" readable at a glance */
    char sep[40];
    int nl = (int)strlen(num), j = 0;
    for (int i = 0; i < nl; i++) {
        sep[j++] = num[i];
        if ((nl - i - 1) % 3 == 0 && i != nl - 1) sep[j++] = ',';
    }
    sep[j] = 0;
    snprintf(buf, len, "%s (norm %s%s): %s parameters%s, %d layers%s%s%s, activations %.1f MiB %s%s",
             m->arch, m->norm_bn ? "bn" : "none", m->bn_sync.sum ? ", SyncBatchNorm" : "", sep,
             m->unused_params ? " (with fc_unused, never used)" : "",
             m->n_layers,
             m->prec != PREC_FP32 ? ", autocast " : "",
             m->prec != PREC_FP32 ? precision_name(m->prec) : "",
             m->channels_last ? ", channels-last" : "", m->arena_bytes / 1048576.0,
             m->memory_plan ? "planned" : "unplanned", m->graphs.enabled ? ", CUDA graphs" : "");
    return buf;
}

/* ---- arithmetic per step --------------------------------------------------------------------------- */

/* FLOPs of conv and linear, the convention in model.h; everything is read off the layer list. */
int64_t model_flops(const Model *m, int n, int64_t *forward) {
    int64_t fwd = 0, bwd = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *L = &m->layers[l];
        int64_t f;
        if (L->kind == LAYER_CONV) {
            const ConvShape *s = &L->conv.s;
            f = 2 * (int64_t)n * s->cout * s->hout * s->wout * s->cin * s->k * s->k;
        } else if (L->kind == LAYER_LINEAR) {
            f = 2 * (int64_t)n * L->fin * L->fout;
        } else {
            continue;
        }
        fwd += f;
        /* backward: the weight gradient always; the input gradient unless the input is the batch
         * (activation 0), which model_backward skips as autograd does */
        bwd += f + (L->in != 0 ? f : 0);
    }
    if (forward) *forward = fwd;
    return fwd + bwd;
}
