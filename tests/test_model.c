/* test_model.c — the model as a whole: layout, initialisation, the backward plan, the gradient-ready
 * hook, accumulation semantics, train/eval, and (with a GPU) the CUDA model against the CPU model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp.h"
#include "checkpoint.h"
#include "graph.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "tests.h"

static Device cpu(void) {
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    return d;
}

START_TEST(resnet18_has_pytorch_parameter_count) {
    Device d = cpu();
    Model *m = model_create(&d, "resnet18", 1, 1, 0);
    ck_assert_int_eq(m->n_param_floats, 11173962); /* sum(p.numel()) of the CIFAR ResNet-18 */
    ck_assert_int_eq(m->n_params, 62);
    ck_assert_int_eq(m->n_buffer_floats, 2 * 4800); /* running mean + var of every BN channel */
    ck_assert_str_eq(m->params[0].name, "conv1.weight");
    ck_assert_str_eq(m->params[m->n_params - 1].name, "linear.bias");
    Model *none = model_create(&d, "resnet18", 0, 1, 0);
    ck_assert_int_eq(none->n_buffer_floats, 0);
    ck_assert(none->shape_hash != m->shape_hash);
    model_destroy(none);
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

/* A batch whose largest activation would pass 2^31 − 1 elements (cuDNN's descriptors and the
 * kernels index with 32 bits) is refused with the largest batch that fits, before any allocation:
 * ResNet-18's stem output is 64×32×32 = 2^16 an image, so 32767 is the last batch that fits. */
static void create_at_batch(void *batch) {
    Device d = cpu();
    Model *m = model_create(&d, "resnet18", 1, *(int *)batch, 0);
    printf("created at batch %d, %zu bytes planned\n", m->max_batch, m->arena_bytes);
    model_destroy(m);
    device_destroy(&d);
}

START_TEST(batch_past_32bit_indexing_is_refused) {
    char *out;
    int batch = 32768;
    int rc = test_run_captured(create_at_batch, &batch, &out);
    ck_assert_msg(rc != 0 && strstr(out, "--batch-size 32768 is too large for resnet18") &&
                      strstr(out, "use --batch-size 32767 or less"),
                  "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

START_TEST(init_follows_pytorch_defaults) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 2, 123);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        float *v = m->param_flat + p->offset;
        if (p->ndim >= 2 || strstr(p->name, "linear.bias")) {
            int64_t fan_in = p->ndim >= 2 ? p->count / p->shape[0] : m->params[i - 1].count / p->count;
            double bound = 1.0 / sqrt((double)fan_in), mx = 0, mean = 0;
            for (int64_t j = 0; j < p->count; j++) mx = test_max_nan(mx, fabs(v[j])), mean += v[j];
            ck_assert_msg(mx <= bound && mx > 0.5 * bound, "%s: max |w| %g vs bound %g", p->name, mx, bound);
            ck_assert(fabs(mean / p->count) < 0.2 * bound + bound / sqrt((double)p->count) * 3);
        } else if (strstr(p->name, "weight")) { /* batch-norm γ */
            for (int64_t j = 0; j < p->count; j++) ck_assert(v[j] == 1.0f);
        } else {
            for (int64_t j = 0; j < p->count; j++) ck_assert(v[j] == 0.0f);
        }
    }
    /* and the buffers are nn.BatchNorm2d's: running_mean 0, running_var 1 (the first step's momentum
     * update mixes them in, and eval mode before any step reads them as they are) */
    ck_assert_int_eq(m->n_buffers, 2 * 7);
    for (int i = 0; i < m->n_buffers; i++) {
        const Param *b = &m->buffers[i];
        const float want = strstr(b->name, "running_var") ? 1.0f : 0.0f;
        ck_assert_msg(strstr(b->name, "running_var") || strstr(b->name, "running_mean"), "%s", b->name);
        for (int64_t j = 0; j < b->count; j++)
            ck_assert_msg(m->buffer_flat[b->offset + j] == want, "%s[%lld] is %g, nn.BatchNorm2d starts at %g", b->name,
                          (long long)j, m->buffer_flat[b->offset + j], want);
    }
    /* same seed, same weights; other seed, other weights */
    Model *same = model_create(&d, "tiny", 1, 2, 123), *other = model_create(&d, "tiny", 1, 2, 124);
    ck_assert(!memcmp(same->param_flat, m->param_flat, m->n_param_floats * sizeof(float)));
    ck_assert(memcmp(other->param_flat, m->param_flat, m->n_param_floats * sizeof(float)));
    model_destroy(same), model_destroy(other), model_destroy(m);
    device_destroy(&d);
}
END_TEST

START_TEST(backward_plan_accumulates_at_fan_out) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 2, 0);
    /* Every activation read by two layers gets exactly one overwrite and one accumulate. */
    int reads[128] = {0}, acc[128] = {0};
    for (int l = 0; l < m->n_layers; l++) {
        Layer *L = &m->layers[l];
        if (L->kind == LAYER_RELU) continue;
        reads[L->in]++, acc[L->in] += L->acc_in;
        if (L->in2 >= 0) reads[L->in2]++, acc[L->in2] += L->acc_in2;
    }
    int fanouts = 0;
    for (int a = 0; a < m->n_acts; a++) {
        ck_assert_int_eq(acc[a], reads[a] > 0 ? reads[a] - 1 : 0);
        fanouts += reads[a] > 1;
    }
    ck_assert_int_eq(fanouts, 2); /* tiny: one residual block per stage, two stages */
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

typedef struct Ready {
    int calls[128];
    int order[128], n;
} Ready;
static void on_ready(void *ctx, int p) {
    Ready *r = ctx;
    r->calls[p]++;
    r->order[r->n++] = p;
}

START_TEST(grad_ready_hook_fires_once_per_parameter_in_reverse) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 4, 0);
    float x[4 * 3072];
    int32_t y[4] = {1, 2, 3, 4};
    test_fill_uniform(x, 4 * 3072, 5, -1, 1);
    float loss;
    int32_t correct;
    model_forward(m, 4, x, 1);
    xent_forward_backward(&d, 4, 10, model_logits(m), y, 0.25f, &loss, &correct, model_dlogits(m));
    Ready r = {0};
    model_backward(m, 4, on_ready, &r);
    ck_assert_int_eq(r.n, m->n_params);
    for (int p = 0; p < m->n_params; p++) ck_assert_int_eq(r.calls[p], 1);
    ck_assert_int_eq(r.order[0], m->n_params - 2); /* linear.weight is ready first */
    ck_assert_int_eq(r.order[r.n - 1], 0);         /* conv1.weight last */
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

/* model_set_hook_stops: backward stops only after the marked parameters' layers, and there runs
 * the hooks of everything made ready since the last stop, in the same order. Seen from a hook: with
 * a stop at every parameter (the default) conv1's gradient is still zero when the first hook runs;
 * with the only stop at conv1 — the last point — every hook runs after the whole backward, in the
 * same order, and the gradients are the same. */
typedef struct StopSeen { Model *m; int order[64], n, conv1_done_at_first; } StopSeen;
static void on_ready_stop(void *ctx, int p) {
    StopSeen *s = ctx;
    if (s->n == 0) s->conv1_done_at_first = s->m->grad_flat[s->m->params[0].offset] != 0.0f;
    s->order[s->n++] = p;
}

START_TEST(hook_stops_defer_hooks_in_order) {
    Device d = cpu();
    float x[4 * 3072];
    int32_t y[4] = {1, 2, 3, 4};
    test_fill_uniform(x, 4 * 3072, 5, -1, 1);
    float loss, *g[2];
    int32_t correct;
    StopSeen seen[2] = {0};
    for (int v = 0; v < 2; v++) {
        Model *m = model_create(&d, "tiny", 1, 4, 0);
        ck_assert_int_eq(model_hook_point(m, m->n_params - 2), 0); /* linear first */
        int last = model_hook_point(m, 0);                        /* conv1 last */
        for (int p = 1; p < m->n_params; p++) ck_assert_int_lt(model_hook_point(m, p), last);
        if (v) {
            unsigned char stop[64] = {0};
            stop[0] = 1;
            model_set_hook_stops(m, stop);
        }
        seen[v].m = m;
        model_forward(m, 4, x, 1);
        xent_forward_backward(&d, 4, 10, model_logits(m), y, 0.25f, &loss, &correct, model_dlogits(m));
        model_backward(m, 4, on_ready_stop, &seen[v]);
        ck_assert_int_eq(seen[v].n, m->n_params);
        g[v] = malloc(m->n_param_floats * sizeof(float));
        memcpy(g[v], m->grad_flat, m->n_param_floats * sizeof(float));
        if (v) ck_assert(!memcmp(g[0], g[1], m->n_param_floats * sizeof(float)));
        model_destroy(m);
    }
    ck_assert_int_eq(seen[0].conv1_done_at_first, 0);
    ck_assert_int_eq(seen[1].conv1_done_at_first, 1);
    ck_assert(!memcmp(seen[0].order, seen[1].order, sizeof seen[0].order));
    free(g[0]), free(g[1]);
    device_destroy(&d);
}
END_TEST

