/* trainer.c — step statistics, evaluation and report for a run (its input: input.c; the checkpoints it
 * writes: save.c; resuming from one: resume.c). */
#include "trainer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "cli.h"
#include "cpu_threads.h"
#include "hash.h"
#include "ops.h"
#include "peak.h"
#include "stop.h"
#include "trace.h"
#include "trainer_internal.h" /* what input.c, save.c and resume.c share */
#include "worker_status.h" /* die_collateral: a rank that stops because of another */

/* ---- step log -------------------------------------------------------------------------------- */

void steplog_init(StepLog *s, Device *dev, int cap) {
    memset(s, 0, sizeof *s);
    s->dev = dev;
    s->cap = cap;
    s->loss = device_alloc(dev, (size_t)cap * sizeof(float), "step statistics");
    s->correct = device_alloc(dev, (size_t)cap * sizeof(int32_t), "step statistics");
    s->n = xcalloc((size_t)cap, sizeof(int));
    s->k = xcalloc((size_t)cap, sizeof(int));
    s->at = xcalloc((size_t)cap + 1, sizeof *s->at);
    for (int i = 0; i <= cap; i++) timemark_init(&s->at[i], dev);
}

void steplog_destroy(StepLog *s) {
    device_free(s->dev, s->loss);
    device_free(s->dev, s->correct);
    free(s->n);
    free(s->k);
    for (int i = 0; i <= s->cap; i++) timemark_destroy(&s->at[i]);
    free(s->at);
}

static void mark(StepLog *s, int i) { timemark_record(&s->at[i], s->dev); }

int steplog_micro(StepLog *s, int micro, int n, int k) {
    ASSERT(s->count < s->cap && k >= 1);
    if (micro == 0) { /* a new step: its time starts here */
        s->step_first = s->count;
        mark(s, s->steps++);
    }
    ASSERT(s->steps > 0);
    int i = s->count++;
    s->n[i] = n;
    s->k[i] = k;
    return i;
}

int steplog_begin(StepLog *s, int n) { return steplog_micro(s, 0, n, 1); }

double steplog_step_loss(StepLog *s) {
    int first = s->step_first, m = s->count - first;
    ASSERT(m >= 1);
    float v[64];
    double lsum = 0, nsum = 0;
    for (int at = 0; at < m; at += 64) { /* a step's entries are contiguous: one copy per 64 */
        int c = m - at < 64 ? m - at : 64;
        device_copy_d2h(s->dev, v, s->loss + first + at, (size_t)c * sizeof(float));
        /* entry i holds mean_i / k_i: the step's mean is Σ loss·k·n / Σ n (exactly the loss for
         * one entry with k = 1) */
        for (int i = 0; i < c; i++) {
            lsum += (double)v[i] * s->k[first + at + i] * s->n[first + at + i];
            nsum += s->n[first + at + i];
        }
    }
    return lsum / nsum;
}

