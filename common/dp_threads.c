/* dp_threads.c — the threads that run DataParallel's replicas.
 *
 * Forward: parallel_apply starts a new Python thread per replica every step (threading.Thread,
 * then join); starting one is a GIL round trip, because Thread.start() returns only once the new
 * thread has bootstrapped under the GIL. --dp-thread-pool keeps persistent threads instead (a Crew).
 * Each forward thread has its own convolution plan cache (plan_cache.h), living as long as the
 * thread: a new thread's is empty, so it plans every forward convolution again; a pool thread's
 * stays warm after its first step.
 * Backward: PyTorch's autograd engine runs each device's backward in its own persistent device
 * thread, without the GIL; loss.backward() waits for them with the GIL released (another Crew). */
#include "dp_internal.h"

#include <stdio.h>

#include "trace.h"

/* model_forward over a one-layer view of the model: layer l alone, on the model's own parameters
 * and activations. So a replica's forward is issued one op at a time — as Python calls one module
 * after another — with exactly model_forward's semantics. */
static void forward_layer(Model *m, int l, int n, const float *x) {
    Model view = *m;
    view.layers = &m->layers[l];
    view.n_layers = 1;
    view.plan_poison = 0; /* the tests' poisoning follows the whole model's timeline, not the view's one layer */
    model_forward(&view, n, x, 1);
}

/* One replica's forward, as its Python thread runs it: each op's Python under the GIL, then the
 * dispatcher and the launch — here, the op itself — with the GIL released. A convolution goes
 * through the thread's plan cache, planning first if the cache lacks it: inside the C++ call,
 * so without the GIL. */
static void forward_replica(DataParallel *dp, Replica *r, GilThread *t, PlanCache *pc) {
    Model *m = r->model;
    int64_t misses = pc->misses;
    double own = pc->own_s, charged = pc->charged_s;
    TraceSpan host = trace_begin("replica forward", "forward", r->index);
    if (r->index > 0) dp_event_wait(r->dev, dp->replicated);
    device_bind(r->dev);
    TraceDev dev = trace_dev_begin(r->dev, TRACE_COMPUTE, NULL, "forward", "forward", r->n);
    m->acts[0].x = (float *)r->x; /* the input, as model_forward sets it */
    model_count_forward(m, r->n);  /* and its count: the one-layer views' counts are dropped */
    for (int l = 0; l < m->n_layers; l++) {
        dp_interpret(dp, t, dp->cfg.op_us, &r->fwd_py_s);
        Layer *L = &m->layers[l];
        if (L->kind == LAYER_CONV) /* model_forward's conv line, through this thread's cache */
            plan_cache_conv_forward(pc, r->dev, &L->conv, r->n, m->acts[L->in].x,
                                    m->param_flat + m->params[L->p0].offset, m->acts[L->out].x);
        else forward_layer(m, l, r->n, r->x);
    }
    trace_dev_end(dev);
    dp_event_record(r->dev, r->fwd_done);
    trace_end(host);
    r->plan_misses = pc->misses - misses;
    r->plan_own_s = pc->own_s - own;
    r->plan_charged_s = pc->charged_s - charged;
    r->plan_misses_total += r->plan_misses;
}

/* The calibrated cost of one plan, for this device's cudnn.benchmark setting. */
static double plan_charge_us(const DataParallel *dp) {
    return dp->devs[0]->benchmark ? dp->cfg.plan_bench_us : dp->cfg.plan_us;
}

/* --trace: one lane per replica, whichever thread runs it (new threads every step share it). */
static void name_lane(const char *what, const Replica *r) {
    char name[32];
    snprintf(name, sizeof name, "%s %d", what, r->index);
    trace_thread_name(name);
}

/* parallel_apply's thread, new every step. Python's Thread.start() returns only once the new
 * thread has bootstrapped — under the GIL — so starting a thread is a GIL round trip. */
static void *forward_thread(void *arg) {
    Replica *r = arg;
    DataParallel *dp = r->dp;
    name_lane("replica thread", r);
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
    PlanCache cache; /* thread_local in PyTorch: born empty with the thread, gone with it */
    plan_cache_init(&cache, plan_charge_us(dp));
    forward_replica(dp, r, &r->gil, &cache);
    plan_cache_destroy(&cache);
    r->fwd_wait_s = r->gil.waited_s - w0;
    return NULL;
}