START_TEST(gradients_accumulate_across_backwards) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 0, 4, 0); /* no BN: two identical passes, identical grads */
    float x[4 * 3072];
    int32_t y[4] = {0, 9, 5, 5};
    test_fill_uniform(x, 4 * 3072, 6, -1, 1);
    float loss;
    int32_t correct;
    int64_t n = m->n_param_floats;
    float *once = malloc(n * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        model_forward(m, 4, x, 1);
        xent_forward_backward(&d, 4, 10, model_logits(m), y, 0.25f, &loss, &correct, model_dlogits(m));
        model_backward(m, 4, NULL, NULL);
        if (pass == 0) memcpy(once, m->grad_flat, n * sizeof(float));
    }
    for (int64_t i = 0; i < n; i++) ck_assert_float_eq_tol(m->grad_flat[i], 2 * once[i], 1e-6 + 1e-5 * fabsf(once[i]));
    model_zero_grad(m);
    for (int64_t i = 0; i < n; i++) ck_assert(m->grad_flat[i] == 0.0f);
    free(once);
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

START_TEST(eval_mode_leaves_running_stats_alone) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 4, 0);
    float x[4 * 3072];
    test_fill_uniform(x, 4 * 3072, 8, -2, 3);
    int64_t nb = m->n_buffer_floats;
    float *before = malloc(nb * sizeof(float)), *l1 = malloc(40 * sizeof(float));
    memcpy(before, m->buffer_flat, nb * sizeof(float));
    model_forward(m, 4, x, 0);
    ck_assert(!memcmp(before, m->buffer_flat, nb * sizeof(float)));
    memcpy(l1, model_logits(m), 40 * sizeof(float));
    model_forward(m, 4, x, 0);
    ck_assert(!memcmp(l1, model_logits(m), 40 * sizeof(float))); /* deterministic */
    model_forward(m, 4, x, 1);
    ck_assert(memcmp(before, m->buffer_flat, nb * sizeof(float)));
    free(before), free(l1);
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

/* ---- the activation memory plan (model.h: "Activation memory") --------------------------------- */

/* batch images of 3×32×32 uniform in [−2, 2) from seed (malloc'd) */
static float *random_batch(int batch, uint64_t seed) {
    float *x = malloc((size_t)batch * 3072 * sizeof(float));
    test_fill_uniform(x, (int64_t)batch * 3072, seed, -2, 2);
    return x;
}

/* One training step (forward, loss, backward with hook at each gradient) of batch n on the CPU backend. */
static void train_step_hooked(Model *m, int n, const float *x, const int32_t *y, GradReadyFn hook) {
    float loss;
    int32_t correct;
    model_forward(m, n, x, 1);
    xent_forward_backward(m->dev, n, 10, model_logits(m), y, 1.0f / n, &loss, &correct, model_dlogits(m));
    model_backward(m, n, hook, NULL);
}

static void train_step(Model *m, int n, const float *x, const int32_t *y) { train_step_hooked(m, n, x, y, NULL); }

/* The plan is sound, checked apart from the planner: every x and dx lies inside the arena, and any
 * two alive at one step of the timeline share no byte. It is also no worse than the most bytes alive
 * at one step (the bound no placement beats) by more than 5%, and far below keeping everything.
 * Then the device's account: one training step at the largest batch peaks at exactly what the
 * model says it holds (arena included, nothing allocated in the step), and the model's description
 * prints the planned arena. */