int steplog_finish(StepLog *s, double *mean_loss, double *accuracy, double *times) {
    int k = s->count, timed = 0, steps = s->steps;
    device_sync(s->dev);
    float *loss = xmalloc((size_t)(k + 1) * sizeof(float));
    int32_t *corr = xmalloc((size_t)(k + 1) * sizeof(int32_t));
    if (k) {
        device_copy_d2h(s->dev, loss, s->loss, (size_t)k * sizeof(float));
        device_copy_d2h(s->dev, corr, s->correct, (size_t)k * sizeof(int32_t));
    }
    double lsum = 0, csum = 0, nsum = 0;
    for (int i = 0; i < k; i++) {
        lsum += (double)loss[i] * s->k[i] * s->n[i];
        csum += corr[i];
        nsum += s->n[i];
    }
    for (int i = 0; i < steps; i++) {
        /* A step lasts from its start mark to the next step's. The epoch's last step has no next
         * one (what follows it is evaluation), so it is not timed. */
        if (!times || i + 1 == steps) continue;
        times[timed++] = timemark_ms(&s->at[i], &s->at[i + 1]);
    }
    if (mean_loss) *mean_loss = nsum ? lsum / nsum : NAN;
    if (accuracy) *accuracy = nsum ? csum / nsum : NAN;
    free(loss);
    free(corr);
    s->count = s->steps = s->step_first = 0;
    return timed;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

static void evaluate_epoch(Model *m, InputPipe *in, StepLog *scratch) {
    float *x;
    int32_t *y;
    Batch *b;
    int traced = trace_pause(); /* --trace: evaluation is not part of the step window */
    while ((b = input_next(in, &x, &y))) {
        int i = steplog_begin(scratch, b->n);
        model_forward(m, b->n, x, 0);
        /* the loss kernel also writes dlogits; harmless scratch here */
        xent_forward_backward(m->dev, b->n, m->classes, model_logits(m), y, 1.0f / (float)b->n,
                              scratch->loss + i, scratch->correct + i, model_dlogits(m));
    }
    input_drain(in);
    trace_resume(traced);
}

void evaluate(Model *m, InputPipe *in, StepLog *scratch, double *accuracy, double *loss) {
    loader_start_epoch(in->loader, 0, 0, NULL, 0);
    evaluate_epoch(m, in, scratch);
    steplog_finish(scratch, loss, accuracy, NULL);
}

void evaluate_indices(Model *m, InputPipe *in, StepLog *scratch, const int64_t *indices, int64_t n,
                      double sums[3]) {
    loader_start_epoch(in->loader, 0, 0, indices, n);
    evaluate_epoch(m, in, scratch);
    double samples = 0, loss = 0, acc = 0;
    for (int i = 0; i < scratch->count; i++) samples += scratch->n[i];
    steplog_finish(scratch, &loss, &acc, NULL);
    sums[0] = samples > 0 ? loss * samples : 0;
    sums[1] = samples > 0 ? nearbyint(acc * samples) : 0; /* a count */
    sums[2] = samples;
}

/* ---- the run --------------------------------------------------------------------------------- */

static void sum_over_ranks(const Run *r, double *v, int n) {
    if (r->sum_across && r->world_size > 1) r->sum_across(r->sum_ctx, v, n);
}

#define RUN_STATE_PARTS 5 /* parameters, momentum, Adam's two moments, batch-norm buffers */

/* Which part of the training state holds a NaN or an infinity ("… is"), or NULL when none does.
 * Counted on the device by the --grad-stats kernel, with one small read back: microseconds on a GPU.
 * Copying ResNet-18's state to the host to look (45 MB of parameters, as much again of momentum) and
 * scanning it took 70 ms on a 2-core host: a few percent of an H200 epoch (1.4–1.8 s in stage 5's
 * logs), on every rank, every epoch, --save or not. */
static const char *state_nonfinite(Run *r) {
    Model *m = r->model;
    Adam *adam = r->opt->adam;
    const struct { const float *x; int64_t n; const char *what; } part[RUN_STATE_PARTS] = {
        {m->param_flat, m->n_param_floats, "the parameters are"},
        {r->opt->momentum_buf, m->n_param_floats, "the momentum buffer is"},
        {adam ? adam->exp_avg : NULL, m->n_param_floats, "Adam's moments are"},
        {adam ? adam->exp_avg_sq : NULL, m->n_param_floats, "Adam's moments are"},
        {m->buffer_flat, m->n_buffer_floats, "the batch-norm running statistics are"}};
    int64_t counts[2 * RUN_STATE_PARTS]; /* (zeros, non-finite) for each part */
    device_bind(m->dev); /* stage 2's master is GPU0's: launch there */
    device_memset0(m->dev, r->state_counts, sizeof counts);
    for (int i = 0; i < RUN_STATE_PARTS; i++)
        if (part[i].x) count_zero_nonfinite(m->dev, part[i].n, part[i].x, r->state_counts + 2 * i);
    device_copy_d2h(m->dev, counts, r->state_counts, sizeof counts);
    for (int i = 0; i < RUN_STATE_PARTS; i++)
        if (counts[2 * i + 1]) return part[i].what;
    return NULL;
}

/* printf shows a NaN's sign bit ("-nan", as a NaN loss often has); torch and Python print "nan" */
static double plain_nan(double v) { return isnan(v) ? (double)NAN : v; }

/* --trace: each rank's file written, then rank 0 merges them once all have been (the sum is the
 * barrier). At the run's end, and where it stops diverged: every rank decides that at the same point. */
static void trace_write(Run *r) {
    trace_finish();
    if (trace_wants_merge()) { /* every rank's file is written once all have passed here */
        double barrier = 0;
        sum_over_ranks(r, &barrier, 1);
        trace_merge();
    }
}

/* A NaN or an infinity in the state never goes away: every later step computes from it (a NaN weight
 * makes NaN activations, gradients and updates; a NaN or inf momentum, moment or running statistic
 * stays so), so the run stops instead of training on to report "final train loss nan" as a success —
 * and writes no checkpoint of it, for which --keep-last would have removed the good ones. Every rank
 * of a job holds the same state (DDP's replicas) and stops at the same point: rank 0 says why, the
 * others point to it and mark their failure as a consequence of its, so the launcher names rank 0. */
_Noreturn static void diverged(Run *r, const char *what, const char *why, double loss) {
    const TrainConfig *c = r->cfg;
    /* the steps that led to it are the timeline worth having: the window, or what of it ran (an
     * unwritten trace left only an empty FILE.tmp, and the previous run's FILE, as if this one's) */
    trace_write(r);
    if (r->rank != 0)
        die_collateral(1, 2, "rank %d: training diverged (every rank holds rank 0's state) — see rank 0's error",
                       r->rank);
    char *kept = NULL; /* what is left to resume from (with --save) */
    int n = 0;
    if (r->last_saved)
        n = asprintf(&kept, "; none of this state is saved, and the last good checkpoint, %s, is kept: resume from "
                            "it with --resume %s and a lower --lr", r->last_saved, r->last_saved);
    else if (c->save[0] && c->resume[0])
        n = asprintf(&kept, "; none of this state is saved: the last good checkpoint is the one this run resumed "
                            "from, %s", c->resume);
    else if (c->save[0])
        kept = xstrdup("; none of this state is saved, and no checkpoint was before it");
    if (n < 0) die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
    if (r->on_diverge) r->on_diverge(r->diverge_ctx);
    char *msg;
    if (asprintf(&msg, "training diverged in epoch %lld (step %lld, train loss %g): %s no longer finite (NaN or "
                       "inf)%s, which training never recovers from — lower --lr (now %g)%s", (long long)r->epoch + 1,
                 (long long)r->step, plain_nan(loss), what, why, c->lr, kept ? kept : "") < 0)
        die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
    /* the report's last record says how the run ended, as "summary" does for one that finished: a
     * script reading it (compare_table.py, a sweep's) sees a divergence, not a run cut short */
    json_begin(&r->report, "diverged");
    json_int(&r->report, "epoch", r->epoch + 1);
    json_int(&r->report, "step", r->step);
    json_num(&r->report, "train_loss", loss);
    json_num(&r->report, "lr", c->lr);
    if (r->last_saved) json_str(&r->report, "last_checkpoint", r->last_saved);
    json_str(&r->report, "error", msg);
    json_end(&r->report);
    die_user("%s", msg);
}

/* The CPU backend: what its numbers can and cannot show, so that a CPU run does not teach the
 * opposite of the GPU lesson — DataParallel "beating" one device (stages 2–5), fp16 using more memory
 * than fp32 (stage 5), or a GPU flag that changed nothing without saying so. */
static void cpu_notes(Run *r) {
    if (r->devs[0]->kind != DEV_CPU) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* stage 1 too: its times are the baseline a student divides the other stages' by, and alone they
     * say nothing of a GPU's speed (its own wording: tests/compare_table.py reads the "counts" note) */
    if (!strcmp(r->stage, "stage1") && !r->cfg->evaluate)
        report_printf(&r->report,
                      "note: CPU backend — losses, accuracy, counts and memory accounting are real; the times are "
                      "this CPU's (%ld core%s, no cuDNN, TF32 or CUDA graphs): compare them only with CPU runs of "
                      "the other stages, and read no GPU's speed from them\n",
                      cores, cores == 1 ? "" : "s");
    if (strcmp(r->stage, "stage1") && !r->cfg->evaluate) /* --evaluate times no step */
        report_printf(&r->report,
                      "note: CPU backend — counts, bytes, memory accounting and equivalence with one device are "
                      "real; the times are not a scaling result (the %s share %ld CPU core%s, and there are no "
                      "GPU streams to overlap): which of DataParallel and DDP is faster here says nothing of which "
                      "is faster on GPUs\n",
                      r->world_size > 1 && r->sum_across ? "worker processes" : "device threads", cores,
                      cores == 1 ? "" : "s");
    const char *low = precision_name(r->model->prec);
    if (r->model->prec != PREC_FP32)
        report_printf(&r->report,
                      "note: CPU backend — %s is emulated: values are rounded to %s where autocast stores them, "
                      "so %s real; but they are kept in 4-byte floats and the rounding costs time, so memory and "
                      "speed show nothing of what %s saves on a GPU\n", low, low,
                      r->cfg->evaluate                   ? "the forward's rounding is"
                      : r->model->prec == PREC_BF16      ? "its rounding is" /* no GradScaler: fp32's range */
                      : cli_given("no-grad-scaler")      ? "overflow and underflow are" /* none here either */
                                                         : "the GradScaler, overflow and underflow are",
                      low);
    /* GPU-only flags stay accepted (a GPU command runs unchanged on a laptop), but are named. */
    static const char *const gpu_only[] = {"cudnn-benchmark", "no-tf32", "no-cuda-graph", "layout",
                                           "channels-last", "pin-memory"};
    char names[160] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof gpu_only / sizeof gpu_only[0]; i++)
        if (cli_given(gpu_only[i]))
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s--%s", n++ ? ", " : "", gpu_only[i]);
    if (n)
        report_printf(&r->report,
                      "note: %s change%s only GPU runs: the CPU backend has no cuDNN, TF32, CUDA graphs or pinned "
                      "copies, and keeps NCHW — this run is what it would be without %s\n",
                      names, n == 1 ? "s" : "", n == 1 ? "it" : "them");
}

