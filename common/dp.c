/* dp.c — DataParallel on N logical devices: the step, its threads, the GIL charges, phase timing.
 *
 * Stream ordering on CUDA (what makes the step correct without host synchronisation):
 *  - every copy between devices is issued on device 0's compute stream (push in scatter, replicate
 *    and the backward scatter; pull in gather and reduce), so device 0's stream sees the whole
 *    step in order and the phase marks recorded on it partition the step;
 *  - the other devices' streams wait for device 0 through events: `replicated` before forward,
 *    `dlogits_ready` before backward; device 0's stream waits for each replica's `fwd_done` before
 *    the gather and `bwd_done` before the reduce;
 *  - a replica's buffers are only rewritten after device 0 has waited for that replica's previous
 *    use of them, so nothing is overwritten while still being read.
 * With --p2p off a copy between two GPUs goes device → pinned host buffer (on the source's stream) →
 * device (on the destination's stream), handing the two staging buffers over with events. */
#include "dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h" /* IMG_PIXELS */
#include "ops.h"

const char *const dp_phase_name[DP_PHASES] = {"input", "scatter", "replicate", "forward", "gather",
                                              "loss",  "backward", "reduce",   "optimizer"};

#define STAGING_BYTES ((size_t)4 << 20) /* --p2p off: each of the two host staging buffers */

#define CHECK_PT(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) die_at(__FILE__, __LINE__, #call, strerror(rc_), NULL);                      \
    } while (0)

/* Measured by tests/torch/calibrate_dp.py (PyTorch 2.11, Python 3.12, 2× H200 host, cudnn.benchmark
 * off, median of 100 calls; run by tests/bench_stage2.sh on 2026-11-29 — docs/stage2.md). Rerun it on
 * your machine: it prints the flags to pass. op_us is the serialized (GIL-held) part of one of
 * ResNet-18's forward ops: 46.5 µs per op from one thread, 70.8 µs with two threads at once; a tiny
 * eager op measured 7.4 µs (../shared/SEMANTICS.md), a conv with its argument parsing costs more. */
DpConfig dp_config_defaults(void) {
    return (DpConfig){.p2p = 1, .thread_pool = 0, .switch_ms = 5.0, .op_us = 24.24, .call_us = 40.6,
                      .module_us = 14.04, .param_us = 11.92, .thread_us = 127.0, .host_us = -1.0};
}

int dp_chunks(int batch, int n, int *sizes) {
    ASSERT(batch >= 1 && n >= 1);
    int chunk = (batch + n - 1) / n, k = 0;
    for (int left = batch; left > 0; left -= chunk) sizes[k++] = left < chunk ? left : chunk;
    return k;
}

/* ---- devices --------------------------------------------------------------------------------- */

Device **dp_devices_create(int n, DeviceKind kind, const Device *opts) {
    if (n < 1 || n > DP_MAX_DEVICES)
        die_user("--gpus %d: DataParallel needs between 1 and %d devices", n, DP_MAX_DEVICES);
    int visible = kind == DEV_CUDA ? device_cuda_count() : 0;
    if (kind == DEV_CUDA && n > visible)
        printf("note: --gpus %d on %d visible GPU%s: the %d logical devices share them round-robin, each "
               "with its own streams and memory account — the mechanics are real, but the timings do "
               "not show scaling\n", n, visible, visible == 1 ? "" : "s", n);
    Device **devs = xcalloc((size_t)n, sizeof *devs);
    for (int i = 0; i < n; i++) {
        devs[i] = xcalloc(1, sizeof(Device));
        devs[i]->deterministic = opts->deterministic;
        devs[i]->benchmark = opts->benchmark;
        devs[i]->allow_tf32 = opts->allow_tf32;
        device_init(devs[i], kind, i, kind == DEV_CUDA ? i % visible : -1);
        if (kind == DEV_CUDA && n > visible) { /* say which logical device a line is about */
            char phys[96];
            snprintf(phys, sizeof phys, "%s", devs[i]->name);
            snprintf(devs[i]->name, sizeof devs[i]->name, "dev%d=%.80s", i, phys);
        }
    }
    device_bind(devs[0]);
    return devs;
}

void dp_devices_destroy(Device **devs, int n) {
    for (int i = 0; i < n; i++) {
        device_destroy(devs[i]);
        free(devs[i]);
    }
    free(devs);
}

/* ---- modelled Python ------------------------------------------------------------------------- */

/* The modules nn.Module.modules() lists for the PyTorch twin of this model (tests/torch/models.py):
 * the root, every conv / norm / linear, and the containers — one Sequential per stage, and per
 * residual block the BasicBlock and its (possibly empty) shortcut Sequential. With --norm none each
 * norm is an nn.Identity, except in the shortcut. This is what replicate() copies every step. */
static int torch_module_count(const Model *m) {
    int convs = 0, bns = 0, blocks = 0, linears = 0, stages = 0, seen[10] = {0};
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *L = &m->layers[l];
        if (L->kind == LAYER_CONV) convs++;
        if (L->kind == LAYER_BN) bns++;
        if (L->kind == LAYER_ADD) blocks++;
        if (L->kind == LAYER_LINEAR) linears++;
        int s = -1;
        if (!strncmp(L->name, "layer", 5) && sscanf(L->name + 5, "%d", &s) == 1 && s >= 0 && s < 10 && !seen[s])
            seen[s] = 1, stages++;
    }
    int norms = m->norm_bn ? bns : 1 + 2 * blocks; /* Identity: the stem's and two per block */
    return 1 + convs + linears + norms + 2 * blocks + stages;
}