static void check_plan(const char *arch, int batch, Precision p) {
    Device d = cpu();
    float *x = random_batch(batch, 21);
    int32_t y[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    size_t base = d.mem_cur;
    Model *m = model_create_mixed(&d, arch, 1, batch, 0, p, 0);
    ck_assert(m->memory_plan);
    ck_assert_uint_eq(d.mem_cur - base, m->alloc_bytes);
    int nb = 2 * (m->n_acts - 2); /* the logits (the last activation) live apart, all step */
    struct { size_t off; int born, dies; } *b = malloc(nb * sizeof *b);
    for (int a = 1; a < m->n_acts - 1; a++) {
        const Activation *A = &m->acts[a];
        ck_assert(A->bytes >= (size_t)batch * A->c * A->h * A->w * precision_bytes(&d, p));
        ck_assert((char *)A->x == (char *)m->arena + A->x_off && (char *)A->dx == (char *)m->arena + A->dx_off);
        b[2 * a - 2].off = A->x_off, b[2 * a - 2].born = A->x_born, b[2 * a - 2].dies = A->x_dies;
        b[2 * a - 1].off = A->dx_off, b[2 * a - 1].born = A->dx_born, b[2 * a - 1].dies = A->dx_dies;
    }
    int aliases = 0;
    for (int i = 0; i < nb; i++) {
        size_t bi = m->acts[i / 2 + 1].bytes;
        ck_assert(b[i].off % 512 == 0 && b[i].off + bi <= m->arena_bytes);
        ck_assert(0 <= b[i].born && b[i].born <= b[i].dies && b[i].dies < m->plan_steps);
        for (int j = 0; j < i; j++) {
            size_t bj = m->acts[j / 2 + 1].bytes;
            int together = b[i].born <= b[j].dies && b[j].born <= b[i].dies;
            int share = b[i].off < b[j].off + bj && b[j].off < b[i].off + bi;
            /* the one sharing allowed: an add's d(in) IS its d(out), which dies as d(in) is born */
            const Activation *Ai = &m->acts[i / 2 + 1], *Aj = &m->acts[j / 2 + 1];
            if (i % 2 && j % 2 && (Ai->dx_alias == j / 2 + 1 || Aj->dx_alias == i / 2 + 1)) {
                ck_assert(b[i].off == b[j].off && (b[i].born == b[j].dies || b[j].born == b[i].dies));
                aliases++;
                continue;
            }
            ck_assert_msg(!(together && share), "%s: buffers %d and %d overlap while both alive", arch, i, j);
        }
    }
    int adds = 0;
    for (int l = 0; l < m->n_layers; l++) adds += m->layers[l].kind == LAYER_ADD;
    ck_assert_int_eq(aliases, adds); /* every add passes its gradient on to its first operand */
    ck_assert(m->arena_bytes >= m->live_peak_bytes && m->arena_bytes <= m->live_peak_bytes * 1.05);
    ck_assert(m->arena_bytes < 0.6 * m->unplanned_bytes);
    train_step(m, batch, x, y);
    ck_assert_uint_eq(d.mem_peak - base, m->alloc_bytes);
    char desc[160], want[48];
    model_describe(m, desc, sizeof desc);
    snprintf(want, sizeof want, "activations %.1f MiB planned", m->arena_bytes / 1048576.0);
    ck_assert_msg(strstr(desc, want), "'%s' does not say '%s'", desc, want);
    printf("memory plan %s batch %d %s: arena %zu bytes (most alive at once %zu, unplanned %zu); model %zu bytes\n",
           arch, batch, precision_name(p), m->arena_bytes, m->live_peak_bytes, m->unplanned_bytes, m->alloc_bytes);
    free(b), free(x);
    model_destroy(m);
    ck_assert_uint_eq(d.mem_cur, base);
    device_destroy(&d);
}

/* The account's unit (device.h): a request is charged rounded up to 512 bytes, at least 512, as
 * PyTorch's caching allocator hands out blocks — so a peak compares with max_memory_allocated. The
 * memory-plan test checks the model's bytes against the device's, both through device_alloc_size:
 * a rounding one block too high everywhere passed it. Here the sizes themselves, and what an
 * allocation, a free and a peak reset do to the account. */
START_TEST(device_account_rounds_to_512_bytes) {
    const size_t sizes[][2] = {{0, 512}, {1, 512}, {511, 512}, {512, 512}, {513, 1024}, {1024, 1024},
                               {1025, 1536}, {1048576, 1048576}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        ck_assert_msg(device_alloc_size(sizes[i][0]) == sizes[i][1], "%zu bytes accounted as %zu, not %zu",
                      sizes[i][0], device_alloc_size(sizes[i][0]), sizes[i][1]);
    Device d = cpu();
    const size_t base = d.mem_cur;
    void *a = device_alloc(&d, 512, "a"), *b = device_alloc(&d, 513, "b"), *c = device_alloc(&d, 0, "c");
    ck_assert_uint_eq(d.mem_cur - base, 512 + 1024 + 512);
    ck_assert_uint_eq(d.mem_peak, d.mem_cur);
    device_free(&d, b);
    ck_assert_uint_eq(d.mem_cur - base, 512 + 512);
    ck_assert_uint_eq(d.mem_peak - base, 512 + 1024 + 512); /* the peak stays */
    device_reset_peak(&d); /* torch.cuda.reset_peak_memory_stats: the peak restarts at what is in use */
    ck_assert_uint_eq(d.mem_peak, d.mem_cur);
    device_free(&d, a), device_free(&d, c);
    ck_assert_uint_eq(d.mem_cur, base);
    device_destroy(&d);
}
END_TEST

START_TEST(memory_plan_is_sound_and_accounted) {
    setenv("MODEL_MEMORY_PLAN", "1", 1); /* the default, whatever the environment says */
    check_plan("tiny", 4, PREC_FP32);
    check_plan("tiny", 4, PREC_FP16);
    check_plan("resnet18", 2, PREC_FP32);
}
END_TEST

/* The figures, pinned and derived by hand. On the CPU backend (4-byte elements) the most bytes alive
 * at once come at the backward of the last block's second batch norm: everything backward still
 * needs — the stem conv's output and its ReLU'd output, then per block conv1's output, the ReLU'd
 * inner activation, conv2's output, the shortcut conv's output (strided blocks only) and the
 * block's output — less the last block's output (its ReLU's backward was its last reader), plus
 * three gradients of the last block's size: the one batch norm reads (the add's output gradient,
 * passed on in place), the one it writes, and the add's other operand's, waiting for its
 * convolution. The logits and their gradient live outside the arena. Both arenas reach that bound
 * exactly. Unplanned, the arena is every x and dx side by side (derived below). */
START_TEST(memory_plan_figures_are_pinned) {
    setenv("MODEL_MEMORY_PLAN", "1", 1); /* the default, whatever the environment says */
    Device d = cpu();
    Model *t = model_create(&d, "tiny", 1, 4, 0), *r = model_create(&d, "resnet18", 1, 2, 0);
    setenv("MODEL_MEMORY_PLAN", "0", 1);
    Model *tu = model_create(&d, "tiny", 1, 4, 0), *ru = model_create(&d, "resnet18", 1, 2, 0);
    setenv("MODEL_MEMORY_PLAN", "1", 1);
    ck_assert(!tu->memory_plan && !ru->memory_plan);
    /* per sample, in floats: tensors of 64·32·32 (stem, layer1), 128·16·16, 256·8·8, 512·4·4 */
    size_t r18 = 2 * 4 * ((size_t)(2 + 4 + 4) * 64 * 32 * 32 + (5 + 4) * 128 * 16 * 16 +
                          (5 + 4) * 256 * 8 * 8 + (5 + 4 - 1 + 3) * 512 * 4 * 4);
    ck_assert_uint_eq(r->live_peak_bytes, r18);
    ck_assert_uint_eq(r->arena_bytes, r18);
    /* tiny: 16·32·32 (stem), one strided block of 32·16·16, one of 64·8·8 */
    size_t tiny = 4 * 4 * ((size_t)2 * 16 * 32 * 32 + 5 * 32 * 16 * 16 + (5 - 1 + 3) * 64 * 8 * 8);
    ck_assert_uint_eq(t->live_peak_bytes, tiny);
    ck_assert_uint_eq(t->arena_bytes, tiny);
    /* Unplanned: every x and its dx side by side, per sample — the stem's conv and batch norm; per
     * block conv1, bn1, conv2, bn2 and the add, plus the shortcut's conv and bn in strided blocks
     * (resnet18: 2 + 2·5 at 64·32·32, then 7 + 5 per stage; tiny: 2, then 7 per block); the pooled
     * features (512, 64). The logits stay outside, as planned. */
    size_t r18u = 2 * 2 * 4 * ((size_t)(2 + 10) * 64 * 32 * 32 + 12 * 128 * 16 * 16 + 12 * 256 * 8 * 8 +
                               12 * 512 * 4 * 4 + 512);
    size_t tinyu = 2 * 4 * 4 * ((size_t)2 * 16 * 32 * 32 + 7 * 32 * 16 * 16 + 7 * 64 * 8 * 8 + 64);
    ck_assert_uint_eq(ru->unplanned_bytes, r18u);
    ck_assert_uint_eq(tu->unplanned_bytes, tinyu);
    ck_assert_uint_eq(tu->arena_bytes, tu->unplanned_bytes);
    ck_assert_uint_eq(ru->arena_bytes, ru->unplanned_bytes);
    ck_assert_uint_eq(tu->unplanned_bytes, t->unplanned_bytes);
    printf("memory plan, planned / unplanned: tiny batch 4 %zu / %zu bytes, resnet18 batch 2 %zu / %zu bytes\n",
           t->arena_bytes, tu->arena_bytes, r->arena_bytes, ru->arena_bytes);
    model_destroy(t), model_destroy(r), model_destroy(tu), model_destroy(ru);
    device_destroy(&d);
}
END_TEST

/* The plan changes where tensors live, never a value: planned and unplanned models (same seed)
 * give bit-identical logits, parameter gradients and BN running statistics over two training
 * steps and an evaluation forward — fp32 and the 16-bit emulation, with and without batch norm.
 * The planned model fills each tensor with NaN as its planned life ends (MODEL_PLAN_POISON), so a
 * read past it cannot pass by luck: the bytes it would read are NaN, not a value that survived. */
static void check_plan_bitwise_fused(const char *arch, int norm_bn, int batch, Precision p, int fuse) {
    Device d = cpu();
    float *x = random_batch(batch, 22);
    int32_t y[8] = {2, 7, 1, 8, 2, 8, 1, 8};
    Model *m[2];
    for (int v = 0; v < 2; v++) {
        if (v) setenv("MODEL_MEMORY_PLAN", "0", 1);
        if (fuse && !v) setenv("MODEL_FUSE_RELU", "1", 1); /* the planned model's ReLUs fused, as on CUDA */
        if (!v) setenv("MODEL_PLAN_POISON", "1", 1); /* a read past a planned death reads NaN */
        m[v] = model_create_mixed(&d, arch, norm_bn, batch, 5, p, 0);
        setenv("MODEL_MEMORY_PLAN", "1", 1);
        unsetenv("MODEL_FUSE_RELU"), unsetenv("MODEL_PLAN_POISON");
        ck_assert_int_eq(m[v]->plan_poison, !v);
        ck_assert_int_eq(m[v]->memory_plan, !v);
        int fused = 0;
        for (int l = 0; l < m[v]->n_layers; l++) fused += m[v]->layers[l].fuse_relu;
        ck_assert_msg(v || (fuse ? fused > 0 : fused == 0), "%s: %d ReLUs fused", arch, fused);
        for (int step = 0; step < 2; step++) train_step(m[v], batch, x, y);
    }
    ck_assert(m[0]->arena_bytes < m[1]->arena_bytes);
    int64_t np = m[0]->n_param_floats, nb = m[0]->n_buffer_floats;
    ck_assert(!memcmp(model_logits(m[0]), model_logits(m[1]), (size_t)batch * 10 * sizeof(float)));
    ck_assert_msg(!memcmp(m[0]->grad_flat, m[1]->grad_flat, np * sizeof(float)), "%s %s: gradients differ", arch,
                  precision_name(p));
    ck_assert(!memcmp(m[0]->buffer_flat, m[1]->buffer_flat, nb * sizeof(float)));
    for (int v = 0; v < 2; v++) model_forward(m[v], batch, x, 0);
    ck_assert(!memcmp(model_logits(m[0]), model_logits(m[1]), (size_t)batch * 10 * sizeof(float)));
    model_destroy(m[0]), model_destroy(m[1]);
    free(x);
    device_destroy(&d);
}

static void check_plan_bitwise(const char *arch, int norm_bn, int batch, Precision p) {
    check_plan_bitwise_fused(arch, norm_bn, batch, p, 0);
}

START_TEST(memory_plan_changes_no_bit) {
    setenv("MODEL_MEMORY_PLAN", "1", 1); /* the default, whatever the environment says */
    check_plan_bitwise("tiny", 1, 4, PREC_FP32);
    check_plan_bitwise("tiny", 0, 4, PREC_FP32);
    check_plan_bitwise("tiny", 1, 4, PREC_FP16);
    check_plan_bitwise("tiny", 1, 4, PREC_BF16);
    check_plan_bitwise("resnet18", 1, 2, PREC_FP32);
    /* CUDA's fused BN + ReLU and add + ReLU (MODEL_FUSE_RELU runs them on the CPU): the plan keeps each
     * fused op's output for its backward's mask, and the values are the unfused, unplanned model's */
    check_plan_bitwise_fused("tiny", 1, 4, PREC_FP16, 1);
    check_plan_bitwise_fused("tiny", 0, 4, PREC_BF16, 1);
    check_plan_bitwise_fused("resnet18", 1, 2, PREC_BF16, 1);
}
END_TEST

/* Autocast's weight gradients reach .grad in batches (model.c, wgrad_flush): one backward that
 * batches as it likes and one that stops after every layer (a hook stop at each parameter: every
 * stretch then flushes alone) must leave the same bits in .grad — two backwards each, the second
 * accumulating — and wgrad_lp zero behind them. CPU emulation, fp16 and bf16, tiny and ResNet-18. */
static void no_hook(void *ctx, int p) { (void)ctx, (void)p; }
static void check_wgrad_batches(const char *arch, int batch, Precision p) {
    Device d = cpu();
    float *x = random_batch(batch, 31);
    int32_t y[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    Model *m[2];
    for (int v = 0; v < 2; v++) {
        m[v] = model_create_mixed(&d, arch, 1, batch, 9, p, 0);
        ck_assert_ptr_nonnull(m[v]->wgrad_lp);
        if (v) {
            unsigned char *stop = malloc((size_t)m[v]->n_params);
            memset(stop, 1, (size_t)m[v]->n_params);
            model_set_hook_stops(m[v], stop);
            free(stop);
        }
        for (int k = 0; k < 2; k++) /* the second backward adds into the first's gradients */
            train_step_hooked(m[v], batch, x, y, v ? no_hook : NULL);
        for (int64_t i = 0; i < m[v]->wgrad_cap; i++)
            ck_assert_msg(((float *)m[v]->wgrad_lp)[i] == 0.f, "%s %s: wgrad_lp[%lld] left non-zero", arch,
                          precision_name(p), (long long)i);
    }
    ck_assert_msg(!memcmp(m[0]->grad_flat, m[1]->grad_flat, (size_t)m[0]->n_param_floats * sizeof(float)),
                  "%s %s: batched weight-gradient casts change .grad", arch, precision_name(p));
    model_destroy(m[0]), model_destroy(m[1]);
    free(x);
    device_destroy(&d);
}

START_TEST(autocast_weight_gradients_batch_without_a_bit_changed) {
    check_wgrad_batches("tiny", 4, PREC_FP16);
    check_wgrad_batches("tiny", 4, PREC_BF16);
    check_wgrad_batches("resnet18", 2, PREC_FP16);
}
END_TEST

/* A GPU test's batch: n images uniform in [−2, 2) from seed (host copy x, device copy xg), labels
 * (i·a + b) mod 10 (y, yg), and device slots for the loss and the correct count. */
typedef struct GpuBatch {
    float *x, *xg, *loss;
    int32_t y[64], *yg, *correct;
} GpuBatch;
static GpuBatch gpu_batch(Device *g, int n, uint64_t seed, int a, int b) {
    GpuBatch B;
    ck_assert(n <= 64);
    B.x = malloc((size_t)n * 3072 * sizeof(float));
    for (int i = 0; i < n; i++) B.y[i] = (i * a + b) % 10;
    test_fill_uniform(B.x, (int64_t)n * 3072, seed, -2, 2);
    B.xg = device_alloc(g, (size_t)n * 3072 * 4, "x");
    B.yg = device_alloc(g, (size_t)n * sizeof(int32_t), "y");
    B.loss = device_alloc(g, 4, "loss");
    B.correct = device_alloc(g, 4, "correct");
    device_copy_h2d(g, B.xg, B.x, (size_t)n * 3072 * 4);
    device_copy_h2d(g, B.yg, B.y, (size_t)n * sizeof(int32_t));
    return B;
}

/* The CUDA model against the CPU model: same weights, same batch (TF32 off, so plain fp32). */
START_TEST(cuda_model_matches_cpu_model) {
    if (!test_have_gpu("model: CUDA forward/backward vs CPU")) return;
    Device c = cpu(), g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    int n = 16;
    Model *mc = model_create(&c, "tiny", 1, n, 3), *mg = model_create(&g, "tiny", 1, n, 3);
    GpuBatch B = gpu_batch(&g, n, 9, 7, 0);
    float *x = B.x, *xg = B.xg, *lossg = B.loss;
    int32_t *y = B.y, *yg = B.yg, *corrg = B.correct;
    float lossc;
    int32_t corrc;
    model_forward(mc, n, x, 1);
    xent_forward_backward(&c, n, 10, model_logits(mc), y, 1.0f / n, &lossc, &corrc, model_dlogits(mc));
    model_backward(mc, n, NULL, NULL);
    model_forward(mg, n, xg, 1);
    xent_forward_backward(&g, n, 10, model_logits(mg), yg, 1.0f / n, lossg, corrg, model_dlogits(mg));
    model_backward(mg, n, NULL, NULL);
    int64_t np = mc->n_param_floats;
    float *gg = malloc(np * sizeof(float)), lg;
    model_read_oihw(mg, mg->grad_flat, gg); /* channels-last by default: conv gradients KRSC inside */
    device_copy_d2h(&g, &lg, lossg, 4);
    ck_assert_msg(fabsf(lg - lossc) < 1e-5f * fabsf(lossc), "loss gpu %g cpu %g", lg, lossc);
    double err = test_rel_err(gg, mc->grad_flat, np);
    ck_assert_msg(err < 1e-4, "gradients differ: relative error %g", err);
    free(gg), free(x);
    model_destroy(mc), model_destroy(mg);
    device_destroy(&c), device_destroy(&g);
}
END_TEST

/* Under autocast the CUDA model (16-bit activations, cuDNN/cuBLAS/our kernels; NCHW and
 * channels-last) against the CPU backend's emulation: same weights, same batch. Every op of both rounds the same fp32 values at the
 * same points, so they differ only where fp32 summation order flips a rounding (≤ 1 ulp of the type
 * in an element). Forward keeps that at ~u: the logits within 4u (norm-wise). Backward amplifies
 * relative differences through batch norm (test_amp.c: ~50u from rounding itself at this batch
 * size), and flips are rarer than roundings: the gradients within 50u. fp16 runs with the loss
 * scaled by 2^16, as the GradScaler does. Also: the activations really are 16 bits — the model's
 * activation memory is half of the fp32 model's (to 1%). */
START_TEST(cuda_mixed_model_matches_cpu_emulation) {
    if (!test_have_gpu("model: CUDA autocast forward/backward vs CPU emulation")) return;
    Device c = cpu(), g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    int major, bf16 = amp_bf16_supported(&g, &major);
    int n = 16;
    GpuBatch B = gpu_batch(&g, n, 9, 7, 0);
    float *x = B.x, *xg = B.xg, *lossg = B.loss;
    int32_t *y = B.y, *yg = B.yg, *corrg = B.correct;
    for (int run = 0; run < 4; run++) {
        Precision p = (Precision)(1 + run / 2);
        int cl = run % 2; /* the CUDA model also in channels-last; the emulation is always NCHW */
        if (p == PREC_BF16 && !bf16) {
            printf("SKIP: bf16 model — compute capability %d.x < 8.0\n", major);
            continue;
        }
        double u = p == PREC_FP16 ? 1.0 / 2048 : 1.0 / 256;
        float S = p == PREC_FP16 ? 65536.0f : 1.0f, lossc;
        int32_t corrc;
        Model *mc = model_create_mixed(&c, "tiny", 1, n, 3, p, 0), *mg = model_create_mixed(&g, "tiny", 1, n, 3, p, cl);
        ck_assert_int_eq(mg->channels_last, cl);
        model_forward(mc, n, x, 1);
        xent_forward_backward(&c, n, 10, model_logits(mc), y, 1.0f / n, &lossc, &corrc, model_dlogits(mc));
        scale_inplace(&c, n * 10, model_dlogits(mc), S);
        model_backward(mc, n, NULL, NULL);
        model_forward(mg, n, xg, 1);
        xent_forward_backward(&g, n, 10, model_logits(mg), yg, 1.0f / n, lossg, corrg, model_dlogits(mg));
        scale_inplace(&g, n * 10, model_dlogits(mg), S);
        model_backward(mg, n, NULL, NULL);
        int64_t np = mc->n_param_floats;
        float *gg = malloc(np * sizeof(float)), lg, logits[160];
        model_read_oihw(mg, mg->grad_flat, gg); /* the CPU model's (PyTorch's) order */
        device_copy_d2h(&g, &lg, lossg, 4);
        device_copy_d2h(&g, logits, model_logits(mg), sizeof logits);
        double el = test_rel_err(logits, model_logits(mc), n * 10), eg = test_rel_err(gg, mc->grad_flat, np);
        printf("model %s%s, CUDA vs CPU emulation: logits %.2e (%.1fu), gradients %.2e (%.1fu)\n", precision_name(p),
               cl ? " channels-last" : "", el, el / u, eg, eg / u);
        ck_assert_msg(fabsf(lg - lossc) < 4 * u * fabsf(lossc), "loss gpu %g cpu %g", lg, lossc);
        ck_assert_msg(el < 4 * u, "logits differ: %g", el);
        ck_assert_msg(eg < 50 * u, "gradients differ: %g", eg);
        free(gg);
        model_destroy(mc), model_destroy(mg);
    }
    /* memory: ResNet-18 at batch 64, fp32 vs fp16 activations */
    size_t base = g.mem_cur;
    Model *m32 = model_create_mixed(&g, "resnet18", 1, 64, 0, PREC_FP32, 0); /* NCHW: no weight copies */
    size_t d32 = g.mem_cur - base;
    model_destroy(m32);
    base = g.mem_cur;
    Model *m16 = model_create_mixed(&g, "resnet18", 1, 64, 0, PREC_FP16, 0);
    size_t d16 = g.mem_cur - base;
    double params = 2.0 * m16->n_param_floats * 4; /* fp32 parameters + gradients, in both */
    double extra = m16->n_param_floats * 2.0 + 64.0 * 3072 * 2 + 2 * 64 * 10 * 4; /* weight copies, input, logits */
    int64_t most = 0;
    for (int i = 0; i < m16->n_params; i++)
        if (m16->params[i].count > most) most = m16->params[i].count;
    extra += most * 2.0 + 8192; /* one weight gradient (+ bias) */
    double acts32 = d32 - params, acts16 = d16 - params - extra;
    printf("resnet18 batch 64 on CUDA: fp32 model %.1f MiB, fp16 model %.1f MiB; activations %.1f -> %.1f MiB\n",
           d32 / 1048576.0, d16 / 1048576.0, acts32 / 1048576.0, acts16 / 1048576.0);
    ck_assert_msg(fabs(acts16 - acts32 / 2) < 0.01 * acts32, "activation memory %.0f is not half of %.0f", acts16,
                  acts32);
    model_destroy(m16);
    free(x);
    device_destroy(&c), device_destroy(&g);
}
END_TEST

/* The bytes of the device's batch-norm scratch (0 before the first model asks for it). */
#define BN_SCRATCH(g) ((g).bn_scratch ? device_alloc_size((g).bn_scratch_bytes) : 0)

/* On the GPU the plan also holds every convolution's cuDNN workspace (one slot for its forward step,
 * one for its backward step): after model_prepare a training step uses no shared device workspace
 * at all, allocates nothing, the model holds exactly what it says, and — same deterministic algorithms — gives
 * bit-identical logits and gradients to the unplanned model (MODEL_MEMORY_PLAN=0: every tensor all
 * step, one shared workspace). ResNet-18 at batch 32, fp32 NCHW and fp16 channels-last. */
START_TEST(cuda_memory_plan_holds_workspaces) {
    setenv("MODEL_MEMORY_PLAN", "1", 1); /* the default, whatever the environment says */
    if (!test_have_gpu("model: the memory plan on CUDA (workspaces in the arena)")) return;
    Device g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    const int n = 32;
    GpuBatch B = gpu_batch(&g, n, 23, 3, 0);
    float *x = B.x, *xg = B.xg, *lossg = B.loss;
    int32_t *yg = B.yg, *corrg = B.correct;
    for (int run = 0; run < 2; run++) {
        Precision p = run ? PREC_FP16 : PREC_FP32;
        int cl = run;
        float *grads[2], *logits[2];
        size_t arena[2], ws[2];
        int64_t np = 0;
        for (int v = 0; v < 2; v++) {
            if (v) setenv("MODEL_MEMORY_PLAN", "0", 1);
            /* the device's batch-norm scratch (ops.h: bn_prepare) may grow: it is the device's, not the model's */
            size_t base = g.mem_cur - BN_SCRATCH(g), ws0 = g.workspace_bytes;
            Model *m = model_create_mixed(&g, "resnet18", 1, n, 7, p, cl);
            setenv("MODEL_MEMORY_PLAN", "1", 1);
            model_prepare(m, n);
            device_sync(&g);
            device_reset_peak(&g); /* re-planning freed and reallocated the arena: measure the step alone */
            model_forward(m, n, xg, 1);
            xent_forward_backward(&g, n, 10, model_logits(m), yg, 1.0f / n, lossg, corrg, model_dlogits(m));
            model_backward(m, n, NULL, NULL);
            device_sync(&g);
            np = m->n_param_floats;
            grads[v] = malloc(np * sizeof(float)), logits[v] = malloc(n * 10 * sizeof(float));
            device_copy_d2h(&g, grads[v], m->grad_flat, np * sizeof(float));
            device_copy_d2h(&g, logits[v], model_logits(m), n * 10 * sizeof(float));
            arena[v] = m->arena_bytes, ws[v] = g.workspace_bytes;
            if (v == 0) {
                ck_assert_msg(g.workspace_bytes == ws0, "the planned step grew the shared workspace %zu -> %zu", ws0,
                              g.workspace_bytes);
                ck_assert_uint_eq(g.mem_peak, g.mem_cur); /* the step allocated nothing */
                ck_assert_uint_eq(g.mem_cur - BN_SCRATCH(g) - base, m->alloc_bytes);
            }
            model_destroy(m);
        }
        printf("resnet18 batch %d %s%s on CUDA: arena %.1f MiB planned (workspaces inside) vs %.1f MiB + %.1f MiB "
               "shared workspace unplanned\n", n, precision_name(p), cl ? " channels-last" : "", arena[0] / 1048576.0,
               arena[1] / 1048576.0, ws[1] / 1048576.0);
        ck_assert_msg(!memcmp(logits[0], logits[1], n * 10 * sizeof(float)), "logits differ");
        ck_assert_msg(!memcmp(grads[0], grads[1], np * sizeof(float)), "gradients differ");
        ck_assert(arena[0] < arena[1]);
        for (int v = 0; v < 2; v++) free(grads[v]), free(logits[v]);
    }
    /* --cudnn-benchmark: the search's buffers come and go inside model_prepare; the step still
     * uses only the arena's workspaces and allocates nothing */
    g.benchmark = 1;
    size_t base = g.mem_cur, ws0 = g.workspace_bytes;
    Model *m = model_create(&g, "resnet18", 1, n, 7);
    model_prepare(m, n);
    device_sync(&g);
    ck_assert_uint_eq(g.mem_cur - base, m->alloc_bytes);
    device_reset_peak(&g);
    model_forward(m, n, xg, 1);
    xent_forward_backward(&g, n, 10, model_logits(m), yg, 1.0f / n, lossg, corrg, model_dlogits(m));
    model_backward(m, n, NULL, NULL);
    device_sync(&g);
    ck_assert_uint_eq(g.mem_peak, g.mem_cur);
    ck_assert_uint_eq(g.workspace_bytes, ws0);
    printf("resnet18 batch %d fp32 --cudnn-benchmark on CUDA: arena %.1f MiB planned\n", n, m->arena_bytes / 1048576.0);
    model_destroy(m);
    free(x);
    device_destroy(&g);
}
END_TEST

/* CUDA graphs (graph.h) replay exactly what the eager step launches: a ResNet-18 model with graphs
 * and one without, same seed, same deterministic algorithms, trained 5 steps on two alternating
 * input buffers (the input pipe's double buffer) with SGD in between, then 3 of a short last batch
 * on the same buffers and 3 full ones again (both sizes prepared at setup, as the stages do, so both
 * sizes' graphs share the cache: one keyed without the batch size replays the full batch's for the
 * short one, as they read the same input buffer), give bit-identical logits
 * and gradients at every step and fire the gradient hooks in the same order — fp32 NCHW (the plain
 * walk, whose first conv reads the input buffer in backward), fp32 channels-last and fp16
 * channels-last, the last two with backward stopping for the hook only at every 7th parameter
 * (model_set_hook_stops). The graphed model must really have captured and replayed graphs; the eager one
 * none. */
typedef struct HookLog { int order[256], count; } HookLog;
static void log_hook(void *ctx, int p) {
    HookLog *h = ctx;
    if (h->count < 256) h->order[h->count] = p;
    h->count++;
}

START_TEST(cuda_graphs_replay_the_eager_step) {
    if (!test_have_gpu("model: CUDA graphs replay the eager step bit for bit")) return;
    Device g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    const int n = 16;
    float *x = malloc((size_t)2 * n * 3072 * sizeof(float));
    int32_t y[16];
    for (int i = 0; i < n; i++) y[i] = (i * 7) % 10;
    test_fill_uniform(x, (int64_t)2 * n * 3072, 29, -2, 2);
    float *xg[2] = {device_alloc(&g, (size_t)n * 3072 * 4, "x0"), device_alloc(&g, (size_t)n * 3072 * 4, "x1")};
    int32_t *yg = device_alloc(&g, sizeof y, "y");
    float *lossg = device_alloc(&g, 4, "loss");
    int32_t *corrg = device_alloc(&g, 4, "correct");
    device_copy_h2d(&g, xg[0], x, (size_t)n * 3072 * 4);
    device_copy_h2d(&g, xg[1], x + (size_t)n * 3072, (size_t)n * 3072 * 4);
    device_copy_h2d(&g, yg, y, sizeof y);
    const struct { Precision p; int cl; } cfg[3] = {{PREC_FP32, 0}, {PREC_FP32, 1}, {PREC_FP16, 1}};
    for (int c = 0; c < 3; c++) {
        Model *m[2];
        Optimizer opt[2];
        for (int v = 0; v < 2; v++) { /* v = 0: graphs (the default); v = 1: eager */
            model_default_graphs(v == 0);
            m[v] = model_create_mixed(&g, "resnet18", 1, n, 11, cfg[c].p, cfg[c].cl);
            model_prepare(m[v], n);
            model_prepare(m[v], n - 4); /* every batch size at setup, as the stages do */
            if (v == 0 && c > 0) { /* and with stops every 7th parameter, as DDP's buckets make them */
                unsigned char stop[256] = {0};
                for (int p = 0; p < m[v]->n_params; p += 7) stop[p] = 1;
                model_set_hook_stops(m[v], stop);
            }
            optim_init(&opt[v], &g, m[v]->n_param_floats, 0.05, 0.9, 5e-4);
        }
        model_default_graphs(1);
        const int64_t np = m[0]->n_param_floats;
        float *gr[2] = {malloc(np * 4), malloc(np * 4)}, *lg[2] = {malloc(n * 40), malloc(n * 40)};
        for (int step = 0; step < 11; step++) {
            /* steps 5–7: an epoch's short last batch, on the same two input buffers, then the next
             * epoch's full ones: a graph of one batch size is never replayed for the other */
            const int b = step >= 5 && step < 8 ? n - 4 : n;
            HookLog h[2] = {0};
            for (int v = 0; v < 2; v++) {
                model_zero_grad(m[v]);
                model_forward(m[v], b, xg[step % 2], 1);
                xent_forward_backward(&g, b, 10, model_logits(m[v]), yg, 1.0f / b, lossg, corrg, model_dlogits(m[v]));
                model_backward(m[v], b, log_hook, &h[v]);
                device_copy_d2h(&g, gr[v], m[v]->grad_flat, np * 4);
                device_copy_d2h(&g, lg[v], model_logits(m[v]), b * 40);
                optim_step(&opt[v], m[v]->param_flat, m[v]->grad_flat, 0.05);
            }
            ck_assert_msg(!memcmp(lg[0], lg[1], b * 40), "config %d step %d (batch %d): logits differ", c, step, b);
            ck_assert_msg(!memcmp(gr[0], gr[1], np * 4), "config %d step %d (batch %d): gradients differ", c, step, b);
            ck_assert_int_eq(h[0].count, m[0]->n_params);
            ck_assert_int_eq(h[0].count, h[1].count);
            ck_assert(!memcmp(h[0].order, h[1].order, sizeof h[0].order));
        }
        printf("resnet18 %s%s: %lld graphs captured, %lld replays; the eager model %lld\n",
               precision_name(cfg[c].p), cfg[c].cl ? " channels-last" : "", (long long)m[0]->graphs.captures,
               (long long)m[0]->graphs.replays, (long long)m[1]->graphs.captures);
        ck_assert(m[0]->graphs.captures > 0 && m[0]->graphs.replays > 0);
        ck_assert(m[1]->graphs.captures == 0 && m[1]->graphs.replays == 0);
        for (int v = 0; v < 2; v++) free(gr[v]), free(lg[v]), optim_destroy(&opt[v]), model_destroy(m[v]);
    }
    free(x);
    device_destroy(&g);
}
END_TEST

/* The first backward after zero_grad writes the fp32 conv weight gradients (cuDNN beta = 0), later
 * ones add (beta = 1): a backward graph is captured for each, so gradient accumulation must not
 * replay the writing one. Tiny model without batch norm (two identical passes), fp32 channels-last,
 * graphs and eager, with and without hook stops: after two backwards every gradient is twice the
 * first's, and each cycle's first backward gives the same bits. Cycle 0 is a step without
 * accumulation, so the writing backward is captured (cycle 1) before any adding one has run: a
 * cache that told the two apart by input and batch size alone then replayed it for the second pass
 * (once, not twice) — with the adding one captured first, writing where zeros are gives the same
 * bits and hid that. Then both are replayed (cycles 2, 3). */
START_TEST(cuda_first_backward_writes_later_ones_add) {
    if (!test_have_gpu("model: the first backward after zero_grad writes, the next adds")) return;
    Device g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    const int n = 8;
    GpuBatch B = gpu_batch(&g, n, 37, 3, 1);
    for (int v = 0; v < 4; v++) { /* v & 1: eager; v & 2: backward stops at every 3rd parameter */
        model_default_graphs(!(v & 1));
        Model *m = model_create(&g, "tiny", 0, n, 13);
        model_default_graphs(1);
        if (v & 2) {
            unsigned char stop[64] = {0};
            for (int p = 0; p < m->n_params; p += 3) stop[p] = 1;
            model_set_hook_stops(m, stop);
        }
        const int64_t np = m->n_param_floats;
        float *once = malloc(np * 4), *twice = malloc(np * 4), *first = malloc(np * 4);
        for (int cycle = 0; cycle < 4; cycle++) { /* writing: eager, captured, replayed; adding: eager from 1 */
            HookLog h = {0};
            model_zero_grad(m);
            for (int pass = 0; pass < (cycle ? 2 : 1); pass++) {
                model_forward(m, n, B.xg, 1);
                xent_forward_backward(&g, n, 10, model_logits(m), B.yg, 1.0f / n, B.loss, B.correct, model_dlogits(m));
                model_backward(m, n, (v & 2) ? log_hook : NULL, &h);
                device_copy_d2h(&g, pass ? twice : once, m->grad_flat, np * 4);
            }
            for (int64_t i = 0; i < np && cycle; i++)
                ck_assert_msg(fabsf(twice[i] - 2 * once[i]) <= 1e-6f * fabsf(once[i]),
                              "variant %d cycle %d: grad[%lld] %g after two backwards, %g after one", v, cycle,
                              (long long)i, twice[i], once[i]);
            if (cycle == 0) memcpy(first, once, np * 4);
            ck_assert_msg(!memcmp(first, once, np * 4), "variant %d cycle %d: the first backward changed", v, cycle);
        }
        if (!(v & 1)) ck_assert(m->graphs.captures > 0 && m->graphs.replays > 0);
        free(once), free(twice), free(first);
        model_destroy(m);
    }
    free(B.x);
    device_destroy(&g);
}
END_TEST

/* ---- the public order (model.h): conv weights OIHW outside, KRSC inside a channels-last model --- */

/* The per-tensor reorder against a hand-written example, and both ways as each other's inverse. */
START_TEST(conv_weight_reorder_matches_hand_example) {
    /* cout 2, cin 3, 2×2 kernel (kk 4); OIHW element (o, i, r) holds its own index (o·3 + i)·4 + r */
    float oihw[24], krsc[24], back[24];
    for (int i = 0; i < 24; i++) oihw[i] = (float)i;
    conv_weight_oihw_to_krsc(2, 3, 4, oihw, krsc);
    /* KRSC walks (o, r, i): for o = 0, r = 0 the three input channels 0, 4, 8; then r = 1: 1, 5, 9 … */
    const float want[24] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23};
    for (int i = 0; i < 24; i++) ck_assert_msg(krsc[i] == want[i], "KRSC[%d] = %g, want %g", i, krsc[i], want[i]);
    conv_weight_krsc_to_oihw(2, 3, 4, krsc, back);
    ck_assert(!memcmp(back, oihw, sizeof oihw));
    /* round trips on random weights of ResNet's shapes (1×1 and 3×3, cin 3 and wider) */
    const int shapes[4][3] = {{16, 3, 9}, {32, 16, 9}, {32, 16, 1}, {7, 5, 9}};
    for (int s = 0; s < 4; s++) {
        int64_t n = (int64_t)shapes[s][0] * shapes[s][1] * shapes[s][2];
        float *a = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        test_fill_uniform(a, n, 40 + s, -1, 1);
        conv_weight_oihw_to_krsc(shapes[s][0], shapes[s][1], shapes[s][2], a, k);
        conv_weight_krsc_to_oihw(shapes[s][0], shapes[s][1], shapes[s][2], k, b);
        ck_assert(!memcmp(a, b, n * sizeof(float)));
        ck_assert(shapes[s][2] == 1 || memcmp(a, k, n * sizeof(float))); /* a 1×1 kernel is the one no-op */
        free(a), free(k), free(b);
    }
}
END_TEST

/* The whole-buffer seam. On the CPU no model is channels-last (the backend keeps NCHW), so there it
 * is a copy; the host-side conversion only reads m->channels_last and the parameter table, so
 * setting the flag on a CPU model exercises exactly what a channels-last CUDA model does at its
 * boundaries: every 4-D parameter (conv weight) reordered as conv_weight_oihw_to_krsc, every other
 * one copied, in place or not, and model_write_oihw / model_read_oihw round-trip bit for bit. */
START_TEST(model_params_seam_reorders_conv_weights_only) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 2, 11);
    ck_assert(!m->channels_last);
    int64_t np = m->n_param_floats;
    size_t bytes = (size_t)np * sizeof(float);
    float *pub = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes);
    test_fill_uniform(pub, np, 12, -1, 1);
    model_params_from_oihw(m, pub, a); /* NCHW: the identity */
    ck_assert(!memcmp(a, pub, bytes));
    m->channels_last = 1;              /* the storage order of a channels-last model (see above) */
    model_params_from_oihw(m, pub, a);
    int convs = 0;
    for (int i = 0; i < m->n_params; i++) {
        const Param *q = &m->params[i];
        if (q->ndim != 4) {
            ck_assert(!memcmp(a + q->offset, pub + q->offset, q->count * sizeof(float)));
            continue;
        }
        convs++;
        float *k = malloc(q->count * sizeof(float));
        conv_weight_oihw_to_krsc(q->shape[0], q->shape[1], q->shape[2] * q->shape[3], pub + q->offset, k);
        ck_assert_msg(!memcmp(a + q->offset, k, q->count * sizeof(float)), "%s not in KRSC", q->name);
        free(k);
    }
    ck_assert_int_eq(convs, 7); /* tiny: stem, 2 × (conv1, conv2, shortcut) */
    ck_assert(memcmp(a, pub, bytes));
    memcpy(b, pub, bytes);
    model_params_from_oihw(m, b, b); /* in place */
    ck_assert(!memcmp(b, a, bytes));
    model_params_to_oihw(m, b, b);
    ck_assert(!memcmp(b, pub, bytes));
    model_params_to_oihw(m, a, b);
    ck_assert(!memcmp(b, pub, bytes));
    /* through the model's own buffers (device memory; here the CPU's) */
    model_write_oihw(m, pub, m->grad_flat);
    ck_assert(!memcmp(m->grad_flat, a, bytes)); /* stored KRSC */
    model_read_oihw(m, m->grad_flat, b);
    ck_assert(!memcmp(b, pub, bytes));
    m->channels_last = 0;
    free(pub), free(a), free(b);
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

