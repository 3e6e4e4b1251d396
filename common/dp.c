/* dp.c — DataParallel on N logical devices: the step, the copies between devices, setup.
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "ops.h"
#include "trace.h"

_Static_assert(DP_MAX_DEVICES <= TRACE_MAX_DEVICES, "a --trace gives every replica its lanes");

#define STAGING_BYTES ((size_t)4 << 20) /* --p2p off: each of the two host staging buffers */

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
        /* cudnn.benchmark exists only on CUDA: a CPU device that kept it would charge --dp-plan-bench-us
         * for every plan, though the run says the flag changes nothing there */
        devs[i]->benchmark = kind == DEV_CUDA && opts->benchmark;
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

/* ---- events ---------------------------------------------------------------------------------- */

void dp_event_create(Device *d, DpEvent *e) {
#ifdef USE_CUDA
    if (d->kind != DEV_CUDA) return;
    device_bind(d);
    CHECK_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
#else
    (void)d, (void)e;
#endif
}

void dp_event_destroy(Device *d, DpEvent e) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) cudaEventDestroy(e);
#else
    (void)d, (void)e;
#endif
}

void dp_event_record(Device *d, DpEvent e) {
#ifdef USE_CUDA
    if (d->kind != DEV_CUDA) return;
    device_bind(d);
    CHECK_CUDA(cudaEventRecord(e, d->stream));
#else
    (void)d, (void)e;
#endif
}

void dp_event_wait(Device *d, DpEvent e) {
#ifdef USE_CUDA
    if (d->kind != DEV_CUDA) return;
    device_bind(d);
    CHECK_CUDA(cudaStreamWaitEvent(d->stream, e, 0));
#else
    (void)d, (void)e;
#endif
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
        TraceDev span = trace_dev_begin(on, TRACE_COMPUTE, NULL, "peer copy", "copy", (int64_t)bytes);
        device_copy_peer(on, dst, dd, src, sd, bytes);
        trace_dev_end(span);
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
        if (dp->stage_last[b]) dp_event_wait(sd, dp->stage_last[b]->staged_h2d[b]);
        device_bind(sd);
        CHECK_CUDA(cudaMemcpyAsync(stage, (const char *)src + off, len, cudaMemcpyDeviceToHost, sd->stream));
        dp_event_record(sd, sr->staged_d2h[b]);
        dp_event_wait(dd, sr->staged_d2h[b]);
        device_bind(dd);
        CHECK_CUDA(cudaMemcpyAsync((char *)dst + off, stage, len, cudaMemcpyHostToDevice, dd->stream));
        dp_event_record(dd, dr->staged_h2d[b]);
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
            dp_event_wait(d0, dp->stage_last[b]->staged_h2d[b]);
}

/* ---- setup ----------------------------------------------------------------------------------- */

void dp_init(DataParallel *dp, Device **devs, int n, Model **models, int max_batch, int steps_cap,
             const DpConfig *cfg) {
    memset(dp, 0, sizeof *dp);
    ASSERT(n >= 1 && n <= DP_MAX_DEVICES && max_batch >= 1 && steps_cap >= 1);
    dp->n = n, dp->devs = devs, dp->cfg = *cfg, dp->max_batch = max_batch;
    Device *d0 = devs[0];
    Model *m = dp->master = models[0];
    const Activation *in = &m->acts[0]; /* the model's input: one sample is c × h × w floats */
    dp->sample_floats = (int64_t)in->c * in->h * in->w;
    dp_python_init(dp);

    int chunk = (max_batch + n - 1) / n;
    for (int i = 0; i < n; i++) {
        Replica *r = &dp->rep[i];
        r->dp = dp, r->index = i, r->dev = devs[i], r->model = models[i];
        ASSERT(models[i]->dev == devs[i] && models[i]->max_batch >= chunk);
        char name[24];
        snprintf(name, sizeof name, "replica %d", i);
        gil_thread_init(&r->gil, name);
        if (i > 0) r->x_buf = device_alloc(devs[i], (size_t)chunk * dp->sample_floats * sizeof(float), "scattered input chunk");
        dp_event_create(devs[i], &r->fwd_done);
        dp_event_create(devs[i], &r->bwd_done);
        for (int b = 0; b < 2; b++) dp_event_create(devs[i], &r->staged_d2h[b]), dp_event_create(devs[i], &r->staged_h2d[b]);
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
    if (d0->kind == DEV_CPU) /* the GPU input pipe's two slots of the whole batch, on device 0 */
        for (int b = 0; b < 2; b++)
            dp->batch0[b] = device_alloc(d0, (size_t)max_batch * dp->sample_floats * sizeof(float), "input batch");
    if (!cfg->p2p && n > 1)
        for (int b = 0; b < 2; b++) dp->staging[b] = host_alloc(d0, STAGING_BYTES, d0->kind == DEV_CUDA);
    dp->direct = 1;
    if (cfg->p2p)
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) dp->direct &= device_enable_peer(devs[i], devs[j]);

    dp_timing_init(dp, steps_cap); /* phase marks for up to steps_cap steps per epoch */
    dp_event_create(d0, &dp->replicated);
    dp_event_create(d0, &dp->dlogits_ready);

    dp_threads_start(dp);
    device_bind(d0);
}

