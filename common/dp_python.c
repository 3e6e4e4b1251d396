/* dp_python.c — DataParallel's modelled Python: the calibrated costs, stage 2's flags, and the
 * charges against the GIL.
 *
 * PyTorch's DataParallel spends host time in the interpreter — each forward op's Python in every
 * replica's thread, and DataParallel's own functions in the main thread — and all of it holds the
 * GIL. We do not run Python; we charge that time as time spent holding our GIL (gil.h), with
 * costs measured on a real PyTorch (tests/torch/calibrate_dp.py), counted the way PyTorch's twin of
 * the model would incur them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dp_internal.h"

/* Measured by tests/torch/calibrate_dp.py (PyTorch 2.11, Python 3.12, 2× H200 host, cudnn.benchmark
 * off, median of 100 calls; run by tests/bench_stage2.sh on 2026-11-29 — docs/stage2.md). Rerun it on
 * your machine: it prints the flags to pass. op_us is the serialized (GIL-held) part of one of
 * ResNet-18's forward ops: 46.5 µs per op from one thread, 70.8 µs with two threads at once, and the
 * difference, 24.24 µs (70.77 − 46.54 = 24.23 as printed; the script subtracts unrounded figures), is
 * the default (a conv's Python, with its argument parsing, costs more than a tiny elementwise
 * op's). A lower bound: the rest of an op (22.3 µs) cannot hide the other thread's turn, so two
 * lock-bound threads take ~2 × the serialized part per op, and
 * 70.8 µs means ~35 µs; with 24.24 the model's two threads take ~48.5 µs an op (its README says so).
 *
 * plan_us / plan_bench_us: what planning one forward convolution costs a thread whose plan cache
 * is empty (plan_cache.h), with cudnn.benchmark off / on: a new thread's first forward minus a warm
 * forward, divided by ResNet-18's 20 convolutions (PyTorch 2.11, 2× H200, batch 128, run by
 * tests/bench_stage2.sh on 2026-11-30; docs/logs/bench_stage2_2xH200_2026-11-30.txt). Off: 983 µs,
 * calibrate_dp.py's figure ((21.91 − 2.25) ms / 20, median of 5 new threads; dp_thread_cost.py in
 * the same run gave 1228 µs). On: 26334 µs, dp_thread_cost.py's ((529.00 − 2.33) ms / 20, median of
 * 5 new threads, 412–579 ms), not that calibration's 74723 µs, which was the mean of only 2 new
 * threads while a new thread's first benchmark-on forward now and then takes ~2.5 s (384–2484 ms in
 * docs/logs/dp_thread_cost_2xH200_2026-11-30.jsonl); calibrate_dp.py now times 5 for both.
 * calibrate_dp.py measures both on your machine and prints the flags. */
DpConfig dp_config_defaults(void) {
    return (DpConfig){.p2p = 1, .thread_pool = 0, .switch_ms = 5.0, .op_us = 24.24, .call_us = 40.6,
                      .module_us = 14.04, .param_us = 11.92, .thread_us = 127.0, .host_us = -1.0,
                      .plan_us = 983.0, .plan_bench_us = 26334.0, .p2p_flag = "on"};
}