void run_begin(Run *r, const TrainConfig *cfg, const char *stage, Device **devs, int n_devs,
               int world_size, int rank, SumAcrossFn sum_across, void *sum_ctx, Model *m,
               Optimizer *opt, int64_t batches_per_epoch, const char *data_desc) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg, r->stage = stage, r->devs = devs, r->n_devs = n_devs, r->world_size = world_size;
    r->rank = rank, r->sum_across = sum_across, r->sum_ctx = sum_ctx;
    r->model = m, r->opt = opt, r->batches_per_epoch = batches_per_epoch;
    r->accum = cfg->accum_steps > 0 ? cfg->accum_steps : 1;
    r->steps_per_epoch = (batches_per_epoch + r->accum - 1) / r->accum;
    /* The schedule spans the epochs asked for; --steps only stops the run early, so a run stopped
     * at step S and resumed follows exactly the schedule of an uninterrupted run. */
    r->total_steps = (int64_t)cfg->epochs * r->steps_per_epoch;
    r->shuffle = 1, r->drop_last = 0; /* loader_config's training loader (stages 1, 2) */
    r->cap_times = 1024;
    r->times = xmalloc((size_t)r->cap_times * sizeof(double));
    r->state_counts = device_alloc(m->dev, 2 * RUN_STATE_PARTS * sizeof(int64_t), "divergence check");
    clip_init(&r->clip, m->dev, m->n_param_floats, cfg->evaluate ? 0 : cfg->clip_grad_norm);
    report_open_resumed(&r->report, cfg->report, cfg->progress, rank == 0, cfg->evaluate ? NULL : cfg->resume);
    char desc[128], optd[96];
    char where[sizeof devs[0]->name + 32];
    snprintf(where, sizeof where, "%s", devs[0]->name);
    if (devs[0]->kind == DEV_CPU) { /* stage 2's replicas run at once: they share the cores out */
        cpu_threads_set(cfg->cpu_threads > 0 ? cfg->cpu_threads : cpu_threads_auto(n_devs));
        int t = cpu_threads_get();
        snprintf(where, sizeof where, "%s, %d thread%s", devs[0]->name, t, t == 1 ? "" : "s");
    }
    report_printf(&r->report, "%s | %s | %s\n", stage, where, model_describe(m, desc, sizeof desc));
    if (opt->adam) /* Adam has no momentum flag: its betas are torch's defaults */
        snprintf(optd, sizeof optd, "adam (betas %g, %g, eps %g)", opt->adam->beta1, opt->adam->beta2, opt->adam->eps);
    else
        snprintf(optd, sizeof optd, "momentum %g", cfg->momentum);
    /* cuDNN's search is a GPU run's: on the CPU backend the flag changes nothing (cpu_notes says so) */
    const char *bench_tag = cfg->cudnn_benchmark && devs[0]->kind != DEV_CPU ? " | cudnn benchmark" : "";
    /* micro-batches in an optimizer step: K, or an epoch's when K is more (as PyTorch's loop would) */
    int64_t k = r->accum < batches_per_epoch ? r->accum : batches_per_epoch;
    if (cfg->evaluate) /* no training: what is tested, how (a job of processes: each rank its shard) */
        report_printf(&r->report, "data: test set %s, %lld image%s | batch %d%s | seed %lld%s%s\n",
                      test_source_opened, (long long)test_size_opened, test_size_opened == 1 ? "" : "s",
                      cfg->batch_size,
                      gated(r) ? " on each rank, each its DistributedSampler shard" : "", (long long)cfg->seed,
                      cfg->deterministic ? " | deterministic" : "", bench_tag);
    else if (cfg->accum_steps > 0) { /* gradient accumulation: an optimizer step is K micro-batches */
        char more[64] = "";
        if (k < r->accum) snprintf(more, sizeof more, " (all of an epoch's: --accum-steps %d is more)", r->accum);
        report_printf(&r->report,
                      "data: %s | batch %d × %lld micro-batch%s%s × %d device(s) = effective batch %lld | %d epoch%s, "
                      "%lld optimizer step%s/epoch (%lld micro-batch%s) | lr %g (%s), %s, wd %g | seed "
                      "%lld%s%s\n",
                      data_desc, cfg->batch_size, (long long)k, k == 1 ? "" : "es", more, world_size,
                      (long long)k * cfg->batch_size * world_size, cfg->epochs, cfg->epochs == 1 ? "" : "s",
                      (long long)r->steps_per_epoch, r->steps_per_epoch == 1 ? "" : "s", (long long)batches_per_epoch,
                      batches_per_epoch == 1 ? "" : "es", cfg->lr, cfg->schedule,
                      optd, cfg->weight_decay, (long long)cfg->seed,
                      cfg->deterministic ? " | deterministic" : "", bench_tag);
    } else
        report_printf(&r->report,
                      "data: %s | batch %d × %d device(s) | %d epoch%s, %lld step%s/epoch | lr %g (%s), "
                      "%s, wd %g | seed %lld%s%s\n",
                      data_desc, cfg->batch_size, world_size, cfg->epochs, cfg->epochs == 1 ? "" : "s",
                      (long long)batches_per_epoch, batches_per_epoch == 1 ? "" : "s",
                      cfg->lr, cfg->schedule, optd, cfg->weight_decay, (long long)cfg->seed,
                      cfg->deterministic ? " | deterministic" : "",
                      bench_tag);
    if (cfg->warmup_steps > 0 && cfg->warmup_steps < r->total_steps && !cfg->evaluate) {
        const int64_t rest = r->total_steps - cfg->warmup_steps;
        report_printf(&r->report, "warm-up: the learning rate rises linearly from %g × %g over the first %lld optimizer "
                      "step%s, then follows --schedule %s over the other %lld (LinearLR, then the schedule: "
                      "SequentialLR)\n", cfg->warmup_start_factor, cfg->lr, (long long)cfg->warmup_steps,
                      cfg->warmup_steps == 1 ? "" : "s", cfg->schedule, (long long)rest);
    }
    if (r->clip.max_norm > 0)
        report_printf(&r->report, "clip: before each optimizer step, gradients whose total norm is above %g are scaled "
                      "down to it (clip_grad_norm_)\n", r->clip.max_norm);
    cpu_notes(r);
    peak_tflops(-1, MATH_FP32, NULL, 0); /* a bad PEAK_TFLOPS is refused now, not after the run */
    if (cfg->accum_steps > batches_per_epoch && !cfg->evaluate)
        report_printf(&r->report,
                      "note: --accum-steps %d is more than the %lld micro-batch%s of an epoch: one optimizer step "
                      "per epoch, over %s (its gradient still divided by %d)\n",
                      cfg->accum_steps, (long long)batches_per_epoch, batches_per_epoch == 1 ? "" : "es",
                      batches_per_epoch == 1 ? "it" : "all of them", cfg->accum_steps);
    json_begin(&r->report, "config");
    json_str(&r->report, "stage", stage);
    json_str(&r->report, "device", devs[0]->name);
    json_str(&r->report, "model", m->arch);
    json_int(&r->report, "params", m->n_param_floats);
    json_int(&r->report, "batch_size", cfg->batch_size);
    json_int(&r->report, "world_size", world_size);
    if (cfg->accum_steps > 0 && !cfg->evaluate) {
        json_int(&r->report, "accum_steps", r->accum);
        json_int(&r->report, "effective_batch", k * cfg->batch_size * world_size);
    }
    if (r->clip.max_norm > 0) json_num(&r->report, "clip_grad_norm", r->clip.max_norm);
    json_end(&r->report);
    gate_before_checks(r, 0); /* a job's rank 0 checks alone; the others wait for its verdict */
    gate_flags = 1;
    if (cfg->warmup_steps >= r->total_steps && !cfg->evaluate)
        die_user("--warmup-steps %lld leaves no step for --schedule %s: this run has %lld optimizer steps (--epochs "
                 "%d × %lld an epoch), and the warm-up must end inside it — warm up over fewer steps, or train more "
                 "epochs", (long long)cfg->warmup_steps, cfg->schedule, (long long)r->total_steps, cfg->epochs,
                 (long long)r->steps_per_epoch);
    gate_flags = 0;
    if (cfg->resume[0]) run_resume(r);
    gate_after_checks(r, 0);
    if (cfg->save[0] && rank == 0) { /* now, not after an epoch of training */
        /* The names this run writes: the ends of the epochs it completes — up to --epochs, or to where
         * --steps S stops — and stepS where S stops inside an epoch. Resumed into its own run's
         * directory, a file there is a later checkpoint of that run (a fresh run into it is refused
         * before: config_resolve); S at or before the resumed step trains nothing, and the resume's
         * own check says so. */
        int64_t S = cfg->steps, spe = r->steps_per_epoch;
        int64_t last = S > 0 && S / spe < cfg->epochs ? S / spe : cfg->epochs;
        int64_t inside = S > 0 && S % spe && S / spe < cfg->epochs ? S : 0;
        const char *resumed = cfg->resume[0] && !(S > 0 && S <= r->step) ? cfg->resume : NULL;
        int64_t last_step = S > 0 && S < r->total_steps ? S : r->total_steps;
        checkpoint_probe(cfg->save, r->epoch, last, inside, resumed, r->step, last_step);
        if (resumed) run_keep_resumed(r);
    }
    /* A signal now stops the run at a step boundary, saved (stop.h) — on every rank of a job where rank 0
     * saves, --save given or not: a rank without the handler would die of a scheduler's SIGTERM at once,
     * and rank 0, its peer gone, with it, unsaved. */
    if (cfg->save[0] || r->job_saves) {
        char notice[400];
        if (gated(r))
            snprintf(notice, sizeof notice, "the %d ranks stop after the next step where they compare notes (every "
                     "--log-every %d step%s, and at an epoch's end), and rank 0 saves it into %s", world_size,
                     cfg->log_every, cfg->log_every == 1 ? "" : "s", cfg->save);
        else
            snprintf(notice, sizeof notice, "stopping after this step and saving it into %s", cfg->save);
        stop_install(stage, rank == 0 ? notice : NULL);
    }
    r->t_start = r->epoch_t0 = time_now();
    r->epoch_batch0 = r->start_batch; /* a resumed epoch's first batches ran before this run */
    char process[64]; /* --trace: one process track per rank */
    int procs = sum_across && world_size > 1 ? world_size : 1;
    if (procs > 1) snprintf(process, sizeof process, "rank %d (%s)", rank, stage);
    else snprintf(process, sizeof process, "%s (one process)", stage);
    trace_configure(cfg->trace, cfg->trace_steps, rank, procs, process, devs, n_devs);
    trace_step(r->step);
}