/* One checkpoint of model m (and its optimizer's momentum) through the seam, as save.c saves. */
static void save_public(Model *m, const Optimizer *o, const char *path) {
    CheckpointMeta meta = {0};
    snprintf(meta.arch, sizeof meta.arch, "%s", m->arch);
    snprintf(meta.norm, sizeof meta.norm, "%s", m->norm_bn ? "bn" : "none");
    meta.n_params = m->n_param_floats, meta.n_buffers = m->n_buffer_floats, meta.shape_hash = m->shape_hash;
    meta.step = 1, meta.momentum_valid = 1, meta.world_size = 1, meta.accum_steps = 1, meta.batch_size = 4;
    size_t pb = (size_t)m->n_param_floats * sizeof(float), bb = (size_t)m->n_buffer_floats * sizeof(float);
    float *p = malloc(pb), *mom = malloc(pb), *buf = malloc(bb + 4);
    model_read_oihw(m, m->param_flat, p);
    model_read_oihw(m, o->momentum_buf, mom);
    device_copy_d2h(m->dev, buf, m->buffer_flat, bb);
    checkpoint_save(path, &meta, p, buf, mom, NULL);
    free(p), free(mom), free(buf);
}

/* ... and loads, as resume.c resumes. */
static void load_public(Model *m, Optimizer *o, const char *path) {
    CheckpointMeta expect = {0}, got;
    snprintf(expect.arch, sizeof expect.arch, "%s", m->arch);
    snprintf(expect.norm, sizeof expect.norm, "%s", m->norm_bn ? "bn" : "none");
    expect.n_params = m->n_param_floats, expect.n_buffers = m->n_buffer_floats, expect.shape_hash = m->shape_hash;
    size_t pb = (size_t)m->n_param_floats * sizeof(float), bb = (size_t)m->n_buffer_floats * sizeof(float);
    float *p = malloc(pb), *mom = malloc(pb), *buf = malloc(bb + 4);
    checkpoint_load(path, &expect, &got, p, buf, mom, NULL);
    model_write_oihw(m, p, m->param_flat);
    model_write_oihw(m, mom, o->momentum_buf);
    device_copy_h2d(m->dev, m->buffer_flat, buf, bb);
    device_sync(m->dev);
    free(p), free(mom), free(buf);
}