/* DataParallel's own Python in one step with k replicas (µs, before --gil-host-us scaling): the
 * main thread's (scatter, replicate, parallel_apply, gather, and the backward's scatter and
 * reduce-add) and the new threads' start-up. */
static double host_cost_us(const DataParallel *dp, int k) {
    const DpConfig *c = &dp->cfg;
    double us = c->call_us; /* scatter is called even with one device */
    if (dp->n > 1) {
        us += 5 * c->call_us                                                  /* the other calls */
              + k * (dp->n_modules * c->module_us + dp->n_tensors * c->param_us) /* replicate */
              + k * dp->master->n_params * c->param_us;                       /* reduce-add */
        if (!c->thread_pool && k > 1) us += k * c->thread_us;                 /* thread start-ups */
    }
    return us;
}

double dp_python_us(const DataParallel *dp, int batch, double *host_us, double *ops_us) {
    int sizes[DP_MAX_DEVICES], k = dp_chunks(batch, dp->n, sizes);
    double host = dp->host_scale * host_cost_us(dp, k);
    double ops = k * dp->master->n_layers * dp->cfg.op_us;
    if (host_us) *host_us = host;
    if (ops_us) *ops_us = ops;
    return host + ops;
}

/* Interpreter time: take the GIL, run `us` of Python holding it, let it go. */
static void interpret(DataParallel *dp, GilThread *t, double us, double *charged_s) {
    if (!dp->python || us <= 0) return;
    gil_acquire(&dp->gil, t);
    gil_hold_for(&dp->gil, t, us);
    gil_release(&dp->gil, t);
    *charged_s += us * 1e-6;
}

/* A blocking call returned (join, Event.wait, backward): the thread needs the GIL to go on. */
static void gil_roundtrip(DataParallel *dp, GilThread *t) {
    if (!dp->python) return;
    gil_acquire(&dp->gil, t);
    gil_release(&dp->gil, t);
}

/* ---- events ---------------------------------------------------------------------------------- */

static void event_create(Device *d, DpEvent *e, int timing) {
#ifdef USE_CUDA
    if (d->kind != DEV_CUDA) return;
    device_bind(d);
    CHECK_CUDA(cudaEventCreateWithFlags(e, timing ? cudaEventDefault : cudaEventDisableTiming));
#else
    (void)d, (void)e, (void)timing;
#endif
}

static void event_destroy(Device *d, DpEvent e) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) cudaEventDestroy(e);
#else
    (void)d, (void)e;
#endif
}

/* Record e on d's compute stream. */
static void record(Device *d, DpEvent e) {
#ifdef USE_CUDA
    if (d->kind != DEV_CUDA) return;
    device_bind(d);
    CHECK_CUDA(cudaEventRecord(e, d->stream));
#else
    (void)d, (void)e;
#endif
}

/* d's compute stream waits for e (recorded on any device's stream); the host does not wait. */
static void stream_wait(Device *d, DpEvent e) {
#ifdef USE_CUDA
    if (d->kind != DEV_CUDA) return;
    device_bind(d);
    CHECK_CUDA(cudaStreamWaitEvent(d->stream, e, 0));
#else
    (void)d, (void)e;
#endif
}

/* ---- phase marks ----------------------------------------------------------------------------- */

static void mark(DataParallel *dp, int m) {
    ASSERT(dp->step < dp->cap); /* more steps in one epoch than dp_init was told */
    Device *d0 = dp->devs[0];
    if (d0->kind == DEV_CUDA) record(d0, dp->ev[dp->step][m]);
    else dp->t_mark[dp->step][m] = time_now();
}

void dp_mark(DataParallel *dp, DpPhase phase) {
    ASSERT(phase > DP_INPUT && phase < DP_PHASES);
    mark(dp, phase);
    device_bind(dp->devs[0]);
    if (phase != DP_OPTIMIZER) return;
    for (int p = 0; p < DP_PHASES; p++) dp->py_ms[dp->step][p] = 1e3 * dp->cur_py_s[p], dp->cur_py_s[p] = 0;
    dp->step++;
}

/* ---- copies between devices ------------------------------------------------------------------ */

/* dst (on dr's device) ← src (on sr's device), ordered on device 0's compute stream; one of the
 * two is replica 0. */
