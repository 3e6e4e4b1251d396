/* test_model.c — the model as a whole: layout, initialisation, the backward plan, the gradient-ready
 * hook, accumulation semantics, train/eval, and (with a GPU) the CUDA model against the CPU model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp.h"
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

START_TEST(init_follows_pytorch_defaults) {
    Device d = cpu();
    Model *m = model_create(&d, "tiny", 1, 2, 123);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        float *v = m->param_flat + p->offset;
        if (p->ndim >= 2 || strstr(p->name, "linear.bias")) {
            int64_t fan_in = p->ndim >= 2 ? p->count / p->shape[0] : m->params[i - 1].count / p->count;
            double bound = 1.0 / sqrt((double)fan_in), mx = 0, mean = 0;
            for (int64_t j = 0; j < p->count; j++) mx = fmax(mx, fabs(v[j])), mean += v[j];
            ck_assert_msg(mx <= bound && mx > 0.5 * bound, "%s: max |w| %g vs bound %g", p->name, mx, bound);
            ck_assert(fabs(mean / p->count) < 0.2 * bound + bound / sqrt((double)p->count) * 3);
        } else if (strstr(p->name, "weight")) { /* batch-norm γ */
            for (int64_t j = 0; j < p->count; j++) ck_assert(v[j] == 1.0f);
        } else {
            for (int64_t j = 0; j < p->count; j++) ck_assert(v[j] == 0.0f);
        }
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

/* One training step (forward, loss, backward) of batch n on the CPU backend. */
static void train_step(Model *m, int n, const float *x, const int32_t *y) {
    float loss;
    int32_t correct;
    model_forward(m, n, x, 1);
    xent_forward_backward(m->dev, n, 10, model_logits(m), y, 1.0f / n, &loss, &correct, model_dlogits(m));
    model_backward(m, n, NULL, NULL);
}

/* The plan is sound, checked apart from the planner: every x and dx lies inside the arena, and any
 * two alive at one step of the timeline share no byte. It is also no worse than the most bytes alive
 * at one step (the bound no placement beats) by more than 5%, and far below keeping everything.
 * Then the device's account: one training step at the largest batch peaks at exactly what the
 * model says it holds (arena included, nothing allocated in the step), and the model's description
 * prints the planned arena. */