static float *raw(Device *g, const float *dev, int64_t n) {
    float *h = malloc((size_t)n * sizeof(float));
    device_copy_d2h(g, h, dev, (size_t)n * sizeof(float));
    return h;
}

/* A channels-last fp32 model against an NCHW fp32 model, same seed, on CUDA. Same initial weights
 * bit for bit in the public order (while the stored bytes differ: the conv weights really are KRSC),
 * no weight copies at all (param_lp, wgrad_lp NULL; the model holds exactly what it accounts), then
 * one training step and one SGD step: the same logits, loss, OIHW gradients and parameters. Not bit
 * for bit: TF32 is off and the algorithms deterministic, so all of it is plain fp32, but cuDNN's
 * NHWC and NCHW convolutions are different kernels summing in different orders. The CUDA-vs-CPU
 * test above holds each layout within 1e-4 of max |g| of the same exact values, so the two within
 * 2e-4 (logits 1e-4); reading KRSC as OIHW, or the reverse, is an O(1) error.
 * Then checkpoints across layouts: the channels-last model's, loaded into the NCHW model and saved
 * again, is the same file byte for byte, and loading it into a fresh channels-last model restores
 * its parameters and momentum bit for bit. */
START_TEST(cuda_channels_last_fp32_matches_nchw) {
    if (!test_have_gpu("model: channels-last fp32 (KRSC weights) vs NCHW, checkpoints across layouts")) return;
    Device g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    const int n = 16;
    GpuBatch B = gpu_batch(&g, n, 31, 3, 1);
    float *x = B.x, *xg = B.xg, *lossg = B.loss;
    int32_t *yg = B.yg, *corrg = B.correct;
    Model *m[2];
    Optimizer o[2];
    float *logits[2], *grads[2], *params[2], loss[2];
    for (int cl = 0; cl < 2; cl++) {
        size_t base = g.mem_cur - BN_SCRATCH(g);
        m[cl] = model_create_mixed(&g, "tiny", 1, n, 3, PREC_FP32, cl);
        ck_assert_int_eq(m[cl]->channels_last, cl);
        ck_assert(!m[cl]->param_lp && !m[cl]->wgrad_lp); /* fp32: cuDNN reads param_flat itself */
        ck_assert_uint_eq(g.mem_cur - BN_SCRATCH(g) - base, m[cl]->alloc_bytes);
        optim_init(&o[cl], &g, m[cl]->n_param_floats, 0.1, 0.9, 5e-4);
    }
    int64_t np = m[0]->n_param_floats;
    size_t pb = (size_t)np * sizeof(float);
    float *p0 = malloc(pb), *p1 = malloc(pb);
    model_read_oihw(m[0], m[0]->param_flat, p0);
    model_read_oihw(m[1], m[1]->param_flat, p1);
    ck_assert_msg(!memcmp(p0, p1, pb), "channels-last init differs from NCHW in PyTorch's order");
    float *r0 = raw(&g, m[0]->param_flat, np), *r1 = raw(&g, m[1]->param_flat, np);
    ck_assert_msg(memcmp(r0, r1, pb), "the channels-last model stores its conv weights OIHW");
    free(p0), free(p1), free(r0), free(r1);
    for (int cl = 0; cl < 2; cl++) {
        model_zero_grad(m[cl]);
        model_forward(m[cl], n, xg, 1);
        xent_forward_backward(&g, n, 10, model_logits(m[cl]), yg, 1.0f / n, lossg, corrg, model_dlogits(m[cl]));
        model_backward(m[cl], n, NULL, NULL);
        logits[cl] = raw(&g, model_logits(m[cl]), n * 10);
        device_copy_d2h(&g, &loss[cl], lossg, 4);
        grads[cl] = malloc(pb), params[cl] = malloc(pb);
        model_read_oihw(m[cl], m[cl]->grad_flat, grads[cl]);
        optim_step(&o[cl], m[cl]->param_flat, m[cl]->grad_flat, 0.1);
        model_read_oihw(m[cl], m[cl]->param_flat, params[cl]);
    }
    double el = test_rel_err(logits[1], logits[0], n * 10), eg = test_rel_err(grads[1], grads[0], np);
    double gmax = 0, pdiff = 0;
    for (int64_t i = 0; i < np; i++)
        gmax = test_max_nan(gmax, fabs(grads[0][i])), pdiff = test_max_nan(pdiff, fabs((double)params[1][i] - params[0][i]));
    printf("tiny fp32 channels-last vs NCHW on CUDA: logits %.2e, loss %.2e, OIHW gradients %.2e, parameters "
           "after SGD %.2e (of max|g| %.2e)\n", el, fabs(loss[1] - loss[0]) / loss[0], eg, pdiff, gmax);
    ck_assert_msg(fabsf(loss[1] - loss[0]) < 1e-5f * loss[0], "loss %g vs %g", loss[1], loss[0]);
    ck_assert_msg(el < 1e-4, "logits differ: %g", el);
    ck_assert_msg(eg < 2e-4, "OIHW gradients differ: %g", eg);
    ck_assert_msg(pdiff <= 0.1 * 2e-4 * gmax + 1e-7, "parameters differ by %g", pdiff); /* lr 0.1 */
    /* checkpoints across layouts */
    char *dir = test_tmpdir(), pa[512], pn[512];
    snprintf(pa, sizeof pa, "%s/cl.ckpt", dir);
    snprintf(pn, sizeof pn, "%s/nchw.ckpt", dir);
    save_public(m[1], &o[1], pa);
    load_public(m[0], &o[0], pa); /* into the NCHW model */
    save_public(m[0], &o[0], pn);
    long la, ln;
    char *fa = test_slurp(pa, &la), *fn = test_slurp(pn, &ln);
    ck_assert_msg(fa && fn && la == ln && !memcmp(fa, fn, (size_t)la), "the checkpoint changed through an NCHW model");
    Model *back = model_create_mixed(&g, "tiny", 1, n, 99, PREC_FP32, 1); /* other seed: load must set all */
    Optimizer ob;
    optim_init(&ob, &g, back->n_param_floats, 0.1, 0.9, 5e-4);
    load_public(back, &ob, pn);
    float *want = raw(&g, m[1]->param_flat, np), *got = raw(&g, back->param_flat, np);
    ck_assert_msg(!memcmp(want, got, pb), "parameters changed through NCHW and back");
    free(want), free(got);
    want = raw(&g, o[1].momentum_buf, np), got = raw(&g, ob.momentum_buf, np);
    ck_assert_msg(!memcmp(want, got, pb), "momentum changed through NCHW and back");
    free(want), free(got), free(fa), free(fn), free(dir);
    optim_destroy(&ob);
    model_destroy(back);
    for (int cl = 0; cl < 2; cl++) {
        free(logits[cl]), free(grads[cl]), free(params[cl]);
        optim_destroy(&o[cl]);
        model_destroy(m[cl]);
    }
    device_free(&g, xg), device_free(&g, yg), device_free(&g, lossg), device_free(&g, corrg);
    free(x);
    device_destroy(&g);
}
END_TEST

