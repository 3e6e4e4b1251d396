/* dp_report.c — DataParallel's phase timing and its report.
 *
 * A step is cut into phases (dp.h's DpPhase) by marks on device 0's compute stream — the stream
 * every copy of the step is ordered on — so the phases partition the step and add up to it. Each
 * phase is reported next to the modelled Python charged inside it, with the GIL's statistics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"

const char *const dp_phase_name[DP_PHASES] = {"input", "scatter", "replicate", "forward", "gather",
                                              "loss",  "backward", "reduce",   "optimizer"};

void dp_timing_init(DataParallel *dp, int steps_cap) {
    dp->cap = steps_cap;
    dp->py_ms = xcalloc((size_t)steps_cap, sizeof *dp->py_ms);
    dp->wait_ms = xcalloc((size_t)steps_cap, sizeof *dp->wait_ms);
    dp->plan = xcalloc((size_t)steps_cap, sizeof *dp->plan);
    dp->ks = xcalloc((size_t)steps_cap, sizeof *dp->ks);
    dp->at = xcalloc((size_t)steps_cap, sizeof *dp->at);
    for (int s = 0; s < steps_cap; s++)
        for (int p = 0; p < DP_PHASES; p++) timemark_init(&dp->at[s][p], dp->devs[0]);
}

void dp_timing_destroy(DataParallel *dp) {
    for (int s = 0; s < dp->cap; s++)
        for (int p = 0; p < DP_PHASES; p++) timemark_destroy(&dp->at[s][p]);
    free(dp->at), free(dp->py_ms), free(dp->wait_ms), free(dp->plan), free(dp->ks);
    for (int j = 0; j < 3; j++) free(dp->step_plan[j]);
    for (int p = 0; p < DP_PHASES; p++) free(dp->ph_ms[p]), free(dp->ph_py_ms[p]);
    free(dp->step_ms), free(dp->step_wait_ms);
}

void dp_mark(DataParallel *dp, int m) {
    ASSERT(m >= 0 && m < DP_PHASES);
    ASSERT(dp->step < dp->cap); /* more steps in one epoch than dp_init was told */
    timemark_record(&dp->at[dp->step][m], dp->devs[0]);
    device_bind(dp->devs[0]);
}

void dp_step_end(DataParallel *dp) {
    dp_mark(dp, DP_OPTIMIZER);
    for (int p = 0; p < DP_PHASES; p++) dp->py_ms[dp->step][p] = 1e3 * dp->cur_py_s[p], dp->cur_py_s[p] = 0;
    dp->step++;
}