static void copy_between(DataParallel *dp, void *dst, Replica *dr, const void *src, Replica *sr,
                         size_t bytes) {
    Device *on = dp->devs[0], *dd = dr->dev, *sd = sr->dev;
    ASSERT(dr->index == 0 || sr->index == 0);
    if (bytes == 0) return;
    if (dp->cfg.p2p || dr == sr) {
        device_copy_peer(on, dst, dd, src, sd, bytes);
        return;
    }
    /* --p2p off: through host memory, taking the two staging buffers in turn */
    for (size_t off = 0; off < bytes; off += STAGING_BYTES) {
        size_t len = bytes - off < STAGING_BYTES ? bytes - off : STAGING_BYTES;
        int b = dp->stage_next;
        dp->stage_next ^= 1;
        void *stage = dp->staging[b];
        if (sd->kind == DEV_CPU) {
            memcpy(stage, (const char *)src + off, len);
            memcpy((char *)dst + off, stage, len);
            continue;
        }
#ifdef USE_CUDA
        /* the source may refill buffer b only once its last reader has copied it out */
        if (dp->stage_last[b]) stream_wait(sd, dp->stage_last[b]->staged_h2d[b]);
        device_bind(sd);
        CHECK_CUDA(cudaMemcpyAsync(stage, (const char *)src + off, len, cudaMemcpyDeviceToHost, sd->stream));
        record(sd, sr->staged_d2h[b]);
        stream_wait(dd, sr->staged_d2h[b]);
        device_bind(dd);
        CHECK_CUDA(cudaMemcpyAsync((char *)dst + off, stage, len, cudaMemcpyHostToDevice, dd->stream));
        record(dd, dr->staged_h2d[b]);
        dp->stage_last[b] = dr;
#endif
    }
}

/* After staged pushes from device 0: device 0's stream waits until they have landed, so that the
 * phase they belong to ends when they are done. */
static void staged_fence(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    if (dp->cfg.p2p || d0->kind != DEV_CUDA) return;
    for (int b = 0; b < 2; b++)
        if (dp->stage_last[b] && dp->stage_last[b] != &dp->rep[0])
            stream_wait(d0, dp->stage_last[b]->staged_h2d[b]);
}

/* ---- worker crews: persistent threads that run one piece of work per replica ----------------- */

static void crew_init(DpCrew *c) {
    memset(c, 0, sizeof *c);
    CHECK_PT(pthread_mutex_init(&c->mu, NULL));
    CHECK_PT(pthread_cond_init(&c->go, NULL));
    CHECK_PT(pthread_cond_init(&c->done, NULL));
}

static void crew_destroy(DpCrew *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->go);
    pthread_cond_destroy(&c->done);
}

/* Main thread: run the crew's work on replicas 0..k−1 and wait until all of them are done. */
static void crew_run(DpCrew *c, int k) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    c->k = k;
    c->pending = k;
    c->gen++;
    CHECK_PT(pthread_cond_broadcast(&c->go));
    while (c->pending > 0) CHECK_PT(pthread_cond_wait(&c->done, &c->mu));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}

/* Worker: block until there is work for replica `index` (returns 1) or the crew quits (0). */
static int crew_next(DpCrew *c, uint64_t *seen, int index) {
    int work = 0;
    CHECK_PT(pthread_mutex_lock(&c->mu));
    while (!c->quit && !work) {
        while (c->gen == *seen && !c->quit) CHECK_PT(pthread_cond_wait(&c->go, &c->mu));
        if (c->quit) break;
        *seen = c->gen;
        work = index < c->k; /* replicas beyond this step's chunks sit it out */
    }
    CHECK_PT(pthread_mutex_unlock(&c->mu));
    return work;
}

static void crew_finish(DpCrew *c) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    if (--c->pending == 0) CHECK_PT(pthread_cond_signal(&c->done));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}

static void crew_quit(DpCrew *c) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    c->quit = 1;
    CHECK_PT(pthread_cond_broadcast(&c->go));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}

/* ---- the replicas' work ---------------------------------------------------------------------- */

/* model_forward over a one-layer view of the model: layer l alone, on the model's own parameters
 * and activations. So a replica's forward is issued one op at a time — as Python calls one module
 * after another — with exactly model_forward's semantics. */
static void forward_layer(Model *m, int l, int n, const float *x) {
    Model view = *m;
    view.layers = &m->layers[l];
    view.n_layers = 1;
    model_forward(&view, n, x, 1);
}

/* One replica's forward, as its Python thread runs it: each op's Python under the GIL, then the
 * dispatcher and the launch — here, the op itself — with the GIL released. */
static void forward_replica(DataParallel *dp, Replica *r, GilThread *t) {
    Model *m = r->model;
    if (r->index > 0) stream_wait(r->dev, dp->replicated);
    device_bind(r->dev);
    for (int l = 0; l < m->n_layers; l++) {
        interpret(dp, t, dp->cfg.op_us, &r->fwd_py_s);
        forward_layer(m, l, r->n, r->x);
    }
    record(r->dev, r->fwd_done);
}

/* parallel_apply's thread, new every step. Python's Thread.start() returns only once the new
 * thread has bootstrapped — under the GIL — so starting a thread is a GIL round trip. */
static void *forward_thread(void *arg) {
    Replica *r = arg;
    DataParallel *dp = r->dp;
    double w0 = r->gil.waited_s;
    if (dp->python) {
        gil_thread_start(&dp->gil, &r->gil);
        gil_acquire(&dp->gil, &r->gil);
    }
    CHECK_PT(pthread_mutex_lock(&dp->start_mu));
    dp->started = 1;
    CHECK_PT(pthread_cond_signal(&dp->start_cv));
    CHECK_PT(pthread_mutex_unlock(&dp->start_mu));
    if (dp->python) { /* the rest of the bootstrap and _worker's device / stream contexts */
        double us = dp->host_scale * dp->cfg.thread_us;
        gil_hold_for(&dp->gil, &r->gil, us);
        gil_release(&dp->gil, &r->gil);
        r->fwd_py_s += us * 1e-6;
    }
    forward_replica(dp, r, &r->gil);
    r->fwd_wait_s = r->gil.waited_s - w0;
    return NULL;
}