/* Stage 2's flags, bound to *c. The table is static: stage 2 has one DpConfig for the program. */
const Option *dp_options(DpConfig *c) {
    static Option rows[14];
    const Option r[] = {
        {"gpus", OPT_INT, &c->gpus, 1, DP_MAX_DEVICES, NULL,
         "devices to use (DataParallel device_ids); auto: every visible GPU, or 2 virtual devices on the "
         "CPU backend. More than the visible GPUs share them round-robin"},
        {"gil-switch-ms", OPT_FLOAT, &c->switch_ms, 0.001, 1000, NULL,
         "the GIL's switch interval in ms (sys.setswitchinterval)"},
        {"gil-op-us", OPT_FLOAT, &c->op_us, 0, 1e5, NULL,
         "modelled Python per forward op, held under the GIL (calibrate_dp.py on a 2x H200 host: 24.24)"},
        {"gil-host-call-us", OPT_FLOAT, &c->call_us, 0, 1e5, NULL,
         "modelled Python per call of scatter / replicate / parallel_apply / gather and their backward "
         "(tests/torch/calibrate_dp.py measures it)"},
        {"gil-host-module-us", OPT_FLOAT, &c->module_us, 0, 1e5, NULL,
         "replicate's Python per module per replica (calibrate_dp.py)"},
        {"gil-host-param-us", OPT_FLOAT, &c->param_us, 0, 1e5, NULL,
         "replicate's and reduce-add's Python per parameter or buffer per replica (calibrate_dp.py)"},
        {"gil-host-thread-us", OPT_FLOAT, &c->thread_us, 0, 1e5, NULL,
         "parallel_apply's Python per new thread: start-up and _worker's contexts (calibrate_dp.py)"},
        {"gil-host-us", OPT_FLOAT, &c->host_us, -1, 1e7, NULL,
         "DataParallel's own Python per step in µs: -1 = from the --gil-host-* costs; another value "
         "scales them to that total (0: none)"},
        {"dp-plan-us", OPT_FLOAT, &c->plan_us, 0, 1e7, NULL,
         "what planning one forward convolution costs a thread with an empty plan cache, µs, "
         "cudnn.benchmark off: our real cuDNN calls plus a charge up to this (calibrate_dp.py; 0: "
         "only the real calls)"},
        {"dp-plan-bench-us", OPT_FLOAT, &c->plan_bench_us, 0, 1e8, NULL,
         "the same with --cudnn-benchmark: a real cudnnFind search plus a charge up to this "
         "(calibrate_dp.py)"},
        {"no-python", OPT_FLAG, &c->no_python, 0, 0, NULL,
         "the 'what if there were no Python' experiment: --gil-op-us 0 --gil-host-us 0"},
        {"dp-thread-pool", OPT_FLAG, &c->thread_pool, 0, 0, NULL,
         "persistent forward threads instead of PyTorch's new thread per replica every step"},
        {"p2p", OPT_CHOICE, &c->p2p_flag, 0, 0, "on|off",
         "off: every copy between GPUs goes through host memory, as between GPUs without peer access"},
        {NULL, 0, NULL, 0, 0, NULL, NULL},
    };
    _Static_assert(sizeof r == sizeof rows, "dp_options: rows[] must hold every row");
    memcpy(rows, r, sizeof r);
    return rows;
}

void dp_config_resolve(DpConfig *c, DeviceKind kind) {
    if (c->no_python) {
        static const char *const python[] = {"gil-op-us", "gil-host-us", "gil-host-call-us", "gil-host-module-us",
                                             "gil-host-param-us", "gil-host-thread-us", NULL};
        for (const char *const *f = python; *f; f++)
            if (cli_given(*f))
                die_user("--no-python sets every modelled Python cost to 0, so --%s would be ignored: drop "
                         "one of the two", *f);
        c->op_us = 0, c->host_us = 0;
    } else if (c->host_us == 0) { /* a total of 0: every --gil-host-* cost scaled to nothing, as --no-python */
        static const char *const host[] = {"gil-host-call-us", "gil-host-module-us", "gil-host-param-us",
                                           "gil-host-thread-us", NULL};
        for (const char *const *f = host; *f; f++)
            if (cli_given(*f))
                die_user("--gil-host-us 0 scales every --gil-host-* cost to 0, so --%s would be ignored: drop one of "
                         "the two", *f);
    }
    c->evaluating = cli_given("evaluate");
    if (c->evaluating) c->gpus = 1; /* config_resolve refuses an explicit --gpus with it */
    if (!c->gpus) c->gpus = kind == DEV_CUDA ? device_cuda_count() : 2;
    /* No Python modelled at all: the GIL is never taken, so its switch interval has nothing to act on.
     * The per-thread cost counts only where threads start every step (not with --dp-thread-pool); one
     * device charges scatter's call alone (host_cost_us; a --gil-host-us total with it at 0 is
     * refused in dp_python_init). */
    const int thread_cost = c->thread_us && !c->thread_pool;
    int no_host = c->host_us == 0 ||
                  (c->host_us < 0 && !c->call_us && (c->gpus == 1 || (!c->module_us && !c->param_us && !thread_cost)));
    if (c->op_us == 0 && no_host && cli_given("gil-switch-ms"))
        die_user("%s, so the GIL is never taken and --gil-switch-ms would be ignored: %s",
                 c->no_python ? "--no-python models no Python" : dp_no_python_why(c),
                 c->no_python ? "drop one of the two" : "drop --gil-switch-ms, or give a cost above 0");
    if (c->p2p_flag) c->p2p = !strcmp(c->p2p_flag, "on");
    /* The replica threads run the model one op at a time (dp_threads.c), as nn.DataParallel's
     * replicas do, on fp32 NCHW (PyTorch's default layout) — the typed channels-last walk casts
     * the whole model's weights first and cannot be cut into single ops. */
    if (model_layout_chosen() == 1)
        die_user("stage 2 runs NCHW: --layout nhwc is not available for DataParallel (drop it, or "
                 "compare stage 1 --layout nchw against stage 2)");
    model_default_layout(0);
    /* ...and launch by launch, as PyTorch's eager replicas do: no CUDA graphs */
    model_default_graphs(0);
}