int run_done(const Run *r) {
    return r->evaluated || r->stop_sig || (r->cfg->steps > 0 && r->step >= r->cfg->steps);
}

/* A stop asked for by a signal (stop.h) becomes the run's only where every rank decides the same: in
 * one process after any step; in a job at the points where the ranks already sum something (the loss
 * every --log-every steps, an epoch's totals), the requests riding along as two more values — how many
 * ranks got SIGINT, how many SIGTERM. So every rank stops after the same step, and rank 0 saves a step
 * that all of them finished, without a collective of its own (one per step would make every step wait
 * for the slowest rank's host). */
static void stop_vote(double v[2]) {
    int s = stop_requested();
    v[0] = s == SIGINT, v[1] = s == SIGTERM;
}

static void stop_take(Run *r, const double v[2]) {
    /* at the run's last step there is nothing to stop: it ends as it would have, exit 0 */
    if (r->stop_sig || (v[0] <= 0 && v[1] <= 0) || r->step >= run_last_step(r)) return;
    r->stop_sig = v[1] > 0 ? SIGTERM : SIGINT; /* a scheduler's SIGTERM outranks a Ctrl-C */
    r->stop_ranks = (int)(v[0] + v[1]);
}

int64_t run_last_step(const Run *r) {
    return r->cfg->steps > 0 && r->cfg->steps < r->total_steps ? r->cfg->steps : r->total_steps;
}

double run_lr_at(const Run *r, int64_t step) {
    const TrainConfig *c = r->cfg;
    return lr_schedule(c->schedule, c->lr, c->warmup_steps, c->warmup_start_factor, step, r->total_steps);
}

double run_lr(const Run *r) { return run_lr_at(r, r->step); }