/* --dp-thread-pool: the same work on a persistent thread (one thread state for the whole run). */
static void *pool_thread(void *arg) {
    Replica *r = arg;
    DataParallel *dp = r->dp;
    uint64_t seen = 0;
    name_lane("replica thread", r);
    PlanCache cache; /* lives as long as the thread: warm after its first step */
    plan_cache_init(&cache, plan_charge_us(dp));
    gil_thread_start(&dp->gil, &r->gil);
    while (crew_next(&dp->pool_crew, &seen, r->index)) {
        double w0 = r->gil.waited_s;
        forward_replica(dp, r, &r->gil, &cache);
        r->fwd_wait_s = r->gil.waited_s - w0;
        crew_finish(&dp->pool_crew);
    }
    plan_cache_destroy(&cache);
    return NULL;
}

/* PyTorch's autograd device thread: a replica's backward, without the GIL. Its gradients start
 * from zero (in PyTorch they are new tensors every step); replica 0's are the master's, which
 * the training loop zeroes. */
static void *backward_thread(void *arg) {
    Replica *r = arg;
    DataParallel *dp = r->dp;
    uint64_t seen = 0;
    name_lane("autograd thread", r);
    while (crew_next(&dp->bwd_crew, &seen, r->index)) {
        if (r->index > 0) {
            dp_event_wait(r->dev, dp->dlogits_ready);
            device_bind(r->dev);
            model_zero_grad(r->model);
        }
        TraceSpan span = trace_begin("replica backward", "backward", r->index);
        device_bind(r->dev);
        model_backward(r->model, r->n, NULL, NULL);
        dp_event_record(r->dev, r->bwd_done);
        trace_end(span);
        crew_finish(&dp->bwd_crew);
    }
    return NULL;
}

void dp_threads_start(DataParallel *dp) {
    xmutex_init(&dp->start_mu);
    xcond_init(&dp->start_cv);
    crew_init(&dp->bwd_crew);
    crew_init(&dp->pool_crew);
    plan_cache_init(&dp->main_cache, plan_charge_us(dp));
    for (int i = 0; i < dp->n; i++) {
        xthread_create(&dp->rep[i].bwd_thread, backward_thread, &dp->rep[i]);
        if (dp->cfg.thread_pool) xthread_create(&dp->rep[i].pool_thread, pool_thread, &dp->rep[i]);
    }
}

void dp_threads_stop(DataParallel *dp) {
    crew_quit(&dp->bwd_crew);
    crew_quit(&dp->pool_crew);
    for (int i = 0; i < dp->n; i++) {
        CHECK_PT(pthread_join(dp->rep[i].bwd_thread, NULL));
        if (dp->cfg.thread_pool) CHECK_PT(pthread_join(dp->rep[i].pool_thread, NULL));
    }
    crew_destroy(&dp->bwd_crew);
    crew_destroy(&dp->pool_crew);
    plan_cache_destroy(&dp->main_cache);
    pthread_mutex_destroy(&dp->start_mu);
    pthread_cond_destroy(&dp->start_cv);
}

void dp_forward_replicas(DataParallel *dp) {
    if (dp->k == 1) { /* one module: parallel_apply (or DataParallel itself) runs it in this thread */
        double w0 = dp->main.waited_s;
        forward_replica(dp, &dp->rep[0], &dp->main, &dp->main_cache);
        dp->rep[0].fwd_wait_s = dp->main.waited_s - w0;
    } else if (dp->cfg.thread_pool) {
        crew_run(&dp->pool_crew, dp->k); /* the GIL is not held while waiting */
        dp_gil_roundtrip(dp, &dp->main);
    } else {
        for (int i = 0; i < dp->k; i++) { /* threading.Thread(...).start() */
            dp->started = 0;
            xthread_create(&dp->rep[i].fwd_thread, forward_thread, &dp->rep[i]);
            CHECK_PT(pthread_mutex_lock(&dp->start_mu));
            while (!dp->started) CHECK_PT(pthread_cond_wait(&dp->start_cv, &dp->start_mu));
            CHECK_PT(pthread_mutex_unlock(&dp->start_mu));
            dp_gil_roundtrip(dp, &dp->main);
        }
        for (int i = 0; i < dp->k; i++) { /* thread.join() */
            CHECK_PT(pthread_join(dp->rep[i].fwd_thread, NULL));
            dp_gil_roundtrip(dp, &dp->main);
        }
    }
}

void dp_backward_replicas(DataParallel *dp) {
    crew_run(&dp->bwd_crew, dp->k); /* loss.backward() waits for the device threads, GIL released */
}