/* --dp-thread-pool: the same work on a persistent thread (one thread state for the whole run). */
static void *pool_thread(void *arg) {
    Replica *r = arg;
    DataParallel *dp = r->dp;
    uint64_t seen = 0;
    gil_thread_start(&dp->gil, &r->gil);
    while (crew_next(&dp->pool_crew, &seen, r->index)) {
        double w0 = r->gil.waited_s;
        forward_replica(dp, r, &r->gil);
        r->fwd_wait_s = r->gil.waited_s - w0;
        crew_finish(&dp->pool_crew);
    }
    return NULL;
}

/* PyTorch's autograd device thread: a replica's backward, without the GIL. Its gradients start
 * from zero (in PyTorch they are new tensors every step); replica 0's are the master's, which
 * the training loop zeroes. */
static void *backward_thread(void *arg) {
    Replica *r = arg;
    DataParallel *dp = r->dp;
    uint64_t seen = 0;
    while (crew_next(&dp->bwd_crew, &seen, r->index)) {
        if (r->index > 0) {
            stream_wait(r->dev, dp->dlogits_ready);
            device_bind(r->dev);
            model_zero_grad(r->model);
        }
        device_bind(r->dev);
        model_backward(r->model, r->n, NULL, NULL);
        record(r->dev, r->bwd_done);
        crew_finish(&dp->bwd_crew);
    }
    return NULL;
}

/* ---- setup ----------------------------------------------------------------------------------- */

void dp_init(DataParallel *dp, Device **devs, int n, Model **models, int max_batch, int steps_cap,
             const DpConfig *cfg) {
    memset(dp, 0, sizeof *dp);
    ASSERT(n >= 1 && n <= DP_MAX_DEVICES && max_batch >= 1 && steps_cap >= 1);
    dp->n = n, dp->devs = devs, dp->cfg = *cfg, dp->max_batch = max_batch;
    Device *d0 = devs[0];
    Model *m = dp->master = models[0];
    dp->n_modules = torch_module_count(m);
    int bns = 0;
    for (int l = 0; l < m->n_layers; l++) bns += m->layers[l].kind == LAYER_BN;
    dp->n_tensors = m->n_params + 3 * bns; /* + BN's running_mean, running_var, num_batches_tracked */

    /* --gil-host-us: the DataParallel costs scaled to a given total per full step */
    dp->host_scale = 1.0;
    if (cfg->host_us >= 0) {
        int sizes[DP_MAX_DEVICES];
        double full = host_cost_us(dp, dp_chunks(max_batch, n, sizes));
        if (full <= 0 && cfg->host_us > 0)
            die_user("--gil-host-us %g: every --gil-host-* cost is 0, so there is nothing to scale "
                     "(set them, or pass --gil-host-us 0)", cfg->host_us);
        dp->host_scale = full > 0 ? cfg->host_us / full : 0;
    }
    dp->python = dp_python_us(dp, max_batch, NULL, NULL) > 0;
    gil_init(&dp->gil, cfg->switch_ms);
    gil_thread_init(&dp->main, "main");
    gil_thread_start(&dp->gil, &dp->main);

    int chunk = (max_batch + n - 1) / n;
    for (int i = 0; i < n; i++) {
        Replica *r = &dp->rep[i];
        r->dp = dp, r->index = i, r->dev = devs[i], r->model = models[i];
        ASSERT(models[i]->dev == devs[i] && models[i]->max_batch >= chunk);
        char name[24];
        snprintf(name, sizeof name, "replica %d", i);
        gil_thread_init(&r->gil, name);
        if (i > 0) r->x_buf = device_alloc(devs[i], (size_t)chunk * IMG_PIXELS * sizeof(float), "scattered input chunk");
        event_create(devs[i], &r->fwd_done, 0);
        event_create(devs[i], &r->bwd_done, 0);
        for (int b = 0; b < 2; b++) event_create(devs[i], &r->staged_d2h[b], 0), event_create(devs[i], &r->staged_h2d[b], 0);
    }
    if (n > 1) { /* device 0 alone holds the whole batch's logits and the reduce's landing bucket */
        size_t lb = (size_t)max_batch * m->classes * sizeof(float);
        dp->logits = device_alloc(d0, lb, "gathered logits");
        dp->dlogits = device_alloc(d0, lb, "gathered logits' gradient");
        dp->landing_floats = DP_BUCKET_BYTES / sizeof(float);
        if ((int64_t)dp->landing_floats > m->n_param_floats) dp->landing_floats = (size_t)m->n_param_floats;
        dp->landing = device_alloc(d0, dp->landing_floats * sizeof(float), "reduce-add landing bucket");
    } else { /* one device: DataParallel calls the module directly, nothing is gathered */
        dp->logits = model_logits(m);
        dp->dlogits = model_dlogits(m);
    }
    if (!cfg->p2p && n > 1)
        for (int b = 0; b < 2; b++) dp->staging[b] = host_alloc(d0, STAGING_BYTES, d0->kind == DEV_CUDA);
    dp->direct = 1;
    if (cfg->p2p)
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) dp->direct &= device_enable_peer(devs[i], devs[j]);

    /* phase timing for up to steps_cap steps per epoch */
    dp->cap = steps_cap;
    dp->py_ms = xcalloc((size_t)steps_cap, sizeof *dp->py_ms);
    dp->wait_ms = xcalloc((size_t)steps_cap, sizeof *dp->wait_ms);
    if (d0->kind == DEV_CUDA) {
        dp->ev = xcalloc((size_t)steps_cap, sizeof *dp->ev);
        for (int s = 0; s < steps_cap; s++)
            for (int p = 0; p < DP_PHASES; p++) event_create(d0, &dp->ev[s][p], 1);
    } else {
        dp->t_mark = xcalloc((size_t)steps_cap, sizeof *dp->t_mark);
    }
    event_create(d0, &dp->replicated, 0);
    event_create(d0, &dp->dlogits_ready, 0);

    CHECK_PT(pthread_mutex_init(&dp->start_mu, NULL));
    CHECK_PT(pthread_cond_init(&dp->start_cv, NULL));
    crew_init(&dp->bwd_crew);
    crew_init(&dp->pool_crew);
    for (int i = 0; i < n; i++) {
        CHECK_PT(pthread_create(&dp->rep[i].bwd_thread, NULL, backward_thread, &dp->rep[i]));
        if (cfg->thread_pool) CHECK_PT(pthread_create(&dp->rep[i].pool_thread, NULL, pool_thread, &dp->rep[i]));
    }
    device_bind(d0);
}