/* The CPU backend keeps no CUDA graphs (graph.h): a cache made for a CPU device, graphs asked for or
 * not, is disabled and runs every stretch eagerly, each time, capturing and replaying nothing — in a
 * CUDA build too, where an enabled cache would try to capture a CPU device's work on a stream. */
static void count_run(void *p) { (*(int *)p)++; }

/* A forward counts when model_prepare never planned its batch size — in training and in evaluation —
 * and stops counting once that size is prepared (the stages' summary reports the count). */
START_TEST(forwards_of_unprepared_sizes_are_counted) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 8, 0);
    float x[8 * 3072];
    test_fill_uniform(x, 8 * 3072, 9, -1, 1);
    model_prepare(m, 8);
    model_forward(m, 8, x, 1);
    model_forward(m, 8, x, 0);
    ck_assert_int_eq(m->unprepared_forwards, 0);
    model_forward(m, 5, x, 1);
    model_forward(m, 3, x, 0);
    ck_assert_int_eq(m->unprepared_forwards, 2);
    ck_assert_int_eq(m->unprepared_last, 3);
    model_prepare(m, 3);
    model_forward(m, 3, x, 1);
    ck_assert_int_eq(m->unprepared_forwards, 2);
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

START_TEST(cpu_keeps_no_graphs) {
    Device d = cpu();
    GraphCache c;
    graph_init(&c, &d, 1);
    ck_assert_msg(!c.enabled, "a CPU device's graph cache is enabled");
    int runs = 0;
    GraphKey k = {.n = 4};
    for (int i = 0; i < 3; i++) graph_run(&c, k, count_run, &runs);
    ck_assert_int_eq(runs, 3);
    ck_assert(c.count == 0 && c.captures == 0 && c.replays == 0);
    graph_destroy(&c);
    device_destroy(&d);
}
END_TEST

