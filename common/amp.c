/* amp.c — the --amp flags and the GradScaler (see amp.h). */
#include "amp.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "ops.h"
#include "trainer.h"

void amp_defaults(AmpConfig *a, const char *default_amp) {
    *a = (AmpConfig){.amp = default_amp, .init_scale = 65536.0, .growth_factor = 2.0,
                     .backoff_factor = 0.5, .growth_interval = 2000, .grad_comm = "fp32",
                     .show_scaler = "", .channels_last = -1};
}

Option *amp_options(AmpConfig *a, const Option *more) {
    const double above0 = nextafter(0.0, INFINITY), above1 = nextafter(1.0, INFINITY);
    const double below1 = nextafter(1.0, 0.0);
    /* the largest number that rounds to a finite float (FLT_MAX: so does its printed 3.40282347e+38);
     * torch takes any init_scale whose float is finite */
    const double top_float = nextafter((double)FLT_MAX + ldexp(1.0, 103), 0.0);
    const Option rows[] = {
        {"amp", OPT_CHOICE, &a->amp, 0, 0, "fp16|bf16|off",
         "autocast type: conv and linear in fp16 or bf16, loss in fp32, fp32 master weights "
         "(bf16 needs a GPU of compute capability 8.0+); off = fp32"},
        {"init-scale", OPT_FLOAT, &a->init_scale, above0, top_float, NULL,
         "GradScaler init_scale: the first loss scale (fp16)"},
        {"growth-factor", OPT_FLOAT, &a->growth_factor, above1, 1e6, NULL,
         "GradScaler growth_factor: scale ·= this after growth-interval finite steps in a row"},
        {"backoff-factor", OPT_FLOAT, &a->backoff_factor, above0, below1, NULL,
         "GradScaler backoff_factor: scale ·= this when a step had an inf/NaN gradient"},
        {"growth-interval", OPT_INT, &a->growth_interval, 1, 2147483647, NULL,
         "GradScaler growth_interval: finite steps in a row before the scale grows"},
        {"no-grad-scaler", OPT_FLAG, &a->no_grad_scaler, 0, 0, NULL,
         "fp16 without the GradScaler: the experiment of what it prevents (gradients underflow to "
         "0); turns on --grad-stats"},
        {"channels-last", OPT_FLAG, &a->channels_last, 0, 0, NULL,
         "keep activations in NHWC on the GPU (torch.channels_last): cuDNN's native layout for "
         "tensor-core convolutions — auto: as --layout says, NHWC unless --layout nchw; no effect on the CPU backend"},
        {"grad-stats", OPT_FLAG, &a->grad_stats, 0, 0, NULL,
         "count zero and non-finite gradient elements at every optimizer step (in the report)"},
        {"grad-comm", OPT_CHOICE, &a->grad_comm, 0, 0, "fp32|fp16|bf16",
         "type of the gradient all-reduce: fp32 (DDP's default), or fp16/bf16 as DDP's fp16_compress_hook / "
         "bf16_compress_hook (half the bytes)"},
        {"show-scaler", OPT_STR, &a->show_scaler, 0, 0, NULL,
         "PATTERN of F (finite) and I (inf gradient) steps: print the scale after each "
         "scaler.update() on one line and exit (with --init-scale, --growth-factor, "
         "--backoff-factor, --growth-interval)"},
        {"test-inf-step", OPT_INT64, &a->test_inf_step, 0, 1e12, NULL,
         "TEST ONLY: make rank 0's loss gradient +inf at optimizer step K (from 1, a resumed run's earlier "
         "steps included; 0 = off) — the "
         "step must be skipped on every rank and the scale halved"},
    };
    return cli_rows(rows, sizeof rows / sizeof rows[0], more);
}