void dp_destroy(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    crew_quit(&dp->bwd_crew);
    crew_quit(&dp->pool_crew);
    for (int i = 0; i < dp->n; i++) {
        Replica *r = &dp->rep[i];
        CHECK_PT(pthread_join(r->bwd_thread, NULL));
        if (dp->cfg.thread_pool) CHECK_PT(pthread_join(r->pool_thread, NULL));
        device_sync(r->dev);
        if (r->x_buf) device_free(r->dev, r->x_buf);
        event_destroy(r->dev, r->fwd_done);
        event_destroy(r->dev, r->bwd_done);
        for (int b = 0; b < 2; b++) event_destroy(r->dev, r->staged_d2h[b]), event_destroy(r->dev, r->staged_h2d[b]);
    }
    crew_destroy(&dp->bwd_crew);
    crew_destroy(&dp->pool_crew);
    pthread_mutex_destroy(&dp->start_mu);
    pthread_cond_destroy(&dp->start_cv);
    if (dp->n > 1) {
        device_free(d0, dp->logits);
        device_free(d0, dp->dlogits);
        device_free(d0, dp->landing);
    }
    for (int b = 0; b < 2; b++) host_free(d0, dp->staging[b], d0->kind == DEV_CUDA);
    if (dp->ev) {
        for (int s = 0; s < dp->cap; s++)
            for (int p = 0; p < DP_PHASES; p++) event_destroy(d0, dp->ev[s][p]);
        free(dp->ev);
    }
    event_destroy(d0, dp->replicated);
    event_destroy(d0, dp->dlogits_ready);
    free(dp->t_mark), free(dp->py_ms), free(dp->wait_ms);
    for (int p = 0; p < DP_PHASES; p++) free(dp->ph_ms[p]), free(dp->ph_py_ms[p]);
    free(dp->step_ms), free(dp->step_wait_ms);
    gil_destroy(&dp->gil);
    device_bind(d0);
}

void dp_prepare(DataParallel *dp, int batch) {
    int sizes[DP_MAX_DEVICES], k = dp_chunks(batch, dp->n, sizes);
    for (int i = 0; i < k; i++) {
        device_bind(dp->rep[i].dev);
        model_prepare(dp->rep[i].model, sizes[i]);
    }
    device_bind(dp->devs[0]);
}