void run_step_end(Run *r, StepLog *log, int slot, int64_t batch) {
    ASSERT(!r->resume_unchecked); /* a job of processes calls run_sampler (ddp_init) before its first step */
    r->step++;
    r->start_batch = batch + 1; /* position in the epoch, for a mid-epoch checkpoint */
    const TrainConfig *c = r->cfg;
    double vote[2];
    stop_vote(vote);
    if (!gated(r)) stop_take(r, vote); /* one process: nobody to agree with */
    if (r->step % c->log_every == 0 || run_done(r)) {
        double v[3] = {steplog_step_loss(log), vote[0], vote[1]}; /* the one synchronisation, every --log-every steps */
        sum_over_ranks(r, v, 3);
        stop_take(r, v + 1);
        double loss = v[0] / (r->world_size > 1 && r->sum_across ? r->world_size : 1);
        /* the step's total gradient norm before clipping (clip_grad_norm_'s return value): the same on
         * every rank, which all clip the same all-reduced gradient */
        const int clipping = r->clip.max_norm > 0;
        double norm = clipping ? clip_last_norm(&r->clip) : 0;
        char norm_text[40] = "";
        if (clipping && isfinite(norm)) snprintf(norm_text, sizeof norm_text, "  grad norm %.4g", norm);
        else if (clipping) /* an inf/NaN gradient (a step the GradScaler skips): "inf" or "nan", never "-nan" */
            snprintf(norm_text, sizeof norm_text, "  grad norm %s", isnan(norm) ? "nan" : "inf");
        json_begin(&r->report, "step");
        json_int(&r->report, "step", r->step);
        json_int(&r->report, "epoch", r->epoch + 1);
        json_num(&r->report, "loss", loss);
        json_num(&r->report, "lr", run_lr_at(r, r->step - 1)); /* the lr this step used */
        if (clipping) json_num(&r->report, "grad_norm", norm);
        json_end(&r->report);
        if (!r->report.progress)
            report_printf(&r->report, "  step %6lld  epoch %lld  batch %5lld/%lld  loss %.4f%s\n",
                          (long long)r->step, (long long)r->epoch + 1, (long long)batch + 1,
                          (long long)r->batches_per_epoch, plain_nan(loss), norm_text);
        r->last_train_loss = loss, r->loss_read = 1;
    }
    float loss = (float)r->last_train_loss;
    report_progress(&r->report, (int)r->epoch + 1, c->epochs, batch + 1, r->batches_per_epoch,
                    batch + 1 - r->epoch_batch0, time_now() - r->epoch_t0, r->loss_read ? &loss : NULL);
    trace_step(r->step); /* opens / closes the --trace-steps window */
}

#define PEAKS_LISTED 64 /* ranks whose peak memory the report lists one by one (the largest counts them all) */

/* Peak memory of every device of the job: this process's devices, or one per rank (stages 3–5), the
 * first cap of them into peaks[]. Returns how many there are (more than cap with many ranks), and the
 * largest of all of them in *max. Every rank has a slot of its own (one sum over world_size values:
 * a byte count is exact in a double), so no rank's peak is added into another's. */
static int peaks_of(const Run *r, int64_t *peaks, int cap, size_t *max) {
    int job = r->sum_across && r->world_size > 1, n = job ? r->world_size : r->n_devs;
    double *v = xcalloc((size_t)n, sizeof *v);
    if (job) {
        v[r->rank] = (double)r->devs[0]->mem_peak;
        sum_over_ranks(r, v, n);
    } else {
        for (int i = 0; i < n; i++) v[i] = (double)r->devs[i]->mem_peak;
    }
    *max = 0;
    for (int i = 0; i < n; i++) {
        if (i < cap) peaks[i] = (int64_t)v[i];
        if ((size_t)v[i] > *max) *max = (size_t)v[i];
    }
    free(v);
    return n;
}

/* Images per second at a median step time: every optimizer step takes K × batch × world images.
 * NAN (JSON null, console "n/a") when no step was timed. */
static double images_per_s(const Run *r, double med_ms) {
    return med_ms > 0 ? 1e3 * r->world_size * r->cfg->batch_size * r->accum / med_ms : NAN;
}

/* Median over the run's timed steps (warm-up excluded). A run too short to have any (at most
 * WARMUP_STEPS steps, plus each epoch's untimed last one) has no time: NAN, not a 0 that reads like
 * an infinitely fast step. */
static double median_ms(const Run *r) { return r->n_times ? stats_median_copy(r->times, r->n_times) : NAN; }

/* "12.34 ms/it  10375 img/s" (sep between the two), or "n/a ms/it  n/a img/s" when nothing was timed. */
static const char *fmt_timing(char *buf, size_t len, double med, double ips, const char *unit, const char *sep) {
    if (isfinite(med) && isfinite(ips)) snprintf(buf, len, "%.2f ms/%s%s%.0f img/s", med, unit, sep, ips);
    else snprintf(buf, len, "n/a ms/%s%sn/a img/s (no step timed after the %d warm-up steps)", unit, sep, WARMUP_STEPS);
    return buf;
}

/* End of an epoch's steps: the loss and accuracy over every rank's samples, and this process's
 * step times (after warm-up) appended to the run's. */
static void collect_times(Run *r, StepLog *log, double *loss, double *acc) {
    double *t = xmalloc((size_t)(log->count + 1) * sizeof(double));
    double n = 0;
    for (int i = 0; i < log->count; i++) n += log->n[i];
    int k = steplog_finish(log, loss, acc, t);
    double v[5] = {*loss * n, *acc * n, n};
    stop_vote(v + 3); /* an epoch's end is a point every rank reaches too */
    sum_over_ranks(r, v, 5);
    stop_take(r, v + 3);
    *loss = v[2] > 0 ? v[0] / v[2] : NAN;
    *acc = v[2] > 0 ? v[1] / v[2] : NAN;
    for (int i = 0; i < k; i++, r->seen_steps++) {
        if (r->seen_steps < WARMUP_STEPS) continue;
        if (r->n_times == r->cap_times) {
            r->cap_times *= 2;
            r->times = xrealloc(r->times, (size_t)r->cap_times * sizeof(double));
        }
        r->times[r->n_times++] = t[i];
    }
    free(t);
}