static void check_plan(const char *arch, int batch, Precision p) {
    Device d = cpu();
    float *x = malloc((size_t)batch * 3072 * sizeof(float));
    int32_t y[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    test_fill_uniform(x, (int64_t)batch * 3072, 21, -2, 2);
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
 * exactly. Unplanned, the arena is every x and dx side by side. */
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
 * steps and an evaluation forward — fp32 and the 16-bit emulation, with and without batch norm. */
static void check_plan_bitwise(const char *arch, int norm_bn, int batch, Precision p) {
    Device d = cpu();
    float *x = malloc((size_t)batch * 3072 * sizeof(float));
    int32_t y[8] = {2, 7, 1, 8, 2, 8, 1, 8};
    test_fill_uniform(x, (int64_t)batch * 3072, 22, -2, 2);
    Model *m[2];
    for (int v = 0; v < 2; v++) {
        if (v) setenv("MODEL_MEMORY_PLAN", "0", 1);
        m[v] = model_create_mixed(&d, arch, norm_bn, batch, 5, p, 0);
        setenv("MODEL_MEMORY_PLAN", "1", 1);
        ck_assert_int_eq(m[v]->memory_plan, !v);
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

START_TEST(memory_plan_changes_no_bit) {
    setenv("MODEL_MEMORY_PLAN", "1", 1); /* the default, whatever the environment says */
    check_plan_bitwise("tiny", 1, 4, PREC_FP32);
    check_plan_bitwise("tiny", 0, 4, PREC_FP32);
    check_plan_bitwise("tiny", 1, 4, PREC_FP16);
    check_plan_bitwise("tiny", 1, 4, PREC_BF16);
    check_plan_bitwise("resnet18", 1, 2, PREC_FP32);
}
END_TEST

/* The CUDA model against the CPU model: same weights, same batch (TF32 off, so plain fp32). */
START_TEST(cuda_model_matches_cpu_model) {
    if (!test_have_gpu("model: CUDA forward/backward vs CPU")) return;
    Device c = cpu(), g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    int n = 16;
    Model *mc = model_create(&c, "tiny", 1, n, 3), *mg = model_create(&g, "tiny", 1, n, 3);
    float *x = malloc((size_t)n * 3072 * sizeof(float));
    int32_t y[16];
    for (int i = 0; i < n; i++) y[i] = (i * 7) % 10;
    test_fill_uniform(x, (int64_t)n * 3072, 9, -2, 2);
    float *xg = device_alloc(&g, (size_t)n * 3072 * 4, "x");
    int32_t *yg = device_alloc(&g, sizeof y, "y");
    float *lossg = device_alloc(&g, 4, "loss");
    int32_t *corrg = device_alloc(&g, 4, "correct");
    device_copy_h2d(&g, xg, x, (size_t)n * 3072 * 4);
    device_copy_h2d(&g, yg, y, sizeof y);
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
    device_copy_d2h(&g, gg, mg->grad_flat, np * sizeof(float));
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
    float *x = malloc((size_t)n * 3072 * sizeof(float));
    int32_t y[16];
    for (int i = 0; i < n; i++) y[i] = (i * 7) % 10;
    test_fill_uniform(x, (int64_t)n * 3072, 9, -2, 2);
    float *xg = device_alloc(&g, (size_t)n * 3072 * 4, "x");
    int32_t *yg = device_alloc(&g, sizeof y, "y");
    float *lossg = device_alloc(&g, 4, "loss");
    int32_t *corrg = device_alloc(&g, 4, "correct");
    device_copy_h2d(&g, xg, x, (size_t)n * 3072 * 4);
    device_copy_h2d(&g, yg, y, sizeof y);
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
        device_copy_d2h(&g, gg, mg->grad_flat, np * sizeof(float));
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

/* On the GPU the plan also holds every convolution's cuDNN workspace (one slot for its forward step,
 * one for its backward step): after model_prepare a training step uses no shared device workspace
 * at all, allocates nothing, the model holds exactly what it says, and — same deterministic algorithms — gives
 * bit-identical logits and gradients to the unplanned model (MODEL_MEMORY_PLAN=0: every tensor all
 * step, one shared workspace). ResNet-18 at batch 32, fp32 NCHW and fp16 channels-last. */
/* The bytes of the device's batch-norm scratch (0 before the first model asks for it). */
#define BN_SCRATCH(g) ((g).bn_scratch ? device_alloc_size((g).bn_scratch_bytes) : 0)

START_TEST(cuda_memory_plan_holds_workspaces) {
    setenv("MODEL_MEMORY_PLAN", "1", 1); /* the default, whatever the environment says */
    if (!test_have_gpu("model: the memory plan on CUDA (workspaces in the arena)")) return;
    Device g = {.allow_tf32 = 0, .deterministic = 1};
    device_init(&g, DEV_CUDA, 0, 0);
    const int n = 32;
    float *x = malloc((size_t)n * 3072 * sizeof(float));
    int32_t y[32];
    for (int i = 0; i < n; i++) y[i] = (i * 3) % 10;
    test_fill_uniform(x, (int64_t)n * 3072, 23, -2, 2);
    float *xg = device_alloc(&g, (size_t)n * 3072 * 4, "x");
    int32_t *yg = device_alloc(&g, sizeof y, "y");
    float *lossg = device_alloc(&g, 4, "loss");
    int32_t *corrg = device_alloc(&g, 4, "correct");
    device_copy_h2d(&g, xg, x, (size_t)n * 3072 * 4);
    device_copy_h2d(&g, yg, y, sizeof y);
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
 * input buffers (the input pipe's double buffer) with SGD in between, give bit-identical logits
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
        for (int step = 0; step < 5; step++) {
            HookLog h[2] = {0};
            for (int v = 0; v < 2; v++) {
                model_zero_grad(m[v]);
                model_forward(m[v], n, xg[step % 2], 1);
                xent_forward_backward(&g, n, 10, model_logits(m[v]), yg, 1.0f / n, lossg, corrg, model_dlogits(m[v]));
                model_backward(m[v], n, log_hook, &h[v]);
                device_copy_d2h(&g, gr[v], m[v]->grad_flat, np * 4);
                device_copy_d2h(&g, lg[v], model_logits(m[v]), n * 40);
                optim_step(&opt[v], m[v]->param_flat, m[v]->grad_flat, 0.05);
            }
            ck_assert_msg(!memcmp(lg[0], lg[1], n * 40), "config %d step %d: logits differ", c, step);
            ck_assert_msg(!memcmp(gr[0], gr[1], np * 4), "config %d step %d: gradients differ", c, step);
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

Suite *suite_model(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, resnet18_has_pytorch_parameter_count);
    tcase_add_test(tc, init_follows_pytorch_defaults);
    tcase_add_test(tc, backward_plan_accumulates_at_fan_out);
    tcase_add_test(tc, grad_ready_hook_fires_once_per_parameter_in_reverse);
    tcase_add_test(tc, hook_stops_defer_hooks_in_order);
    tcase_add_test(tc, gradients_accumulate_across_backwards);
    tcase_add_test(tc, eval_mode_leaves_running_stats_alone);
    tcase_add_test(tc, memory_plan_is_sound_and_accounted);
    tcase_add_test(tc, memory_plan_figures_are_pinned);
    tcase_add_test(tc, memory_plan_changes_no_bit);
    tcase_add_test(tc, cuda_model_matches_cpu_model);
    tcase_add_test(tc, cuda_mixed_model_matches_cpu_emulation);
    tcase_add_test(tc, cuda_memory_plan_holds_workspaces);
    tcase_add_test(tc, cuda_graphs_replay_the_eager_step);
    suite_add_tcase(s, tc);
    return s;
}