void amp_check(const AmpConfig *a) {
    Precision p = precision_parse(a->amp);
    if (a->no_grad_scaler && p != PREC_FP16)
        die_user("--no-grad-scaler only applies to --amp fp16 (bf16 and off never use a scaler): drop "
                 "--no-grad-scaler (or train with --amp fp16)");
    if (a->test_inf_step > 0 && (p != PREC_FP16 || a->no_grad_scaler))
        die_user("--test-inf-step needs the GradScaler: use it with --amp fp16 and without "
                 "--no-grad-scaler");
    if (a->show_scaler[0]) {
        if (cli_given("show-sampler"))
            die_user("--show-scaler and --show-sampler are two lessons: run them one at a time");
        if (a->no_grad_scaler) die_user("--show-scaler shows fp16's GradScaler: drop --no-grad-scaler");
        if (p != PREC_FP16)
            die_user("--show-scaler shows fp16's GradScaler: drop --amp %s (bf16 and off never use one)", a->amp);
        return; /* the lesson may start anywhere, subnormal scales included (torch's fixture does) */
    }
    /* The scaler's knobs mean nothing without a scaler: refused rather than silently ignored. */
    if (p != PREC_FP16 || a->no_grad_scaler) {
        static const char *const knobs[] = {"init-scale", "growth-factor", "backoff-factor", "growth-interval"};
        char mode[32];
        if (a->no_grad_scaler) snprintf(mode, sizeof mode, "--no-grad-scaler");
        else snprintf(mode, sizeof mode, "--amp %s", a->amp);
        for (int i = 0; i < 4; i++)
            if (cli_given(knobs[i]))
                die_user("--%s tunes fp16's GradScaler, and %s runs without one: drop --%s (or train with --amp "
                         "fp16%s)", knobs[i], mode, knobs[i], a->no_grad_scaler ? " and the scaler" : "");
    }
    /* A scale whose reciprocal overflows fp32 makes every step a skipped one (unscaling flags an inf
     * 1/scale): a run that could never take a step is refused up front. */
    if (p == PREC_FP16 && !a->no_grad_scaler && !isfinite((float)(1.0 / (double)(float)a->init_scale)))
        die_user("--init-scale %g: 1/scale overflows fp32, so every step would be skipped — train with "
                 "--init-scale 3e-39 or more (the default is 65536)", a->init_scale);
    /* DDP's per-bucket optimizer steps (stage 5's --optimizer-overlap) would step parameters before the
     * scaler, or the gradient statistics, saw the last gradient. */
    const char *overlap = cli_choice("optimizer-overlap");
    if (overlap && strcmp(overlap, "off")) {
        if (p == PREC_FP16 && !a->no_grad_scaler)
            die_user("--optimizer-overlap cannot run under fp16's GradScaler: the scaler must see every gradient "
                     "(inf/NaN) before it lets any parameter step — use --amp bf16 or --amp off, or "
                     "--optimizer-overlap off");
        if (a->grad_stats || a->no_grad_scaler)
            die_user("--optimizer-overlap cannot run with %s: the gradient statistics count every gradient before "
                     "any parameter steps — drop one of the two",
                     a->no_grad_scaler ? "--no-grad-scaler (it counts the gradients)" : "--grad-stats");
    }
}

/* The flag's type, refused with a clear error when it is bf16 and the GPU predates Ampere. */
static Precision supported(const char *flag, const char *value, const Device *d) {
    Precision p = precision_parse(value);
    int major;
    if (p == PREC_BF16 && !amp_bf16_supported(d, &major))
        die_user("--%s bf16 needs a GPU of compute capability 8.0 or newer (Ampere); %s is %d.x: "
                 "use --%s fp16", flag, d->name, major, flag);
    return p;
}

Precision amp_grad_comm(const AmpConfig *a, const Device *d) { return supported("grad-comm", a->grad_comm, d); }

Precision amp_precision(const AmpConfig *a, const Device *d) {
    amp_check(a);
    return supported("amp", a->amp, d);
}

int amp_bf16_supported(const Device *d, int *major) {
    *major = 0;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        CHECK_CUDA(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, d->ordinal));
        return *major >= 8;
    }
#endif
    return 1;
}

/* ---- the scaler ------------------------------------------------------------------------------ */

/* The device block: three floats, an int32 and an int64, laid out at fixed offsets. */
enum { ST_SCALE = 0, ST_INV = 4, ST_FOUND = 8, ST_TRACKER = 12, ST_SKIPPED = 16, ST_BYTES = 24 };