void dp_describe(const DataParallel *dp, Report *r) {
    const DpConfig *c = &dp->cfg;
    char names[512] = "";
    for (int i = 0; i < dp->n && strlen(names) < 400; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", dp->devs[i]->name);
    report_printf(r, "DataParallel: %d replica%s on %s | copies: %s | forward: %s\n", dp->n,
                  dp->n == 1 ? "" : "s", names,
                  dp->n == 1 ? "none (one device)"
                  : !c->p2p  ? "staged through host memory (--p2p off)"
                  : dp->devs[0]->kind == DEV_CPU ? "memcpy between the virtual devices"
                  : dp->direct ? "direct (peer access, or one GPU)"
                               : "no peer access between these GPUs: the driver stages them through host memory",
                  dp->n == 1       ? "in the main thread (one device: DataParallel calls the module itself)"
                  : c->thread_pool ? "persistent threads (--dp-thread-pool)"
                                   : "a new thread per replica every step");
    if (!dp->python) {
        report_printf(r, "modelled Python: none (--gil-op-us 0, --gil-host-us 0): the GIL is never taken\n");
        return;
    }
    double host_us, ops_us;
    dp_python_us(dp, dp->max_batch, &host_us, &ops_us);
    report_printf(r,
                  "modelled Python, charged as time holding the GIL (switch interval %g ms): %g µs per "
                  "forward op × %d ops per replica, and DataParallel's own %.2f ms per step (replicate "
                  "copies %d modules and %d tensors per replica; --gil-host-call-us %g "
                  "--gil-host-module-us %g --gil-host-param-us %g --gil-host-thread-us %g%s)\n",
                  c->switch_ms, c->op_us, dp->master->n_layers, 1e-3 * host_us, dp->n_modules,
                  dp->n_tensors, c->call_us, c->module_us, c->param_us, c->thread_us,
                  c->host_us >= 0 ? ", scaled by --gil-host-us" : "");
}

/* ---- the step -------------------------------------------------------------------------------- */

void dp_scatter(DataParallel *dp, const float *x, int batch) {
    ASSERT(batch >= 1 && batch <= dp->max_batch);
    mark(dp, 0); /* the step starts */
    Replica *r0 = &dp->rep[0];
    interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_SCATTER]);
    int sizes[DP_MAX_DEVICES];
    dp->k = dp_chunks(batch, dp->n, sizes);
    dp->batch = batch;
    for (int i = 0, off = 0; i < dp->k; off += sizes[i], i++) {
        Replica *r = &dp->rep[i];
        r->n = sizes[i], r->offset = off;
        r->x = i == 0 ? (float *)x : r->x_buf; /* device 0's chunk is a view, as torch's is */
        if (i > 0)
            copy_between(dp, r->x_buf, r, x + (size_t)off * IMG_PIXELS, r0,
                         (size_t)sizes[i] * IMG_PIXELS * sizeof(float));
    }
    staged_fence(dp);
    dp_mark(dp, DP_SCATTER);
}

/* broadcast_coalesced from device 0: a flat buffer goes out in ~10 MiB groups, each to every
 * other replica of this step. */
static void broadcast(DataParallel *dp, float *(*flat)(Model *), int64_t count) {
    size_t group = DP_BUCKET_BYTES / sizeof(float);
    Replica *r0 = &dp->rep[0];
    for (int64_t off = 0; off < count; off += (int64_t)group) {
        size_t len = (size_t)(count - off) < group ? (size_t)(count - off) : group;
        for (int i = 1; i < dp->k; i++)
            copy_between(dp, flat(dp->rep[i].model) + off, &dp->rep[i], flat(r0->model) + off, r0,
                         len * sizeof(float));
    }
}
static float *params_of(Model *m) { return m->param_flat; }
static float *buffers_of(Model *m) { return m->buffer_flat; }

void dp_replicate(DataParallel *dp) {
    if (dp->n > 1) { /* with one device DataParallel calls the module itself: no replicas */
        Model *m = dp->master;
        double *py = &dp->cur_py_s[DP_REPLICATE], s = dp->host_scale;
        interpret(dp, &dp->main, s * dp->cfg.call_us, py);
        broadcast(dp, params_of, m->n_param_floats);
        broadcast(dp, buffers_of, m->n_buffer_floats);
        staged_fence(dp);
        /* then the Python of building the replicas: every module shallow-copied, every parameter
         * and buffer re-bound, for every replica (device 0's included) */
        interpret(dp, &dp->main, s * dp->k * (dp->n_modules * dp->cfg.module_us + dp->n_tensors * dp->cfg.param_us), py);
    }
    record(dp->devs[0], dp->replicated);
    dp_mark(dp, DP_REPLICATE);
}

void dp_parallel_apply(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    for (int i = 0; i < dp->k; i++) dp->rep[i].fwd_py_s = dp->rep[i].fwd_wait_s = 0;
    if (dp->n > 1) interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_FORWARD]);
    if (dp->k == 1) { /* one module: parallel_apply (or DataParallel itself) runs it in this thread */
        double w0 = dp->main.waited_s;
        forward_replica(dp, &dp->rep[0], &dp->main);
        dp->rep[0].fwd_wait_s = dp->main.waited_s - w0;
    } else if (dp->cfg.thread_pool) {
        crew_run(&dp->pool_crew, dp->k); /* the GIL is not held while waiting */
        gil_roundtrip(dp, &dp->main);
    } else {
        for (int i = 0; i < dp->k; i++) { /* threading.Thread(...).start() */
            dp->started = 0;
            CHECK_PT(pthread_create(&dp->rep[i].fwd_thread, NULL, forward_thread, &dp->rep[i]));
            CHECK_PT(pthread_mutex_lock(&dp->start_mu));
            while (!dp->started) CHECK_PT(pthread_cond_wait(&dp->start_cv, &dp->start_mu));
            CHECK_PT(pthread_mutex_unlock(&dp->start_mu));
            gil_roundtrip(dp, &dp->main);
        }
        for (int i = 0; i < dp->k; i++) { /* thread.join() */
            CHECK_PT(pthread_join(dp->rep[i].fwd_thread, NULL));
            gil_roundtrip(dp, &dp->main);
        }
    }
    double wait = 0;
    for (int i = 0; i < dp->k; i++) {
        wait += dp->rep[i].fwd_wait_s;
        dp->cur_py_s[DP_FORWARD] += dp->rep[i].fwd_py_s;
    }
    dp->wait_ms[dp->step] = 1e3 * wait / dp->k;
    for (int i = 1; i < dp->k; i++) stream_wait(d0, dp->rep[i].fwd_done);
    dp_mark(dp, DP_FORWARD);
}