void dp_describe(const DataParallel *dp, Report *r) {
    const DpConfig *c = &dp->cfg;
    if (c->evaluating) return; /* --evaluate: no replicas, no modelled Python, nothing of the step to describe */
    char names[640] = ""; /* 400, one more name (≤ 96) and the tail */
    int shown = 0;
    for (; shown < dp->n && strlen(names) < 400; shown++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", shown ? ", " : "", dp->devs[shown]->name);
    /* the line says how many there are: a list cut short says so, and names the last */
    if (shown < dp->n)
        snprintf(names + strlen(names), sizeof names - strlen(names), ", … (%d more, to %.40s)", dp->n - shown,
                 dp->devs[dp->n - 1]->name);
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
    report_printf(r, "convolution plans: each forward thread has its own cache; planning one costs our real "
                     "cuDNN calls (%s) plus a calibrated charge up to %g µs (--dp-plan%s-us)\n",
                  dp->devs[0]->kind == DEV_CPU ? "none on the CPU backend"
                  : dp->devs[0]->benchmark   ? "a cudnnFind search, --cudnn-benchmark"
                                             : "cuDNN's heuristics",
                  dp->devs[0]->benchmark ? c->plan_bench_us : c->plan_us, dp->devs[0]->benchmark ? "-bench" : "");
    double host_us = 0, ops_us = 0;
    if (dp->python) dp_python_us(dp, dp->max_batch, &host_us, &ops_us);
    /* The header's settings as a record too: without it a report of the pool, of --no-python or of
     * --p2p off reads exactly like the default's, and the "phases" record cannot be told apart. */
    json_begin(r, "dp");
    json_int(r, "replicas", dp->n);
    json_str(r, "forward", dp->n == 1 ? "main thread" : c->thread_pool ? "thread pool" : "new threads");
    json_int(r, "p2p", c->p2p);
    json_num(r, "plan_charge_us", dp->devs[0]->benchmark ? c->plan_bench_us : c->plan_us);
    json_int(r, "python", dp->python);
    json_num(r, "switch_ms", c->switch_ms);
    json_num(r, "op_us", dp->python ? c->op_us : 0);
    json_num(r, "host_ms_per_step", 1e-3 * host_us); /* DataParallel's own, full step, after --gil-host-us */
    json_int(r, "modules", dp->n_modules);
    json_int(r, "tensors", dp->n_tensors);
    json_end(r);
    if (!dp->python) {
        report_printf(r, "modelled Python: none (%s): the GIL is never taken\n", dp_no_python_why(c));
        return;
    }
    if (dp->n == 1) { /* no replicate, reduce or thread: the module, called after scatter (host_cost_us) */
        report_printf(r,
                      "modelled Python, charged as time holding the GIL (switch interval %g ms): %g µs per "
                      "forward op × %d ops, and DataParallel's own %.2f ms per step (one device: scatter's call "
                      "alone, --gil-host-call-us %g%s; no replicas, so nothing is replicated or reduced)\n",
                      c->switch_ms, c->op_us, dp->master->n_layers, 1e-3 * host_us, c->call_us,
                      c->host_us >= 0 ? ", scaled by --gil-host-us" : "");
        return;
    }
    report_printf(r,
                  "modelled Python, charged as time holding the GIL (switch interval %g ms): %g µs per "
                  "forward op × %d ops per replica, and DataParallel's own %.2f ms per step (replicate "
                  "copies %d modules and %d tensors per replica; --gil-host-call-us %g "
                  "--gil-host-module-us %g --gil-host-param-us %g --gil-host-thread-us %g%s)\n",
                  c->switch_ms, c->op_us, dp->master->n_layers, 1e-3 * host_us, dp->n_modules,
                  dp->n_tensors, c->call_us, c->module_us, c->param_us, c->thread_us,
                  c->host_us >= 0 ? ", scaled by --gil-host-us" : "");
}

void dp_epoch_end(DataParallel *dp) {
    int steps = dp->step;
    if (steps == 0) return;
    if (dp->n_samples + steps > dp->cap_samples) {
        dp->cap_samples = 2 * (dp->n_samples + steps);
        for (int p = 0; p < DP_PHASES; p++) {
            dp->ph_ms[p] = xrealloc(dp->ph_ms[p], (size_t)dp->cap_samples * sizeof(double));
            dp->ph_py_ms[p] = xrealloc(dp->ph_py_ms[p], (size_t)dp->cap_samples * sizeof(double));
        }
        dp->step_ms = xrealloc(dp->step_ms, (size_t)dp->cap_samples * sizeof(double));
        dp->step_wait_ms = xrealloc(dp->step_wait_ms, (size_t)dp->cap_samples * sizeof(double));
        for (int j = 0; j < 3; j++)
            dp->step_plan[j] = xrealloc(dp->step_plan[j], (size_t)dp->cap_samples * sizeof(double));
    }
    for (int s = 1; s < steps; s++) { /* step 0 of an epoch has no previous step to measure input from */
        if (dp->steps_seen + s < WARMUP_STEPS) continue;
        double ms[DP_PHASES], total = 0;
        for (int p = 0; p < DP_PHASES; p++) {
            int s_from = p == 0 ? s - 1 : s, m_from = p == 0 ? DP_OPTIMIZER : p - 1;
            ms[p] = timemark_ms(&dp->at[s_from][m_from], &dp->at[s][p]);
            total += ms[p];
        }
        int i = dp->n_samples++;
        for (int p = 0; p < DP_PHASES; p++) {
            dp->ph_ms[p][i] = ms[p];
            dp->ph_py_ms[p][i] = dp->py_ms[s][p];
        }
        dp->step_ms[i] = total;
        dp->step_wait_ms[i] = dp->wait_ms[s];
        for (int j = 0; j < 3; j++) dp->step_plan[j][i] = dp->plan[s][j];
        if (dp->ks[s] > 1) dp->timed_replica_threads = 1;
    }
    dp->steps_seen += steps;
    dp->step = 0;
}

static void report_gil(DataParallel *dp, Report *r);

void dp_report(DataParallel *dp, Run *run) {
    if (run->evaluated) return; /* --evaluate: no step to sum up */
    Report *r = &run->report;
    int n = dp->n_samples;
    if (n == 0) { /* no phase to time, but the GIL counted every step: its table still says what it saw */
        report_printf(r, "DataParallel phases: too few steps to time (the first %d are warm-up, and the "
                         "first step of each epoch has no input phase)\n", WARMUP_STEPS);
        report_gil(dp, r);
        return;
    }
    double med[DP_PHASES], py[DP_PHASES], sum = 0, py_sum = 0;
    for (int p = 0; p < DP_PHASES; p++) {
        med[p] = stats_median_copy(dp->ph_ms[p], n);
        py[p] = stats_median_copy(dp->ph_py_ms[p], n);
        sum += med[p], py_sum += py[p];
    }
    double step = stats_median_copy(dp->step_ms, n), wait = stats_median_copy(dp->step_wait_ms, n);
    double plan_misses = stats_median_copy(dp->step_plan[0], n), plan_ms = stats_median_copy(dp->step_plan[1], n);
    double plan_own_ms = stats_median_copy(dp->step_plan[2], n);
    /* The check is against the step time measured apart from the phases; a run with no timed step
     * (all warm-up, or each epoch's untimed last) has none to check against. */
    double run_step = run->n_times ? stats_median_copy(run->times, run->n_times) : NAN;
    double off = run_step > 0 ? (sum - run_step) / run_step : NAN;
    int adds_up = fabs(off) <= 0.10;
    const char *where = dp->devs[0]->kind == DEV_CUDA ? "device 0's stream (CUDA events)" : "wall clock";
    report_printf(r, "DataParallel phases over %d step%s (median ms per step, timed on %s; modelled "
                     "Python = host time charged under the GIL, all threads together)\n", n, n == 1 ? "" : "s", where);
    report_printf(r, "  %-10s %9s %16s\n", "phase", "measured", "modelled Python");
    for (int p = 0; p < DP_PHASES; p++) {
        char extra[64] = "";
        if (p == DP_FORWARD && dp->python) snprintf(extra, sizeof extra, "   (GIL wait %.3f per replica thread)", wait);
        if (py[p] > 0) report_printf(r, "  %-10s %9.3f %16.3f%s\n", dp_phase_name[p], med[p], py[p], extra);
        else report_printf(r, "  %-10s %9.3f %16s%s\n", dp_phase_name[p], med[p], "-", extra);
    }
    if (isfinite(off))
        report_printf(r, "  %-10s %9.3f %16.3f   vs step time %.3f ms (median ms/it): %s (%+.1f%%)\n", "sum", sum,
                      py_sum, run_step, adds_up ? "adds up" : "DOES NOT add up", 100 * off);
    else
        report_printf(r, "  %-10s %9.3f %16.3f   vs step time: n/a (no step timed after the %d warm-up steps: "
                      "nothing to check the sum against)\n", "sum", sum, py_sum, WARMUP_STEPS);
    report_printf(r, "  forward's convolution planning, per replica thread: %.3f ms per step, %g plan-cache "
                     "misses (our cuDNN calls %.3f ms + calibrated charge %.3f ms; %s)\n",
                  plan_ms, plan_misses, plan_own_ms, plan_ms - plan_own_ms,
                  !dp->timed_replica_threads ? "the main thread's cache" /* one chunk: no threads */
                  : dp->cfg.thread_pool    ? "persistent threads keep their caches"
                                           : "new threads every step start with empty caches");
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
    /* The median of each step's phases added up (a median of wholes, where the sum above adds medians
     * of parts) against step_ms: the tests check these two. Not means: the phases time step s from step
     * s−1's optimizer to its own, the trainer from step s's start to step s+1's, so the two sets of
     * steps are one apart, and one slow step in either (a busy machine) moves its mean alone. */
    json_num(r, "phase_step_ms", step);
    json_num(r, "python_ms", py_sum);
    json_num(r, "forward_gil_wait_ms", wait);
    json_num(r, "plan_misses_per_thread", plan_misses);
    json_num(r, "plan_ms_per_thread", plan_ms);
    json_num(r, "plan_cudnn_ms_per_thread", plan_own_ms);
    if (isfinite(off)) json_int(r, "adds_up", adds_up);
    else json_num(r, "adds_up", NAN); /* null: not checked */
    json_end(r);
    report_gil(dp, r);
}

/* The GIL's statistics over every step of the run (warm-up included): console table and JSON. */
static void report_gil(DataParallel *dp, Report *r) {
    Gil *g = &dp->gil;
    if (!dp->python) {
        report_printf(r, "GIL: never taken (no modelled Python)\n");
        return;
    }
    report_printf(r, "GIL (switch interval %g ms): %lld hand-off%s, %lld forced switch%s over %lld step%s\n",
                  dp->cfg.switch_ms, (long long)g->handoffs, g->handoffs == 1 ? "" : "s",
                  (long long)g->forced_switches, g->forced_switches == 1 ? "" : "es", (long long)dp->steps_seen,
                  dp->steps_seen == 1 ? "" : "s");
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