void run_epoch_end(Run *r, StepLog *log, double test_acc, double test_loss, double data_wait_s) {
    const TrainConfig *c = r->cfg;
    /* An epoch's loop ends at its last batch or at a stop (--steps, a signal). One that ran out of
     * batches with some not yet stepped — a stage that skips the last, partial accumulation group —
     * would read below as a stop inside the epoch, and the loop would run that epoch again, for ever. */
    if (r->start_batch < r->batches_per_epoch && !run_done(r)) {
        char why[160];
        snprintf(why, sizeof why, "epoch %lld's loop ended with %lld of its %lld batches stepped, and no stop asked for",
                 (long long)r->epoch + 1, (long long)r->start_batch, (long long)r->batches_per_epoch);
        die_at(__FILE__, __LINE__, "run_epoch_end", why,
               "this is a bug in the stage's loop: every batch must end in a step (run_step_end)");
    }
    double loss, acc;
    collect_times(r, log, &loss, &acc);
    r->data_wait_s += data_wait_s;
    r->last_train_loss = loss, r->last_train_acc = acc, r->last_test_acc = test_acc, r->loss_read = 1;
    double med = median_ms(r), secs = time_now() - r->epoch_t0;
    int64_t peaks[PEAKS_LISTED];
    size_t max_peak;
    int n_peaks = peaks_of(r, peaks, PEAKS_LISTED, &max_peak);
    char mem[32], timing[128];
    fmt_bytes(mem, sizeof mem, (double)max_peak);
    /* A resumed epoch's first batches ran before the resume: its train loss and accuracy average only
     * the batches this process ran (the step losses, the test and the state are the same as without
     * the stop), and its line says from where. */
    char from[48] = "";
    if (r->epoch_batch0 > 0) snprintf(from, sizeof from, " from batch %lld", (long long)r->epoch_batch0 + 1);
    report_printf(&r->report,
                  "%s %lld/%d%s  train loss %.4f acc %5.1f%%  test loss %.4f acc %5.1f%%  | "
                  "%s  data wait %.2f s | peak mem %s | %.1f s\n",
                  r->start_batch >= r->batches_per_epoch ? "epoch" : "partial epoch",
                  (long long)r->epoch + 1, c->epochs, from, plain_nan(loss), 100 * acc, plain_nan(test_loss), 100 * test_acc,
                  fmt_timing(timing, sizeof timing, med, images_per_s(r, med), c->accum_steps > 0 ? "step" : "it", "  "),
                  data_wait_s, mem, secs);
    r->epoch_reported = r->epoch + 1;
    json_begin(&r->report, "epoch");
    json_int(&r->report, "epoch", r->epoch + 1);
    json_int(&r->report, "first_batch", r->epoch_batch0 + 1); /* train_loss/acc average from this batch on */
    json_int(&r->report, "step", r->step);
    json_num(&r->report, "train_loss", loss);
    json_num(&r->report, "train_acc", acc);
    json_num(&r->report, "test_loss", test_loss);
    json_num(&r->report, "test_acc", test_acc);
    json_num(&r->report, "ms_per_iter_median", med);
    json_num(&r->report, "data_wait_s", data_wait_s);
    json_num(&r->report, "epoch_s", secs);
    json_int_list(&r->report, "peak_mem_bytes", peaks, n_peaks < PEAKS_LISTED ? n_peaks : PEAKS_LISTED);
    json_int(&r->report, "peak_mem_max_bytes", (int64_t)max_peak);
    json_end(&r->report);
    /* Divergence is decided on the state, not on the loss: stage 5's GradScaler meets inf and NaN losses
     * on purpose and skips those steps, leaving the state finite. Every rank checks, saving or not, at
     * every epoch end (and where --steps stops), before a checkpoint is written. */
    const char *bad = state_nonfinite(r);
    if (bad) diverged(r, bad, "", loss);
    /* …or a finite state whose forward overflows: weights grown to 1e34 give a NaN test loss, and so
     * would every later epoch (a fp16 run then skips nearly every step); its checkpoint is no good
     * either. But fp16's range (±65504) is not the state's: early in training batch norm's running
     * statistics lag the weights, and the test forward (which uses them) can overflow in fp16 alone
     * while the training forward, on batch statistics, is finite — that run recovers within an
     * epoch or two, and PyTorch's autocast evaluation prints the same NaN. So in fp16 it takes a
     * training loss that is not finite either. Both losses are sums over every rank: all decide alike. */
    if (!isfinite(test_loss) && r->model->prec == PREC_FP16 && isfinite(loss))
        report_printf(&r->report, "note: the test forward overflowed fp16's range (test loss %g) while the training loss "
                      "is finite — early on, the running statistics evaluation uses can lag the weights; the state "
                      "is finite, so training goes on (--amp bf16 has fp32's range)\n", test_loss);
    else if (!isfinite(test_loss))
        diverged(r, "the test loss is", ": the state is finite, but the weights have grown so large that the forward "
                 "overflows", loss);
    /* fp16's GradScaler backed off until 1/scale overflows fp32: every step from then on is skipped and
     * none will be taken again (only extreme --backoff-factor / --init-scale get there). PyTorch goes on
     * in silence; we go on too (the state is unharmed, and is saved as it is), but say so, once. */
    if (r->save_scaler && !r->scaler_dead_noted) {
        CheckpointMeta sm = {0};
        r->save_scaler(r->scaler_ctx, &sm);
        if (!isfinite(1.0f / (float)sm.scaler_scale)) {
            r->scaler_dead_noted = 1;
            report_printf(&r->report, "note: the GradScaler's scale fell to %g in epoch %lld: 1/scale overflows fp32, so "
                          "every optimizer step since has been skipped and none will be taken again — this run trains "
                          "nothing more; use a --backoff-factor nearer 1 (now %g) or a larger --init-scale (the "
                          "defaults, 0.5 and 65536, are PyTorch's); --grad-stats counts the inf/NaN gradients\n",
                          sm.scaler_scale, (long long)r->epoch + 1, sm.scaler_backoff_factor);
        }
    }
    if (r->start_batch >= r->batches_per_epoch) { /* a whole epoch: continue at the next one */
        r->epoch++;
        r->start_batch = 0;
        r->last_epoch_done = r->epoch;
        if (c->save[0]) run_save(r, r->epoch, 0, 1);
    } else if (c->save[0]) { /* stopped inside it (--steps): keep the position for --resume */
        run_save(r, r->epoch, r->start_batch, 0);
    }
    /* A signal that came during the evaluation or the save stops the run here, at the checkpoint just
     * written — not a step (one process) or up to --log-every steps (a job) later. A job votes once
     * more for it, after the save: two values an epoch, summed where the other ranks wait for rank 0's
     * write anyway (their first all-reduce of the next epoch would). */
    double v[2];
    stop_vote(v);
    sum_over_ranks(r, v, 2);
    stop_take(r, v);
    r->epoch_t0 = time_now();
    r->epoch_batch0 = r->start_batch;
}

static void add_extra(Run *r, const char *key, double v, int integer) {
    ASSERT(r->n_extras < RUN_EXTRAS);
    r->extras[r->n_extras].key = key, r->extras[r->n_extras].v = v, r->extras[r->n_extras].integer = integer;
    r->n_extras++;
}
void run_summary_int(Run *r, const char *key, int64_t v) { add_extra(r, key, (double)v, 1); }
void run_summary_num(Run *r, const char *key, double v) { add_extra(r, key, v, 0); }

/* ---- arithmetic throughput: the model's FLOPs per step against the hardware's peak ------------ */

/* The math the convolutions run in, as peaks are quoted: autocast's type, else TF32 when cuDNN may
 * use it (--no-tf32: true fp32). The CPU backend computes in fp32 (16-bit types are emulated). */
static PeakMath run_math(const Run *r) {
    if (r->devs[0]->kind == DEV_CPU) return MATH_FP32;
    if (r->model->prec == PREC_FP16) return MATH_FP16;
    if (r->model->prec == PREC_BF16) return MATH_BF16;
    return r->devs[0]->allow_tf32 ? MATH_TF32 : MATH_FP32;
}