void dp_destroy(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    dp_threads_stop(dp);
    for (int i = 0; i < dp->n; i++) {
        Replica *r = &dp->rep[i];
        device_sync(r->dev);
        if (r->x_buf) device_free(r->dev, r->x_buf);
        dp_event_destroy(r->dev, r->fwd_done);
        dp_event_destroy(r->dev, r->bwd_done);
        for (int b = 0; b < 2; b++) dp_event_destroy(r->dev, r->staged_d2h[b]), dp_event_destroy(r->dev, r->staged_h2d[b]);
    }
    if (dp->n > 1) {
        device_free(d0, dp->logits);
        device_free(d0, dp->dlogits);
        device_free(d0, dp->landing);
    }
    for (int b = 0; b < 2; b++) host_free(d0, dp->staging[b], d0->kind == DEV_CUDA);
    for (int b = 0; b < 2; b++) device_free(d0, dp->batch0[b]);
    dp_event_destroy(d0, dp->replicated);
    dp_event_destroy(d0, dp->dlogits_ready);
    dp_timing_destroy(dp);
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

/* ---- the step -------------------------------------------------------------------------------- */

void dp_scatter(DataParallel *dp, const float *x, int batch) {
    ASSERT(batch >= 1 && batch <= dp->max_batch);
    if (dp->batch0[0]) { /* CPU backend: device 0 holds its own copy, as a GPU's input pipe does */
        float *dst = dp->batch0[dp->batch0_slot ^= 1];
        memcpy(dst, x, (size_t)batch * dp->sample_floats * sizeof(float));
        x = dst;
    }
    TraceSpan host = trace_begin("scatter", "dp", -1);
    TraceDev dev = trace_dev_begin(dp->devs[0], TRACE_COMPUTE, NULL, "scatter", "dp", -1);
    dp_mark(dp, 0); /* the step starts */
    Replica *r0 = &dp->rep[0];
    dp_interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_SCATTER]);
    int sizes[DP_MAX_DEVICES];
    dp->k = dp_chunks(batch, dp->n, sizes);
    dp->batch = batch;
    for (int i = 0, off = 0; i < dp->k; off += sizes[i], i++) {
        Replica *r = &dp->rep[i];
        r->n = sizes[i], r->offset = off;
        r->x = i == 0 ? (float *)x : r->x_buf; /* device 0's chunk is a view, as torch's is */
        if (i > 0)
            copy_between(dp, r->x_buf, r, x + (size_t)off * dp->sample_floats, r0,
                         (size_t)sizes[i] * dp->sample_floats * sizeof(float));
    }
    staged_fence(dp);
    dp_mark(dp, DP_SCATTER);
    trace_dev_end(dev);
    trace_end(host);
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
    TraceSpan host = trace_begin("replicate", "dp", -1);
    TraceDev dev = trace_dev_begin(dp->devs[0], TRACE_COMPUTE, NULL, "replicate", "dp", -1);
    if (dp->n > 1) { /* with one device DataParallel calls the module itself: no replicas */
        Model *m = dp->master;
        double *py = &dp->cur_py_s[DP_REPLICATE], s = dp->host_scale;
        dp_interpret(dp, &dp->main, s * dp->cfg.call_us, py);
        broadcast(dp, params_of, m->n_param_floats);
        broadcast(dp, buffers_of, m->n_buffer_floats);
        staged_fence(dp);
        /* then the Python of building the replicas: every module shallow-copied, every parameter
         * and buffer re-bound, for every replica (device 0's included) */
        dp_interpret(dp, &dp->main, s * dp->k * (dp->n_modules * dp->cfg.module_us + dp->n_tensors * dp->cfg.param_us), py);
    }
    dp_event_record(dp->devs[0], dp->replicated);
    dp_mark(dp, DP_REPLICATE);
    trace_dev_end(dev);
    trace_end(host);
}