void dp_gather(DataParallel *dp) {
    if (dp->n > 1) { /* with one device the module's own output is the result */
        interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_GATHER]);
        int c = dp->master->classes;
        for (int i = 0; i < dp->k; i++) {
            Replica *r = &dp->rep[i];
            copy_between(dp, dp->logits + (size_t)r->offset * c, &dp->rep[0], model_logits(r->model), r,
                         (size_t)r->n * c * sizeof(float));
        }
    }
    dp_mark(dp, DP_GATHER);
}

void dp_backward(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    if (dp->n > 1) { /* Gather's backward scatters the logits' gradient back to the replicas */
        interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_BACKWARD]);
        int c = dp->master->classes;
        for (int i = 0; i < dp->k; i++) {
            Replica *r = &dp->rep[i];
            copy_between(dp, model_dlogits(r->model), r, dp->dlogits + (size_t)r->offset * c, &dp->rep[0],
                         (size_t)r->n * c * sizeof(float));
        }
        staged_fence(dp);
    }
    record(d0, dp->dlogits_ready);
    crew_run(&dp->bwd_crew, dp->k); /* loss.backward() waits for the device threads, GIL released */
    for (int i = 1; i < dp->k; i++) stream_wait(d0, dp->rep[i].bwd_done);
    dp_mark(dp, DP_BACKWARD);
}

void dp_reduce_add(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    Model *m = dp->master;
    if (dp->n > 1) { /* Broadcast's backward: reduce_add_coalesced onto device 0 */
        double us = dp->cfg.call_us + dp->k * m->n_params * dp->cfg.param_us;
        interpret(dp, &dp->main, dp->host_scale * us, &dp->cur_py_s[DP_REDUCE]);
        for (int64_t off = 0; off < m->n_param_floats; off += (int64_t)dp->landing_floats) {
            size_t len = (size_t)(m->n_param_floats - off);
            if (len > dp->landing_floats) len = dp->landing_floats;
            for (int i = 1; i < dp->k; i++) {
                copy_between(dp, dp->landing, &dp->rep[0], dp->rep[i].model->grad_flat + off, &dp->rep[i],
                             len * sizeof(float));
                device_bind(d0);
                add_inplace(d0, (int64_t)len, dp->landing, m->grad_flat + off);
            }
        }
    }
    dp_mark(dp, DP_REDUCE);
}

/* ---- timing and the report ------------------------------------------------------------------- */

void dp_epoch_end(DataParallel *dp) {
    int steps = dp->step;
    Device *d0 = dp->devs[0];
    (void)d0;
    if (steps == 0) return;
    if (dp->n_samples + steps > dp->cap_samples) {
        dp->cap_samples = 2 * (dp->n_samples + steps);
        for (int p = 0; p < DP_PHASES; p++) {
            dp->ph_ms[p] = realloc(dp->ph_ms[p], (size_t)dp->cap_samples * sizeof(double));
            dp->ph_py_ms[p] = realloc(dp->ph_py_ms[p], (size_t)dp->cap_samples * sizeof(double));
            ASSERT(dp->ph_ms[p] && dp->ph_py_ms[p]);
        }
        dp->step_ms = realloc(dp->step_ms, (size_t)dp->cap_samples * sizeof(double));
        dp->step_wait_ms = realloc(dp->step_wait_ms, (size_t)dp->cap_samples * sizeof(double));
        ASSERT(dp->step_ms && dp->step_wait_ms);
    }
#ifdef USE_CUDA
    if (d0->kind == DEV_CUDA) {
        device_bind(d0);
        CHECK_CUDA(cudaEventSynchronize(dp->ev[steps - 1][DP_OPTIMIZER]));
    }
#endif
    for (int s = 1; s < steps; s++) { /* step 0 of an epoch has no previous step to measure input from */
        if (dp->steps_seen + s < WARMUP_STEPS) continue;
        double ms[DP_PHASES], total = 0;
        for (int p = 0; p < DP_PHASES; p++) {
            int s_from = p == 0 ? s - 1 : s, m_from = p == 0 ? DP_OPTIMIZER : p - 1;
#ifdef USE_CUDA
            if (d0->kind == DEV_CUDA) {
                float f;
                CHECK_CUDA(cudaEventElapsedTime(&f, dp->ev[s_from][m_from], dp->ev[s][p]));
                ms[p] = f;
            } else
#endif
                ms[p] = 1e3 * (dp->t_mark[s][p] - dp->t_mark[s_from][m_from]);
            total += ms[p];
        }
        int i = dp->n_samples++;
        for (int p = 0; p < DP_PHASES; p++) {
            dp->ph_ms[p][i] = ms[p];
            dp->ph_py_ms[p][i] = dp->py_ms[s][p];
        }
        dp->step_ms[i] = total;
        dp->step_wait_ms[i] = dp->wait_ms[s];
    }
    dp->steps_seen += steps;
    dp->step = 0;
}

static double median_of(const double *v, int n) {
    double *tmp = xmalloc((size_t)(n + 1) * sizeof(double));
    memcpy(tmp, v, (size_t)n * sizeof(double));
    double m = stats_median(tmp, n);
    free(tmp);
    return m;
}