/* How many physical devices the job computes on — the peak's multiplier: every rank's GPUs, one
 * GPU that several logical devices or ranks share counted once (a host and ordinal pair), the CPU
 * backend as one device. Ranks beyond 64 are taken to have a GPU each. */
static int physical_devices(const Run *r) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    double base = (double)(fnv1a64(FNV1A64_INIT, host, strlen(host)) >> 24) * 256; /* exact in a double */
    double key[64] = {0};
    int n = 0, extra = 0;
    if (r->sum_across && r->world_size > 1) { /* one device per rank: gather every rank's key */
        n = r->world_size < 64 ? r->world_size : 64;
        extra = r->world_size - n;
        if (r->rank < n) key[r->rank] = base + r->devs[0]->ordinal + 2;
        sum_over_ranks(r, key, n);
    } else {
        n = r->n_devs < 64 ? r->n_devs : 64;
        for (int i = 0; i < n; i++) key[i] = base + r->devs[i]->ordinal + 2;
    }
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = key[j] == key[i];
        distinct += !seen;
    }
    return distinct + extra;
}

/* The model's FLOPs per optimizer step — every image of it (K micro-batches × batch × world), in
 * model_flops' convention (conv and linear, forward + backward) — over the median step time, against
 * the peak of the math the convolutions run in on every device of the job. */
typedef struct Flops {
    double per_image, per_step; /* FLOPs */
    double achieved, peak;      /* TFLOP/s; NAN when not timed / not known */
    int devices;
    PeakMath math;
    char source[160];           /* where the peak came from */
} Flops;

static Flops run_flops(const Run *r, double med_ms) {
    Flops f = {.math = run_math(r), .devices = physical_devices(r)};
    f.per_image = (double)model_flops(r->model, 1, NULL);
    f.per_step = f.per_image * r->world_size * r->cfg->batch_size * r->accum;
    f.achieved = med_ms > 0 ? f.per_step / (med_ms * 1e-3) / 1e12 : NAN;
    int ordinal = r->devs[0]->kind == DEV_CUDA ? r->devs[0]->ordinal : -1;
    f.peak = peak_tflops(ordinal, f.math, f.source, sizeof f.source) * f.devices;
    return f;
}

/* "  compute: 426.1 GFLOP/step (...) | 56.3 TFLOP/s | 11.4% of the tf32 dense peak 494.7 TFLOP/s (...)" */
static void print_flops(Run *r, const Flops *f) {
    char rate[32], of[320];
    if (isfinite(f->achieved)) snprintf(rate, sizeof rate, "%.3g TFLOP/s", f->achieved);
    else snprintf(rate, sizeof rate, "n/a TFLOP/s");
    if (!isfinite(f->peak))
        snprintf(of, sizeof of, "peak n/a (%s)", f->source);
    else if (!isfinite(f->achieved))
        snprintf(of, sizeof of, "n/a of the %s dense peak %.1f TFLOP/s (%s)", peak_math_name(f->math), f->peak, f->source);
    else
        snprintf(of, sizeof of, "%.1f%% of the %s dense peak %.1f TFLOP/s (%d device%s; %s)",
                 100 * f->achieved / f->peak, peak_math_name(f->math), f->peak, f->devices,
                 f->devices == 1 ? "" : "s", f->source);
    report_printf(&r->report, "  compute: %.1f GFLOP/step (conv + linear, forward + backward) | %s | %s\n",
                  f->per_step / 1e9, rate, of);
    /* A set smaller than one step's images: no step was full, yet the figures above are a full step's
     * and the planned activations a full micro-batch's, as --batch-size and --accum-steps asked. */
    int64_t full = (int64_t)r->world_size * r->cfg->batch_size * r->accum;
    if (train_size_opened > 0 && train_size_opened < full) {
        const int64_t per_rank = train_size_opened / r->world_size, batch = per_rank / r->accum;
        char fits[160];
        if (batch >= 1) snprintf(fits, sizeof fits, "a --batch-size of at most %lld fits the set", (long long)batch);
        else if (per_rank >= 1)
            snprintf(fits, sizeof fits, "--batch-size 1 with an --accum-steps of at most %lld fits the set",
                     (long long)per_rank);
        else if (!strcmp(r->stage, "stage2")) /* one process: its devices are --gpus, not ranks */
            snprintf(fits, sizeof fits, "the set has fewer images than the run has devices (--gpus %d)", r->world_size);
        else snprintf(fits, sizeof fits, "the set has fewer images than the job has ranks (%d)", r->world_size);
        report_printf(&r->report, "  note: a full step is %lld images and the training set has %lld, so every step "
                      "was shorter; GFLOP/step is a full step's and the planned activations a full "
                      "--batch-size's — %s\n",
                      (long long)full, (long long)train_size_opened, fits);
    }
}

/* A stage prepares every batch size at setup (model.h: model_prepare); a forward of one it missed
 * planned its convolutions inside a timed step on a GPU. Say so, with the fix, and record the count. */
static void report_unprepared(Run *r) {
    const Model *m = r->model;
    if (m->unprepared_forwards)
        report_printf(&r->report, "  note: %lld forward pass%s ran a batch size never prepared (the last: %d): on a GPU "
                      "its convolutions were planned inside the step — call model_prepare at setup for every "
                      "batch size, a short last batch included\n", (long long)m->unprepared_forwards,
                      m->unprepared_forwards == 1 ? "" : "es", m->unprepared_last);
}

void run_evaluated(Run *r, double test_acc, double test_loss) {
    r->evaluated = 1;
    r->last_test_acc = test_acc;
    int64_t peaks[PEAKS_LISTED];
    size_t max_peak;
    peaks_of(r, peaks, PEAKS_LISTED, &max_peak);
    char mem[32];
    report_printf(&r->report, "evaluated %s: test loss %.4f acc %.2f%% over %lld image%s of %s | peak mem %s | %.1f s\n",
                  r->cfg->resume, test_loss, 100 * test_acc, (long long)test_size_opened,
                  test_size_opened == 1 ? "" : "s", test_source_opened,
                  fmt_bytes(mem, sizeof mem, (double)max_peak), time_now() - r->t_start);
    report_unprepared(r);
    json_begin(&r->report, "evaluate");
    json_str(&r->report, "stage", r->stage);
    json_str(&r->report, "checkpoint", r->cfg->resume);
    json_int(&r->report, "step", r->resumed.step); /* the optimizer steps that trained it */
    json_int(&r->report, "world_size", gated(r) ? r->world_size : 1); /* the processes that evaluated */
    json_num(&r->report, "test_loss", test_loss);
    json_num(&r->report, "test_acc", test_acc);
    json_int(&r->report, "test_images", test_size_opened);
    json_int(&r->report, "peak_mem_max_bytes", (int64_t)max_peak);
    json_int(&r->report, "unprepared_forwards", r->model->unprepared_forwards);
    json_end(&r->report);
}