void dp_parallel_apply(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    TraceSpan host = trace_begin("parallel_apply (waits for the replica threads)", "wait", -1);
    for (int i = 0; i < dp->k; i++) {
        Replica *r = &dp->rep[i];
        r->fwd_py_s = r->fwd_wait_s = r->plan_own_s = r->plan_charged_s = 0;
        r->plan_misses = 0;
    }
    if (dp->n > 1) dp_interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_FORWARD]);
    dp_forward_replicas(dp); /* a thread per replica (dp_threads.c) */
    double wait = 0;
    for (int i = 0; i < dp->k; i++) {
        wait += dp->rep[i].fwd_wait_s;
        dp->cur_py_s[DP_FORWARD] += dp->rep[i].fwd_py_s;
    }
    dp->wait_ms[dp->step] = 1e3 * wait / dp->k;
    dp->ks[dp->step] = dp->k;
    double *plan = dp->plan[dp->step];
    plan[0] = plan[1] = plan[2] = 0;
    for (int i = 0; i < dp->k; i++) { /* mean per replica thread */
        Replica *r = &dp->rep[i];
        plan[0] += (double)r->plan_misses / dp->k;
        plan[1] += 1e3 * (r->plan_own_s + r->plan_charged_s) / dp->k;
        plan[2] += 1e3 * r->plan_own_s / dp->k;
    }
    for (int i = 1; i < dp->k; i++) { /* the other replicas' forwards count on the master, whose count
                                          * the report shows (their threads have joined: no race) */
        Model *m = dp->rep[i].model;
        if (!m->unprepared_forwards) continue;
        dp->master->unprepared_forwards += m->unprepared_forwards;
        dp->master->unprepared_last = m->unprepared_last;
        m->unprepared_forwards = 0;
    }
    for (int i = 1; i < dp->k; i++) dp_event_wait(d0, dp->rep[i].fwd_done);
    dp_mark(dp, DP_FORWARD);
    trace_end(host);
}

void dp_gather(DataParallel *dp) {
    TraceSpan host = trace_begin("gather", "dp", -1);
    TraceDev dev = trace_dev_begin(dp->devs[0], TRACE_COMPUTE, NULL, "gather", "dp", -1);
    if (dp->n > 1) { /* with one device the module's own output is the result */
        dp_interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_GATHER]);
        int c = dp->master->classes;
        for (int i = 0; i < dp->k; i++) {
            Replica *r = &dp->rep[i];
            copy_between(dp, dp->logits + (size_t)r->offset * c, &dp->rep[0], model_logits(r->model), r,
                         (size_t)r->n * c * sizeof(float));
        }
    }
    dp_mark(dp, DP_GATHER);
    trace_dev_end(dev);
    trace_end(host);
}

void dp_backward(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    TraceSpan host = trace_begin("backward (waits for the autograd threads)", "wait", -1);
    dp_mark(dp, DP_LOSS); /* the caller's loss ends where backward begins */
    if (dp->n > 1) { /* Gather's backward scatters the logits' gradient back to the replicas */
        dp_interpret(dp, &dp->main, dp->host_scale * dp->cfg.call_us, &dp->cur_py_s[DP_BACKWARD]);
        int c = dp->master->classes;
        for (int i = 0; i < dp->k; i++) {
            Replica *r = &dp->rep[i];
            copy_between(dp, model_dlogits(r->model), r, dp->dlogits + (size_t)r->offset * c, &dp->rep[0],
                         (size_t)r->n * c * sizeof(float));
        }
        staged_fence(dp);
    }
    dp_event_record(d0, dp->dlogits_ready);
    dp_backward_replicas(dp); /* in the autograd device threads (dp_threads.c) */
    for (int i = 1; i < dp->k; i++) dp_event_wait(d0, dp->rep[i].bwd_done);
    dp_mark(dp, DP_BACKWARD);
    trace_end(host);
}

void dp_reduce_add(DataParallel *dp) {
    Device *d0 = dp->devs[0];
    Model *m = dp->master;
    TraceSpan host = trace_begin("reduce", "dp", -1);
    TraceDev dev = trace_dev_begin(dp->devs[0], TRACE_COMPUTE, NULL, "reduce", "dp", -1);
    if (dp->n > 1) { /* Broadcast's backward: reduce_add_coalesced onto device 0 */
        double us = dp->cfg.call_us + dp->k * m->n_params * dp->cfg.param_us;
        dp_interpret(dp, &dp->main, dp->host_scale * us, &dp->cur_py_s[DP_REDUCE]);
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
    trace_dev_end(dev);
    trace_end(host);
}