/* Why no Python is modelled, for the messages that say so. */
const char *dp_no_python_why(const DpConfig *c) {
    if (c->no_python) return "--no-python";
    if (c->gpus == 1 && c->host_us != 0) /* the other --gil-host-* costs may be set: one device never uses them */
        return "--gil-op-us is 0, and with one device DataParallel's only own Python is scatter's call, whose "
               "--gil-host-call-us is 0";
    if (c->thread_pool && c->thread_us && c->host_us != 0)
        return "every --gil-* cost is 0 but --gil-host-thread-us, which is charged per new thread, and "
               "--dp-thread-pool starts none";
    return "every --gil-* cost is 0";
}

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
void dp_interpret(DataParallel *dp, GilThread *t, double us, double *charged_s) {
    if (!dp->python || us <= 0) return;
    gil_acquire(&dp->gil, t);
    gil_hold_for(&dp->gil, t, us);
    gil_release(&dp->gil, t);
    *charged_s += us * 1e-6;
}

void dp_gil_roundtrip(DataParallel *dp, GilThread *t) {
    if (!dp->python) return;
    gil_acquire(&dp->gil, t);
    gil_release(&dp->gil, t);
}

void dp_python_init(DataParallel *dp) {
    const DpConfig *cfg = &dp->cfg;
    Model *m = dp->master;
    dp->n_modules = torch_module_count(m);
    int bns = 0;
    for (int l = 0; l < m->n_layers; l++) bns += m->layers[l].kind == LAYER_BN;
    dp->n_tensors = m->n_params + 3 * bns; /* + BN's running_mean, running_var, num_batches_tracked */

    /* --gil-host-us: the DataParallel costs scaled to a given total per full step */
    dp->host_scale = 1.0;
    if (cfg->host_us < 0 && cfg->host_us != -1)
        die_user("--gil-host-us %g: give -1 (the --gil-host-* costs as they are) or a total of 0 or more µs",
                 cfg->host_us);
    if (cfg->host_us >= 0) {
        int sizes[DP_MAX_DEVICES];
        double full = host_cost_us(dp, dp_chunks(dp->max_batch, dp->n, sizes));
        if (full <= 0 && cfg->host_us > 0 && dp->n == 1) /* host_cost_us: one device charges scatter's call alone */
            die_user("--gil-host-us %g: with one device DataParallel's only own Python is scatter's call, and "
                     "--gil-host-call-us is 0, so there is nothing to scale (set it, or pass --gil-host-us 0)",
                     cfg->host_us);
        if (full <= 0 && cfg->host_us > 0)
            die_user("--gil-host-us %g: every --gil-host-* cost is 0, so there is nothing to scale "
                     "(set them, or pass --gil-host-us 0)", cfg->host_us);
        dp->host_scale = full > 0 ? cfg->host_us / full : 0;
    }
    dp->python = dp_python_us(dp, dp->max_batch, NULL, NULL) > 0;
    gil_init(&dp->gil, cfg->switch_ms);
    gil_thread_init(&dp->main, "main");
    gil_thread_start(&dp->gil, &dp->main);
}