/* The training's summary: console lines and the "summary" JSON record. */
static void summarize(Run *r) {
    const TrainConfig *c = r->cfg;
    trace_write(r);
    double med = median_ms(r), wall = time_now() - r->t_start;
    double ips = images_per_s(r, med);
    int64_t peaks[PEAKS_LISTED];
    size_t max_peak;
    int n_peaks = peaks_of(r, peaks, PEAKS_LISTED, &max_peak);
    char timing[128];
    fmt_timing(timing, sizeof timing, med, ips, c->accum_steps > 0 ? "step" : "it", " (median) | ");
    char resumed[80] = ""; /* the wall time is this run's: say how many of the steps it took */
    if (r->resumed_at_step > 0)
        snprintf(resumed, sizeof resumed, " (%lld in this run, resumed at %lld)",
                 (long long)(r->step - r->resumed_at_step), (long long)r->resumed_at_step);
    report_printf(&r->report, "summary: %lld %sstep%s%s in %.1f s | final train loss %.4f | test acc "
                              "%.2f%% | %s | data wait %.2f s\n",
                  (long long)r->step, c->accum_steps > 0 ? "optimizer " : "", r->step == 1 ? "" : "s", resumed, wall, plain_nan(r->last_train_loss),
                  100 * r->last_test_acc, timing, r->data_wait_s);
    Flops flops = run_flops(r, med);
    char mem[32];
    for (int i = 0; i < n_peaks && i < PEAKS_LISTED; i++) {
        char who[100];
        if (r->sum_across && r->world_size > 1) snprintf(who, sizeof who, "rank %d", i);
        else snprintf(who, sizeof who, "%s", r->devs[i]->name);
        report_printf(&r->report, "  peak memory %-28s %s\n", who, fmt_bytes(mem, sizeof mem, (double)peaks[i]));
    }
    if (n_peaks > PEAKS_LISTED)
        report_printf(&r->report, "  peak memory of %d more ranks (%d–%d) not listed; the largest of all %d: %s\n",
                      n_peaks - PEAKS_LISTED, PEAKS_LISTED, n_peaks - 1, n_peaks,
                      fmt_bytes(mem, sizeof mem, (double)max_peak));
    print_flops(r, &flops);
    report_unprepared(r);
    const int clipping = r->clip.max_norm > 0;
    int64_t clipped = clipping ? clip_clipped_steps(&r->clip) : 0;
    if (clipping)
        report_printf(&r->report, "  gradient clipping: %lld of %lld optimizer step%s%s had a total norm above %g and "
                      "%s scaled down\n", (long long)clipped, (long long)r->clip.steps, r->clip.steps == 1 ? "" : "s",
                      r->resumed_at_step > 0 ? " in this run" : "", r->clip.max_norm, clipped == 1 ? "was" : "were");
    if (r->stop_sig) { /* rank 0 saved this step (run_epoch_end); say how to go on from it */
        char who[64] = "";
        if (gated(r)) snprintf(who, sizeof who, " (received by %d of %d ranks)", r->stop_ranks, r->world_size);
        /* "the same command": a --resume alone meets this run's other flags' defaults (--batch-size 128, 8192
         * images, …) and is refused, its message listing the flags to add — the data position needs the
         * run's own */
        report_printf(&r->report, "stopped early by SIG%s%s after step %lld of %lld: continue with --resume %s (added "
                                  "to this same command, its other flags unchanged)\n",
                      status_signal_name(r->stop_sig), who, (long long)r->step, (long long)run_last_step(r),
                      r->last_saved ? r->last_saved : "(rank 0's last checkpoint)");
        launch_mark_stopped(r->stop_sig);
    }
    json_begin(&r->report, "summary");
    json_str(&r->report, "stage", r->stage);
    json_str(&r->report, "device", r->devs[0]->kind == DEV_CUDA ? "cuda" : "cpu");
    json_int(&r->report, "world_size", r->world_size);
    json_str(&r->report, "model", r->model->arch);
    json_str(&r->report, "norm", r->model->norm_bn ? "bn" : "none");
    json_int(&r->report, "batch_size", c->batch_size);
    json_int(&r->report, "accum_steps", r->accum);
    json_int(&r->report, "steps", r->step); /* optimizer steps */
    json_int(&r->report, "epochs", r->last_epoch_done);
    json_num(&r->report, "final_train_loss", r->last_train_loss);
    json_num(&r->report, "test_acc", r->last_test_acc);
    json_num(&r->report, "ms_per_iter_median", med);
    json_num(&r->report, "img_per_s", ips);
    json_num(&r->report, "data_wait_s", r->data_wait_s);
    json_num(&r->report, "wall_s", wall);
    json_int_list(&r->report, "peak_mem_bytes", peaks, n_peaks < PEAKS_LISTED ? n_peaks : PEAKS_LISTED);
    json_int(&r->report, "peak_mem_max_bytes", (int64_t)max_peak);
    json_num(&r->report, "model_gflop_per_image", flops.per_image / 1e9);
    json_num(&r->report, "model_gflop_per_step", flops.per_step / 1e9);
    json_num(&r->report, "achieved_tflops", flops.achieved);
    json_num(&r->report, "peak_tflops", flops.peak); /* all devices of the job */
    json_num(&r->report, "peak_fraction", flops.achieved / flops.peak);
    json_int(&r->report, "peak_devices", flops.devices);
    json_int(&r->report, "unprepared_forwards", r->model->unprepared_forwards);
    if (r->stop_sig) { /* only then: the summary keeps its keys */
        char stopped_by[16];
        snprintf(stopped_by, sizeof stopped_by, "SIG%s", status_signal_name(r->stop_sig));
        json_str(&r->report, "stopped_by", stopped_by);
    }
    if (clipping) { /* only then, as stopped_by; clip_steps: this run's (a resumed run's "steps" counts them all) */
        json_num(&r->report, "clip_grad_norm", r->clip.max_norm);
        json_int(&r->report, "clip_steps", r->clip.steps);
        json_int(&r->report, "clipped_steps", clipped);
    }
    json_str(&r->report, "peak_math", peak_math_name(flops.math));
    json_str(&r->report, "peak_source", flops.source);
    for (int i = 0; i < r->n_extras; i++) {
        if (r->extras[i].integer) json_int(&r->report, r->extras[i].key, (int64_t)r->extras[i].v);
        else json_num(&r->report, r->extras[i].key, r->extras[i].v);
    }
    json_end(&r->report);
}

void run_finish(Run *r) {
    if (!r->evaluated) summarize(r); /* --evaluate: run_evaluated said it all, and nothing was trained */
    report_close(&r->report);
    device_free(r->model->dev, r->state_counts);
    clip_destroy(&r->clip);
    free(r->times), free(r->last_saved);
}

int run_exit_code(const Run *r) { return r->stop_sig ? 128 + r->stop_sig : 0; }