void dp_report(DataParallel *dp, Run *run) {
    Report *r = &run->report;
    int n = dp->n_samples;
    if (n == 0) {
        report_printf(r, "DataParallel phases: too few steps to time (the first %d are warm-up, and the "
                         "first step of each epoch has no input phase)\n", WARMUP_STEPS);
        return;
    }
    double med[DP_PHASES], py[DP_PHASES], sum = 0, py_sum = 0;
    for (int p = 0; p < DP_PHASES; p++) {
        med[p] = median_of(dp->ph_ms[p], n);
        py[p] = median_of(dp->ph_py_ms[p], n);
        sum += med[p], py_sum += py[p];
    }
    double step = median_of(dp->step_ms, n), wait = median_of(dp->step_wait_ms, n);
    double run_step = run->n_times ? median_of(run->times, run->n_times) : step;
    double off = run_step > 0 ? (sum - run_step) / run_step : 0;
    int adds_up = fabs(off) <= 0.10;
    const char *where = dp->devs[0]->kind == DEV_CUDA ? "device 0's stream (CUDA events)" : "wall clock";
    report_printf(r, "DataParallel phases over %d steps (median ms per step, timed on %s; modelled "
                     "Python = host time charged under the GIL, all threads together)\n", n, where);
    report_printf(r, "  %-10s %9s %16s\n", "phase", "measured", "modelled Python");
    for (int p = 0; p < DP_PHASES; p++) {
        char extra[64] = "";
        if (p == DP_FORWARD && dp->python) snprintf(extra, sizeof extra, "   (GIL wait %.3f per replica thread)", wait);
        if (py[p] > 0) report_printf(r, "  %-10s %9.3f %16.3f%s\n", dp_phase_name[p], med[p], py[p], extra);
        else report_printf(r, "  %-10s %9.3f %16s%s\n", dp_phase_name[p], med[p], "-", extra);
    }
    report_printf(r, "  %-10s %9.3f %16.3f   vs step time %.3f ms (median ms/it): %s (%+.1f%%)\n", "sum", sum,
                  py_sum, run_step, adds_up ? "adds up" : "DOES NOT add up", 100 * off);
    json_begin(r, "phases");
    json_int(r, "steps", n);
    for (int p = 0; p < DP_PHASES; p++) {
        char key[40];
        snprintf(key, sizeof key, "%s_ms", dp_phase_name[p]);
        json_num(r, key, med[p]);
        snprintf(key, sizeof key, "%s_python_ms", dp_phase_name[p]);
        json_num(r, key, py[p]);
    }
    json_num(r, "sum_ms", sum);
    json_num(r, "step_ms", run_step);
    /* Means add where medians need not: the phases partition each step, so the mean of their sums
     * must equal the mean step time whatever the noise (the tests check these). */
    double sum_mean = 0, step_mean = 0;
    for (int i = 0; i < n; i++) sum_mean += dp->step_ms[i] / n;
    for (int i = 0; i < run->n_times; i++) step_mean += run->times[i] / run->n_times;
    json_num(r, "sum_mean_ms", sum_mean);
    json_num(r, "step_mean_ms", run->n_times ? step_mean : sum_mean);
    json_num(r, "phase_step_ms", step);
    json_num(r, "python_ms", py_sum);
    json_num(r, "forward_gil_wait_ms", wait);
    json_int(r, "adds_up", adds_up);
    json_end(r);

    /* the GIL */
    Gil *g = &dp->gil;
    if (!dp->python) {
        report_printf(r, "GIL: never taken (no modelled Python)\n");
        return;
    }
    report_printf(r, "GIL (switch interval %g ms): %lld hand-offs, %lld forced switches over %lld steps\n",
                  dp->cfg.switch_ms, (long long)g->handoffs, (long long)g->forced_switches,
                  (long long)dp->steps_seen);
    report_printf(r, "  %-12s %10s %10s %10s %13s %12s\n", "thread", "held ms", "waited ms", "acquires",
                  "drop requests", "forced drops");
    json_begin(r, "gil");
    json_num(r, "switch_ms", dp->cfg.switch_ms);
    json_int(r, "handoffs", g->handoffs);
    json_int(r, "forced_switches", g->forced_switches);
    json_int(r, "steps", dp->steps_seen);
    json_end(r);
    for (int i = -1; i < dp->n; i++) {
        GilThread *t = i < 0 ? &dp->main : &dp->rep[i].gil;
        if (i >= 0 && t->acquires == 0) continue; /* replica 0 runs in the main thread when alone */
        report_printf(r, "  %-12s %10.1f %10.1f %10lld %13lld %12lld\n", t->name, 1e3 * t->held_s,
                      1e3 * t->waited_s, (long long)t->acquires, (long long)t->drop_requests,
                      (long long)t->forced_drops);
        json_begin(r, "gil_thread");
        json_str(r, "thread", t->name);
        json_num(r, "held_ms", 1e3 * t->held_s);
        json_num(r, "waited_ms", 1e3 * t->waited_s);
        json_int(r, "acquires", t->acquires);
        json_int(r, "drop_requests", t->drop_requests);
        json_int(r, "forced_drops", t->forced_drops);
        json_end(r);
    }
}