/* Run.save_scaler: scaler.state_dict() into a checkpoint's header (synchronises: a save does anyway). */
static void save_state(void *ctx, CheckpointMeta *meta) {
    GradScaler *s = ctx;
    unsigned char st[ST_BYTES];
    device_copy_d2h(s->dev, st, s->state, ST_BYTES);
    float scale;
    int32_t tracker;
    memcpy(&scale, st + ST_SCALE, 4);
    memcpy(&tracker, st + ST_TRACKER, 4);
    meta->scaler_scale = scale;
    meta->scaler_growth_tracker = tracker;
    meta->scaler_growth_factor = s->growth_factor;
    meta->scaler_backoff_factor = s->backoff_factor;
    meta->scaler_growth_interval = s->growth_interval;
}

/* v as the user would type it: the shortest %g that reads back as v (1.1, not 1.1000000000000001). */
static const char *shortest(double v, char buf[32]) {
    if (v == floor(v) && fabs(v) < 1e15) { /* 100, not 1e+02 */
        snprintf(buf, 32, "%.0f", v);
        return buf;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, 32, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

/* scaler.load_state_dict(): the resumed checkpoint's scale and growth counter into *scale and
 * *tracker — or a note that there is none to take (or that this run has no scaler to take it). */
static void load_state(const GradScaler *s, Run *run, float *scale, int32_t *tracker) {
    const CheckpointMeta *g = &run->resumed;
    const char *path = run->cfg->resume;
    run->scaler_noted = 1; /* whatever happens to the checkpoint's state is said here */
    if (!s->enabled) {
        if (checkpoint_has_scaler(g))
            report_printf(&run->report, "note: checkpoint '%s' holds a GradScaler state (scale %g), which this run "
                                        "does not use: it has no GradScaler (bf16, --amp off or --no-grad-scaler)\n",
                          path, g->scaler_scale);
        return;
    }
    if (!checkpoint_has_scaler(g)) {
        report_printf(&run->report, "note: checkpoint '%s' holds no GradScaler state (%s): the scale starts at "
                                    "--init-scale %g, as a new GradScaler's would\n", path,
                      g->version < 5 ? "an older format" : "saved by a run without one", (double)*scale);
        return;
    }
    /* torch's load_state_dict takes these settings from the checkpoint too; we keep the flags and
     * refuse a mismatch, so that the command line always says what the run does */
    const struct { const char *flag; double saved, now; } set[] = {
        {"growth-factor", g->scaler_growth_factor, s->growth_factor},
        {"backoff-factor", g->scaler_backoff_factor, s->backoff_factor},
        {"growth-interval", (double)g->scaler_growth_interval, s->growth_interval},
    };
    char saved[32], now[32];
    for (int i = 0; i < 3; i++)
        if (set[i].saved != set[i].now)
            die_user("checkpoint '%s' was trained with --%s %s, this run has --%s %s: its GradScaler state means "
                     "something else under it — resume with --%s %s", path, set[i].flag, shortest(set[i].saved, saved),
                     set[i].flag, shortest(set[i].now, now), set[i].flag, saved);
    *scale = (float)g->scaler_scale;
    *tracker = (int32_t)g->scaler_growth_tracker;
    report_printf(&run->report, "GradScaler resumed from the checkpoint: scale %g, %lld finite step%s since it last "
                                "changed (--init-scale is not used)\n", g->scaler_scale,
                  (long long)g->scaler_growth_tracker, g->scaler_growth_tracker == 1 ? "" : "s");
    if (!isfinite((float)(1.0 / (double)*scale)))
        report_printf(&run->report, "warning: that scale is so small that 1/scale overflows: every step will be skipped "
                                    "(the run had diverged: every step it took overflowed) — resume from an earlier "
                                    "checkpoint, perhaps with a lower --lr\n");
}

static void diverge_record(void *ctx);

void scaler_init(GradScaler *s, Device *d, const AmpConfig *a, Precision p, Run *run) {
    int64_t max_steps = run ? run->total_steps : 1;
    *s = (GradScaler){.dev = d, .enabled = p == PREC_FP16 && !a->no_grad_scaler,
                      .growth_factor = a->growth_factor, .backoff_factor = a->backoff_factor,
                      .growth_interval = a->growth_interval, .test_inf_step = a->test_inf_step,
                      .rank = run ? run->rank : 0, .first_step = run ? run->step : 0, .prec = p,
                      .report = run ? &run->report : NULL};
    s->state = device_alloc(d, ST_BYTES, "grad scaler");
    char *base = s->state;
    s->scale = (float *)(base + ST_SCALE);
    s->inv_scale = (float *)(base + ST_INV);
    s->found_inf = (float *)(base + ST_FOUND);
    s->growth_tracker = (int32_t *)(base + ST_TRACKER);
    s->skipped = (int64_t *)(base + ST_SKIPPED);
    /* torch keeps the scale in a float32 tensor: init_scale is rounded to float there too */
    unsigned char init[ST_BYTES] = {0};
    float scale = (float)a->init_scale;
    int32_t tracker = 0;
    s->evaluating = run && run->cfg->evaluate;
    if (run && run->cfg->resume[0] && !s->evaluating) load_state(s, run, &scale, &tracker);
    if (run && s->test_inf_step > 0 && s->test_inf_step <= s->first_step)
        report_printf(&run->report, "note: --test-inf-step %lld is at or before step %lld, where this run resumes: no "
                                    "inf is injected\n", (long long)s->test_inf_step, (long long)s->first_step);
    if (run && s->test_inf_step > run_last_step(run)) /* counted like --steps: optimizer steps from the start */
        report_printf(&run->report, "note: --test-inf-step %lld is after step %lld, this run's last: no inf is "
                                    "injected — give a step from %lld to %lld\n", (long long)s->test_inf_step,
                      (long long)run_last_step(run), (long long)s->first_step + 1, (long long)run_last_step(run));
    float inv = (float)(1.0 / (double)scale);
    memcpy(init + ST_SCALE, &scale, 4);
    memcpy(init + ST_INV, &inv, 4);
    memcpy(init + ST_TRACKER, &tracker, 4);
    device_copy_h2d(d, s->state, init, ST_BYTES);
    if (a->grad_stats || a->no_grad_scaler) {
        s->stats_cap = max_steps < 1 ? 1 : max_steps > 1000000 ? 1000000 : max_steps;
        size_t bytes = (size_t)s->stats_cap * 2 * sizeof(int64_t);
        s->stats = device_alloc(d, bytes, "gradient statistics");
        device_memset0(d, s->stats, bytes);
    }
    device_sync(d); /* `init` is on the stack */
    if (run && s->enabled) run->save_scaler = save_state, run->scaler_ctx = s;
    if (run && s->stats) run->on_diverge = diverge_record, run->diverge_ctx = s;
}

void scaler_destroy(GradScaler *s) {
    if (s->stats) device_free(s->dev, s->stats);
    if (s->state) device_free(s->dev, s->state);
    s->stats = NULL, s->state = NULL;
}

void scaler_scale_loss(GradScaler *s, float *dloss, int64_t count) {
    if (s->test_inf_step > 0 && s->first_step + s->steps + 1 == s->test_inf_step && s->rank == 0) {
        static const float inf = INFINITY; /* static: the async copy may read it later */
        device_copy_h2d(s->dev, dloss, &inf, sizeof inf);
    }
    if (s->enabled) scale_by_device(s->dev, count, dloss, s->scale);
}

void scaler_unscale(GradScaler *s, float *grads, int64_t count) {
    ASSERT(!s->unscaled); /* torch: "unscale_() has already been called on this optimizer since the last update()" */
    if (s->enabled) amp_unscale_check(s->dev, count, grads, s->inv_scale, s->found_inf);
    /* --grad-stats counts the gradients backward produced (unscaled), before clipping changes them */
    if (s->stats && s->steps < s->stats_cap) count_zero_nonfinite(s->dev, count, grads, s->stats + 2 * s->steps);
    s->unscaled = 1;
}

void scaler_step(GradScaler *s, Optimizer *o, float *params, float *grads, int64_t count,
                 double lr) {
    if (!s->unscaled) scaler_unscale(s, grads, count);
    if (s->enabled)
        optim_step_unless(o, params, grads, lr, s->found_inf); /* skipped if found_inf */
    else
        optim_step(o, params, grads, lr);
}

void scaler_update(GradScaler *s) {
    s->steps++; /* here, not in scaler_step: DDP's per-bucket optimizer (--optimizer-overlap) skips that */
    s->unscaled = 0;
    if (!s->enabled) return;
    amp_update_scale(s->dev, s->scale, s->inv_scale, s->growth_tracker, s->found_inf, s->skipped,
                     s->growth_factor, s->backoff_factor, s->growth_interval);
}

float scaler_get_scale(GradScaler *s) {
    if (!s->enabled) return 1.0f;
    float v;
    device_copy_d2h(s->dev, &v, s->scale, sizeof v);
    return v;
}

int64_t scaler_skipped(GradScaler *s) {
    int64_t v = 0;
    if (s->enabled) device_copy_d2h(s->dev, &v, s->skipped, sizeof v);
    return v;
}

void scaler_grad_counts(GradScaler *s, int64_t step, int64_t *zero, int64_t *nonfinite) {
    int64_t v[2] = {0, 0};
    if (s->stats && step >= 0 && step < s->stats_cap && step < s->steps)
        device_copy_d2h(s->dev, v, s->stats + 2 * step, sizeof v);
    *zero = v[0];
    *nonfinite = v[1];
}

/* The per-step gradient counts (--grad-stats, --no-grad-scaler) into *zero and *bad (malloc'd, NULL
 * when none) and a line of the report; returns how many steps they cover. */
static int64_t grad_counts(GradScaler *s, Report *r, int64_t **zero, int64_t **bad) {
    int64_t n = s->stats ? (s->steps < s->stats_cap ? s->steps : s->stats_cap) : 0;
    *zero = *bad = NULL;
    if (!n) return 0;
    int64_t *raw = xmalloc((size_t)n * 2 * sizeof(int64_t));
    device_copy_d2h(s->dev, raw, s->stats, (size_t)n * 2 * sizeof(int64_t));
    int64_t *z = *zero = xmalloc((size_t)n * sizeof(int64_t)), *b = *bad = xmalloc((size_t)n * sizeof(int64_t));
    int64_t zmax = 0, bmax = 0, first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        z[i] = raw[2 * i], b[i] = raw[2 * i + 1];
        if (z[i] > zmax) zmax = z[i];
        if (b[i] > bmax) bmax = b[i];
        if (b[i] && first_bad < 0) first_bad = i;
    }
    free(raw);
    char at[64] = "";
    if (first_bad >= 0) snprintf(at, sizeof at, " (the first at step %lld)", (long long)(s->first_step + first_bad + 1));
    report_printf(r, "gradient elements per step: zero first %lld, last %lld, most %lld; "
                  "non-finite first %lld, last %lld, most %lld%s\n", (long long)z[0], (long long)z[n - 1],
                  (long long)zmax, (long long)b[0], (long long)b[n - 1], (long long)bmax, at);
    return n;
}

/* Run.on_diverge: a diverged run stops before scaler_report, so the counts that show how it got there
 * (--no-grad-scaler's lesson: gradients overflowing to inf without a scaler) are written here, rank 0's
 * alone (the other ranks are stopping: no collective), with "diverged": 1. */
static void diverge_record(void *ctx) {
    GradScaler *s = ctx;
    int64_t *zero, *bad;
    int64_t n = grad_counts(s, s->report, &zero, &bad);
    json_begin(s->report, "amp");
    json_str(s->report, "amp", precision_name(s->prec));
    json_int(s->report, "grad_scaler", s->enabled);
    json_int(s->report, "diverged", 1);
    json_int(s->report, "optimizer_steps", s->steps);
    json_int_list(s->report, "grad_zero_per_step", zero, (int)n);
    json_int_list(s->report, "grad_nonfinite_per_step", bad, (int)n);
    json_end(s->report);
    free(zero), free(bad);
}

void scaler_report(GradScaler *s, const AmpConfig *a, Precision p, Report *r,
                   void (*sum_across)(void *ctx, double *v, int n), void *sum_ctx) {
    float scale = scaler_get_scale(s);
    int64_t skipped = scaler_skipped(s);
    /* Did every rank decide alike? Sum (1, scale, skipped) over the ranks and compare. */
    double v[3] = {1.0, scale, (double)skipped};
    if (sum_across) sum_across(sum_ctx, v, 3);
    int ranks = (int)v[0], agree = v[1] == ranks * (double)scale && v[2] == ranks * (double)skipped;
    if (p == PREC_FP32)
        report_printf(r, "amp: off (fp32)\n");
    else if (s->evaluating) /* --evaluate: a forward under autocast, and no gradient to scale */
        report_printf(r, "amp: %s autocast (evaluation: no gradients, so no GradScaler)\n", precision_name(p));
    else if (s->enabled)
        report_printf(r, "amp: %s autocast, GradScaler scale %g, %lld of %lld optimizer step%s %sskipped "
                      "(inf/NaN gradients)%s\n", precision_name(p), (double)scale, (long long)skipped,
                      (long long)s->steps, s->steps == 1 ? "" : "s", s->first_step ? "since the resume " : "",
                      ranks > 1 ? (agree ? ", the same on every rank" : ", RANKS DISAGREE") : "");
    else
        report_printf(r, "amp: %s autocast, no GradScaler%s\n", precision_name(p),
                      p == PREC_FP16 ? " (--no-grad-scaler)" : " (bf16 has fp32's range)");
    int64_t *zero = NULL, *bad = NULL;
    int64_t n = grad_counts(s, r, &zero, &bad);
    json_begin(r, "amp");
    json_str(r, "amp", precision_name(p));
    json_str(r, "activations", precision_name(p));
    json_str(r, "master_weights", "fp32");
    json_str(r, "grad_comm", a->grad_comm);
    json_int(r, "grad_scaler", s->enabled && !s->evaluating);
    if (s->evaluating) json_int(r, "evaluating", 1); /* --evaluate: no scale, no steps */
    else {
        json_num(r, "scale", scale);
        json_int(r, "skipped_steps", skipped);
        json_int(r, "optimizer_steps", s->steps);
    }
    json_int(r, "ranks", ranks);
    json_int(r, "ranks_agree", agree);
    if (n) {
        json_int_list(r, "grad_zero_per_step", zero, (int)n);
        json_int_list(r, "grad_nonfinite_per_step", bad, (int)n);
    }
    json_end(r);
    free(zero);
    free(bad);
}

/* ---- --show-scaler ----------------------------------------------------------------------------- */

int amp_show_scaler(const AmpConfig *a) {
    static const char *const uses[] = {"show-scaler", "amp", "init-scale", "growth-factor", "backoff-factor",
                                       "growth-interval", NULL};
    const char *pat = a->show_scaler;
    if (!pat[0] || strspn(pat, "FI") != strlen(pat))
        die_user("--show-scaler wants a pattern of F (finite step) and I (inf gradient) letters, "
                 "e.g. FFIFF; got '%s'", pat);
    cli_lesson_flags("show-scaler", "the scale after each update", uses);
    /* A real GradScaler on the CPU backend with one parameter whose gradient is 1 or inf. */
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    AmpConfig c = *a;
    c.no_grad_scaler = 0, c.grad_stats = 0, c.test_inf_step = 0;
    GradScaler s;
    scaler_init(&s, &d, &c, PREC_FP16, NULL);
    Optimizer o;
    optim_init(&o, &d, 1, 0.0, 0.0, 0.0);
    float param = 0.0f, grad, leaves_at = 0.0f;
    /* the first F step taken where 1/scale overflows fp32: ours skips it, torch's does not (at a scale of 0
     * both stay 0: nothing to say) */
    int64_t leaves = 0;
    for (const char *q = pat; *q; q++) {
        float before = scaler_get_scale(&s);
        if (*q == 'F' && !leaves && before > 0.0f && !isfinite((float)(1.0 / (double)before)))
            leaves = q - pat + 1, leaves_at = before;
        grad = *q == 'I' ? INFINITY : 1.0f;
        scaler_step(&s, &o, &param, &grad, 1, 0.0);
        scaler_update(&s);
        printf(q == pat ? "%.9g" : " %.9g", (double)scaler_get_scale(&s));
    }
    printf("\n");
    if (leaves) /* the one place these scales are not torch's (docs/semantics.md): say so, not print it as torch's */
        printf("note: step %lld (F) comes at scale %.9g, whose 1/scale overflows fp32: this scaler counts it as an "
               "overflow and backs off, where torch's GradScaler counts it a finite step (it checks only the scaled "
               "gradient, and unscales it to inf) — from that step on, these scales are not torch's "
               "(docs/semantics.md)\n", (long long)leaves, (double)leaves_at);
    optim_destroy(&o);
    scaler_destroy(&s);
    device_destroy(&d);
    return 0;
}