Suite *suite_model(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, resnet18_has_pytorch_parameter_count);
    tcase_add_test(tc, batch_past_32bit_indexing_is_refused);
    tcase_add_test(tc, init_follows_pytorch_defaults);
    tcase_add_test(tc, backward_plan_accumulates_at_fan_out);
    tcase_add_test(tc, grad_ready_hook_fires_once_per_parameter_in_reverse);
    tcase_add_test(tc, forwards_of_unprepared_sizes_are_counted);
    tcase_add_test(tc, device_account_rounds_to_512_bytes);
    tcase_add_test(tc, hook_stops_defer_hooks_in_order);
    tcase_add_test(tc, autocast_weight_gradients_batch_without_a_bit_changed);
    tcase_add_test(tc, gradients_accumulate_across_backwards);
    tcase_add_test(tc, eval_mode_leaves_running_stats_alone);
    tcase_add_test(tc, memory_plan_is_sound_and_accounted);
    tcase_add_test(tc, memory_plan_figures_are_pinned);
    tcase_add_test(tc, memory_plan_changes_no_bit);
    tcase_add_test(tc, cuda_model_matches_cpu_model);
    tcase_add_test(tc, cuda_mixed_model_matches_cpu_emulation);
    tcase_add_test(tc, cuda_memory_plan_holds_workspaces);
    tcase_add_test(tc, cpu_keeps_no_graphs);
    tcase_add_test(tc, cuda_graphs_replay_the_eager_step);
    tcase_add_test(tc, cuda_first_backward_writes_later_ones_add);
    tcase_add_test(tc, conv_weight_reorder_matches_hand_example);
    tcase_add_test(tc, model_params_seam_reorders_conv_weights_only);
    tcase_add_test(tc, cuda_channels_last_fp32_matches_nchw);
    suite_add_tcase(s, tc);
    return s;
}
