/* resume.c — a run resumed from its --resume checkpoint: loaded, checked against this run, and noted.
 *
 * A checkpoint holds the model, the optimizer's state and a position: epoch, batch and step. Resuming
 * continues the run that wrote it only where that position means the same samples and the same point
 * of training here. So it refuses another --seed, data source or --train-size, or other images of the
 * same size (the training set's signature, format version 9: another --data directory); inside an
 * epoch, another world size, --batch-size or --accum-steps; another shuffle (or --drop-last, where that
 * changes the shards); a position this run's schedule never reaches; and a run with nothing left to
 * train (finished, or at --steps already). Each refusal names the flag that continues it and every other one it needs
 * too (resume_also), so one retry fixes them all. A state holding a NaN or an infinity is refused as it
 * is read (refuse_nonfinite). What a PyTorch script may change on a resume is allowed, with a note of
 * what differs and the flags that restore it: the learning-rate schedule (schedule_note), --momentum,
 * --weight-decay and --clip-grad-norm (optimizer_note); at an epoch's end another world size, batch
 * size, K or --drop-last (at_epoch_end, regroup_note); in stages 1–2 another split of the same global
 * batch (same_samples). --evaluate takes the model alone (evaluate_resumed).
 *
 * Stages 1–2 are checked as run_begin loads the file; a job of processes only once its sampler flags
 * are known (run_sampler), rank 0 first and the others after its verdict (the gate, below), so a
 * refused file is reported once. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "trainer_internal.h"
#include "worker_status.h" /* die_collateral: a rank that stops because of rank 0's refusal */

/* How to give a run a sampler flag's setting back: only stages 3–5 have the flags. */
static const char *sampler_fix(const Run *r, int64_t flag_was_on, const char *flag, char *buf, size_t len) {
    if (!flag_was_on) snprintf(buf, len, "drop %s to continue it", flag);
    else if (r->sum_across) snprintf(buf, len, "pass %s to continue it", flag);
    else snprintf(buf, len, "%s has no %s: continue it with ./stage3 (or 4, 5) and %s", r->stage, flag, flag);
    return buf;
}

/* A checkpoint written at an epoch's end (its position records what it means: format version 2 on)
 * means only "E epochs done": epoch E+1 is the same permutation of the same samples whatever the
 * world size, batch size, --accum-steps or --drop-last that deals it out. So a resume there may change
 * those four (training on two GPUs after one, or on a bigger batch), as a PyTorch script may; its
 * step count is re-counted in this run's steps (resume: E × steps per epoch), and resume_check says so. */
static int at_epoch_end(const CheckpointMeta *g) { return g->version >= 2 && g->batch_in_epoch == 0; }

/* The sampler's settings: another shuffle gives another order, and --drop-last other shards —
 * though only where the ranks do not divide the training set (otherwise it drops nothing). */
static void sampler_check(Run *r, const CheckpointMeta *g) {
    const char *path = r->cfg->resume;
    char fix[160];
    if (g->version < 3) {
        report_printf(&r->report, "note: checkpoint '%s' has format version %u, which does not record --no-shuffle "
                      "or --drop-last: resuming assumes this run's are the ones it was trained with\n", path, g->version);
        return;
    }
    /* at an epoch's end no position is lost, but the rest of the run would be another run's order */
    char why[160];
    if (at_epoch_end(g))
        snprintf(why, sizeof why, "the epochs from %lld on would be dealt in another order than the run it continues",
                 (long long)g->epoch + 1);
    else
        snprintf(why, sizeof why, "its data position (epoch %lld, batch %lld) means other samples",
                 (long long)g->epoch + 1, (long long)g->batch_in_epoch);
    if (g->shuffle != r->shuffle)
        die_user("checkpoint '%s' was trained %s, this run %s: %s — %s", path,
                 g->shuffle ? "with shuffled epochs" : "with --no-shuffle", r->shuffle ? "shuffles" : "has --no-shuffle",
                 why, sampler_fix(r, !g->shuffle, "--no-shuffle", fix, sizeof fix));
    if (g->drop_last != r->drop_last && train_size_opened % r->world_size != 0 && !at_epoch_end(g))
        die_user("checkpoint '%s' was trained %s --drop-last, this run %s: %lld samples over %d ranks make other "
                 "shards — %s", path, g->drop_last ? "with" : "without",
                 r->drop_last ? "has it" : "has not", (long long)train_size_opened, r->world_size,
                 sampler_fix(r, g->drop_last, "--drop-last", fix, sizeof fix));
}

/* v as the shortest %g text that reads back as v: a flag the note suggests must give the same double. */
static const char *exact_g(double v, char buf[32]) {
    for (int p = 6; p < 17; p++) {
        snprintf(buf, 32, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return buf;
    }
    snprintf(buf, 32, "%.17g", v);
    return buf;
}

/* The learning rate the checkpoint's own schedule (kind `was`) gives optimizer step `step`. */
static double checkpoint_lr_at(const CheckpointMeta *g, const char *was, int64_t step) {
    return lr_schedule(was, g->lr, g->warmup_steps, g->warmup_start_factor, step, g->schedule_steps);
}

/* The first optimizer step, from the resumed one on, at which this run's learning rate is not the one the
 * checkpoint's schedule gives; −1 when the two agree wherever both run. A checkpoint at or past either
 * end (more --epochs after a finished run) differs wherever its flags do: the base rate, the kind, a
 * cosine's length, or the warm-up. */
static int64_t schedule_differs_at(const Run *r, const CheckpointMeta *g, const char *was) {
    const TrainConfig *c = r->cfg;
    const int64_t end = r->total_steps < g->schedule_steps ? r->total_steps : g->schedule_steps;
    for (int64_t s = g->step; s < end; s++)
        if (run_lr_at(r, s) != checkpoint_lr_at(g, was, s)) return s;
    if (g->step >= end && (c->lr != g->lr || strcmp(c->schedule, was) ||
                           (!strcmp(was, "cosine") && r->total_steps != g->schedule_steps) ||
                           c->warmup_steps != g->warmup_steps || c->warmup_start_factor != g->warmup_start_factor))
        return g->step;
    return -1;
}

/* The learning-rate schedule is the one flag set a resume may change (PyTorch lets a script build a
 * new scheduler, though loading the old one's state_dict restores its T_max): continue, but say where
 * the learning rate now jumps, and how to continue the checkpoint's own schedule instead. */
static void schedule_note(Run *r) {
    const TrainConfig *c = r->cfg;
    const CheckpointMeta *g = &r->resumed;
    if (g->schedule == CKPT_SCHED_UNKNOWN) return; /* an older checkpoint: nothing to compare */
    const char *was = g->schedule == CKPT_SCHED_COSINE ? "cosine" : "const";
    /* a version 6 checkpoint has no warm-up fields: it had none. Flags that differ only where the run no
     * longer goes (another warm-up, once past both) change nothing, and say nothing. */
    const int64_t at = schedule_differs_at(r, g, was);
    if (at < 0) return;
    double then = checkpoint_lr_at(g, was, at), now = run_lr_at(r, at);
    char epochs[64] = "", warm_then[96] = "", warm_now[96] = "", warm_fix[96] = "", lr_text[32], factor_text[32];
    if (g->schedule == CKPT_SCHED_COSINE && g->schedule_steps % r->steps_per_epoch == 0)
        snprintf(epochs, sizeof epochs, " --epochs %lld", (long long)(g->schedule_steps / r->steps_per_epoch));
    if (g->warmup_steps > 0) {
        snprintf(warm_then, sizeof warm_then, " after %lld warm-up steps from %g × lr", (long long)g->warmup_steps,
                 g->warmup_start_factor);
        snprintf(warm_fix, sizeof warm_fix, " --warmup-steps %lld --warmup-start-factor %s", (long long)g->warmup_steps,
                 exact_g(g->warmup_start_factor, factor_text));
    } else if (c->warmup_steps > 0)
        snprintf(warm_fix, sizeof warm_fix, " --warmup-steps 0");
    if (c->warmup_steps > 0)
        snprintf(warm_now, sizeof warm_now, " after %lld warm-up steps from %g × lr", (long long)c->warmup_steps,
                 c->warmup_start_factor);
    /* A cosine the checkpoint had run to its end has nothing left to continue: its own flags would make a
     * finished run, which a resume refuses — say so instead of offering them. */
    char fix[256];
    if (g->schedule == CKPT_SCHED_COSINE && g->step >= g->schedule_steps)
        snprintf(fix, sizeof fix, "its cosine ended at step %lld, so none of it is left to continue: training on "
                 "takes a schedule of its own, as this run's", (long long)g->schedule_steps);
    else
        snprintf(fix, sizeof fix, "to continue its schedule, resume with --schedule %s%s --lr %s%s", was, epochs,
                 exact_g(g->lr, lr_text), warm_fix);
    report_printf(&r->report, "note: checkpoint '%s' was trained with --schedule %s over %lld step%s at --lr %g%s; "
                              "this run has --schedule %s over %lld step%s at --lr %g%s: at step %lld the learning "
                              "rate is %g, not the %g that run would use (%s)\n",
                  c->resume, was, (long long)g->schedule_steps, g->schedule_steps == 1 ? "" : "s", g->lr, warm_then,
                  c->schedule, (long long)r->total_steps, r->total_steps == 1 ? "" : "s", c->lr, warm_now,
                  (long long)at, now, then, fix);
}

/* The optimizer's hyperparameters (format version 8) may change on a resume too, as the schedule may: this
 * run's flags are used. PyTorch's optimizer.load_state_dict would restore the checkpoint's momentum and
 * weight_decay from its param_groups over the script's, while clip_grad_norm_'s max_norm is the script's
 * argument there, in no state_dict. Say what differs, and the flags that continue as the checkpoint was. */
static void optimizer_note(Run *r) {
    const CheckpointMeta *g = &r->resumed;
    if (g->version < 8) return; /* an older checkpoint: nothing to compare */
    const double then[3] = {g->momentum, g->weight_decay, g->clip_grad_norm},
                 now[3] = {r->opt->momentum, r->opt->weight_decay, r->clip.max_norm};
    static const char *const flag[3] = {"--momentum", "--weight-decay", "--clip-grad-norm"};
    static const char *const group[3] = {"momentum", "weight_decay", NULL}; /* param_groups' names */
    char was[160] = "", has[160] = "", fix[160] = "", restored[40] = "", text[32];
    int n = 0, clip = 0;
#define ADD(buf, sep, fmt, ...) \
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s" fmt, *buf ? sep : "", __VA_ARGS__)
    for (int i = 0; i < 3; i++) {
        if (then[i] == now[i]) continue;
        n++;
        if (i == 2 && then[i] == 0) ADD(was, ", ", "no %s", flag[i]); /* 0: no clipping */
        else ADD(was, ", ", "%s %s", flag[i], exact_g(then[i], text)); /* values that differ print apart */
        if (i == 2 && now[i] == 0) ADD(has, ", ", "no %s", flag[i]);
        else ADD(has, ", ", "%s %s", flag[i], exact_g(now[i], text));
        ADD(fix, " ", "%s %s", flag[i], exact_g(then[i], text));
        if (group[i]) ADD(restored, " and ", "%s", group[i]);
        else clip = 1;
    }
#undef ADD
    if (!n) return;
    char torch[256];
    if (!*restored)
        snprintf(torch, sizeof torch, "as in PyTorch, where clip_grad_norm_ takes max_norm from the script and no "
                 "state_dict holds it");
    else
        snprintf(torch, sizeof torch, "where PyTorch's optimizer.load_state_dict would restore the checkpoint's %s "
                 "from its param_groups%s", restored,
                 clip ? ", though not max_norm, which clip_grad_norm_ takes from the script" : "");
    report_printf(&r->report, "note: checkpoint '%s' was trained with %s; this run has %s: this run's value%s %s used, "
                              "%s (to continue the checkpoint as it was, resume with %s)\n",
                  r->cfg->resume, was, has, n == 1 ? "" : "s", n == 1 ? "is" : "are", torch, fix);
}

/* A resume at an epoch's end under another world size, batch size, K or --drop-last (at_epoch_end):
 * say what changed, where the step count now stands, and the learning rate there against the one
 * the checkpoint's own schedule had reached. */
static void regroup_note(Run *r) {
    const TrainConfig *c = r->cfg;
    const CheckpointMeta *g = &r->resumed;
    char what[400] = ""; /* what changed, ", "-separated */
#define CHANGED(fmt, ...) \
    snprintf(what + strlen(what), sizeof what - strlen(what), "%s" fmt, *what ? ", " : "", __VA_ARGS__)
    if (g->world_size != r->world_size)
        CHANGED("%lld device%s → %d", (long long)g->world_size, g->world_size == 1 ? "" : "s", r->world_size);
    if (g->batch_size != c->batch_size) CHANGED("--batch-size %lld → %d", (long long)g->batch_size, c->batch_size);
    if (g->accum_steps != r->accum) CHANGED("--accum-steps %lld → %d", (long long)g->accum_steps, r->accum);
    if (g->version >= 3 && g->drop_last != r->drop_last)
        CHANGED("--drop-last %s → %s", g->drop_last ? "on" : "off", r->drop_last ? "on" : "off");
#undef CHANGED
    if (!*what && r->step == g->step) return; /* the same run, continued: nothing to say */
    char then[200];
    if (r->step == g->step) /* the same steps an epoch (2 ranks × 64 → 1 × 128): nothing re-counted */
        snprintf(then, sizeof then, ", at step %lld (%lld step%s an epoch, as before)", (long long)r->step,
                 (long long)r->steps_per_epoch, r->steps_per_epoch == 1 ? "" : "s");
    else
        snprintf(then, sizeof then, " — at step %lld of this run's schedule (%lld step%s an epoch; the checkpoint "
                 "counted %lld step%s), as a script that steps its scheduler once an epoch would", (long long)r->step,
                 (long long)r->steps_per_epoch, r->steps_per_epoch == 1 ? "" : "s", (long long)g->step,
                 g->step == 1 ? "" : "s");
    char lr_then[128] = ""; /* the same count: schedule_note compares the two schedules */
    if (g->schedule != CKPT_SCHED_UNKNOWN && r->step != g->step)
        snprintf(lr_then, sizeof lr_then, "; the learning rate there is %g (the checkpoint's schedule was at %g)",
                 run_lr_at(r, r->step),
                 checkpoint_lr_at(g, g->schedule == CKPT_SCHED_COSINE ? "cosine" : "const", g->step));
    report_printf(&r->report, "note: checkpoint '%s' ends epoch %lld%s%s: epoch %lld is the same permutation of the "
                  "samples, dealt out in other batches, so the run continues there%s%s\n", c->resume,
                  (long long)g->epoch, *what ? ", and this run has " : "", what, (long long)g->epoch + 1, then, lr_then);
}

/* A checkpoint's data position means "batch_in_epoch batches of world_size × batch_size samples of
 * epoch's permutation (or order: --no-shuffle) of train_size samples, K batches per optimizer step":
 * continue it only under the same meaning, else say which flag differs. */
/* Stages 1 and 2 read one loader of world × batch samples a step (stage 2's GPUs share one
 * DataLoader, as nn.DataParallel's do, and split each batch it gives): inside an epoch too, the
 * position means those samples whichever way they are split — 3 GPUs × 16 continue as 2 × 24 or
 * as one device's 48. A job of processes shards them by rank (stages 3–5): there each must match.
 * Its checkpoint's steps read the same samples too (the ranks' shards interleave), unless its
 * shards were padded or cut (world not dividing the set): so only then is the split checked. */
static int splittable(const Run *r, const CheckpointMeta *g) {
    return !r->sum_across && g->version >= 2 &&
           (g->world_size == 1 || (train_size_opened > 0 && train_size_opened % g->world_size == 0));
}
/* Stages 4 and 5 take --accum-steps; stages 1–3 step once per batch. */
static int stage_has_accum(const Run *r) {
    return strcmp(r->stage, "stage1") && strcmp(r->stage, "stage2") && strcmp(r->stage, "stage3");
}
static int same_samples(const Run *r, const CheckpointMeta *g) {
    return splittable(r, g) && g->world_size * g->batch_size == (int64_t)r->world_size * r->cfg->batch_size;
}

/* The checkpoint records its training set's signature (format version 9) and this run's --data holds
 * other images of the same size: another CIFAR-10-format directory (the synthetic set exported by
 * tests/write_synthetic, say), or a copy changed since. (Another size is --train-size's to name.) */
static int other_images(const CheckpointMeta *g) {
    return g->version >= 9 && g->data_signature != train_signature_opened && data_source_opened == CKPT_DATA_CIFAR10 &&
           g->data_source == CKPT_DATA_CIFAR10 && g->train_size == train_size_opened;
}

/* The flags a refused resume also needs, besides the one its message names (`skip`): every simple
 * setting the checkpoint was trained with that this run gives otherwise, as " (it also needs --seed 0
 * --train-size 96)". A student who forgot the run's flags then fixes them in one retry, not one refusal
 * at a time. The world size is left to its own message, which names each stage's flag for it. */
static void also_add(char *buf, size_t n, size_t *at, const char *skip, const char *key, const char *item) {
    if (strcmp(key, skip) && *at < n)
        *at += (size_t)snprintf(buf + *at, n - *at, "%s%s", *at ? " " : " (it also needs ", item);
}
static const char *resume_also(const Run *r, const CheckpointMeta *g, const char *skip, char *buf, size_t n) {
    const TrainConfig *c = r->cfg;
    const int free_batch = at_epoch_end(g) || same_samples(r, g); /* where another batch size continues */
    char item[64];
    size_t at = 0;
    buf[0] = 0;
    if (g->seed != c->seed)
        snprintf(item, sizeof item, "--seed %lld", (long long)g->seed), also_add(buf, n, &at, skip, "--seed", item);
    if (g->data_source != CKPT_DATA_UNKNOWN && data_source_opened && g->data_source != data_source_opened)
        also_add(buf, n, &at, skip, "--data",
                 g->data_source == CKPT_DATA_CIFAR10 ? "--data with its CIFAR-10 directory" : "no --data");
    else if (other_images(g))
        also_add(buf, n, &at, skip, "--data", "the --data it was trained on");
    if (g->version >= 2 && g->batch_size != c->batch_size && !free_batch)
        snprintf(item, sizeof item, "--batch-size %lld", (long long)g->batch_size),
            also_add(buf, n, &at, skip, "--batch-size", item);
    if (g->version >= 2 && g->train_size && train_size_opened && g->train_size != train_size_opened)
        snprintf(item, sizeof item, "--train-size %lld", (long long)g->train_size),
            also_add(buf, n, &at, skip, "--train-size", item);
    if (g->version >= 2 && g->accum_steps != r->accum && !at_epoch_end(g) && stage_has_accum(r))
        snprintf(item, sizeof item, "--accum-steps %lld", (long long)g->accum_steps),
            also_add(buf, n, &at, skip, "--accum-steps", item);
    if (at && at < n) snprintf(buf + at, n - at, ")");
    return buf;
}

static void resume_check(Run *r) {
    const TrainConfig *c = r->cfg;
    const CheckpointMeta *g = &r->resumed;
    const char *path = c->resume;
    char also[240];
    /* stage 1 has no count to give: name the stage that has one */
    const char *ranks = !strcmp(r->stage, "stage1")   ? "the stage that wrote it (stage 2's --gpus, or stages "
                                                        "3–5's --nproc-per-node × --nnodes)"
                        : !strcmp(r->stage, "stage2") ? "--gpus"
                                                      : "--nproc-per-node × --nnodes";
    /* Why another count cannot continue it: inside an epoch, the position means other samples (at an
     * epoch's end it may change: at_epoch_end); a version 1 file does not say what its step count —
     * which the learning-rate schedule and every later checkpoint's position count in — means. */
    char why[200];
    const int regrouped = at_epoch_end(g); /* world, batch, K and --drop-last may change (at_epoch_end) */
    const int64_t global = (int64_t)r->world_size * c->batch_size;
    const int same = same_samples(r, g);
    if (g->batch_in_epoch)
        snprintf(why, sizeof why, "its data position (epoch %lld, batch %lld) means other samples",
                 (long long)g->epoch + 1, (long long)g->batch_in_epoch);
    else
        snprintf(why, sizeof why, "its step count (%lld steps, which the learning-rate schedule counts) means another "
                 "point of training", (long long)g->step);
    char or_global[160] = ""; /* stages 1 and 2: the other way to read the same samples */
    if (splittable(r, g))
        snprintf(or_global, sizeof or_global, !strcmp(r->stage, "stage2")
                     ? ", or --gpus × --batch-size giving its %lld samples a step"
                     : ", or --batch-size %lld: its samples a step", (long long)(g->world_size * g->batch_size));
    /* Stages 1–3 have no --accum-steps: a stage 4/5 checkpoint inside an epoch resumes there. Said first,
     * before another world or --batch-size: no count of those would continue it in this stage. */
    if (g->version >= 2 && g->accum_steps != r->accum && !stage_has_accum(r) && !regrouped)
        die_user("checkpoint '%s' was trained with %lld micro-batches per optimizer step (stage 4 or 5's "
                 "--accum-steps), %s takes one: its step count means other positions — resume it with stage 4 "
                 "or 5 and --accum-steps %lld", path, (long long)g->accum_steps, r->stage,
                 (long long)g->accum_steps);
    if (g->world_size != r->world_size && !regrouped && !same)
        die_user("checkpoint '%s' was trained on %lld device%s (ranks, or stage 2's GPUs), this run has %d: %s with "
                 "another count — resume with %s giving %lld%s%s", path, (long long)g->world_size,
                 g->world_size == 1 ? "" : "s", r->world_size, why, ranks, (long long)g->world_size, or_global,
                 resume_also(r, g, "", also, sizeof also));
    /* The data source before the sizes: synthetic and CIFAR-10 sets of one size are other samples. */
    if (g->data_source != CKPT_DATA_UNKNOWN && data_source_opened && g->data_source != data_source_opened)
        die_user("checkpoint '%s' was trained on %s, this run reads %s: its data position (epoch %lld, batch %lld) "
                 "means other samples — %s to continue it%s", path,
                 g->data_source == CKPT_DATA_CIFAR10 ? "CIFAR-10 (--data)" : "synthetic data (no --data)",
                 data_source_opened == CKPT_DATA_CIFAR10 ? "CIFAR-10 (--data)" : "synthetic data",
                 (long long)g->epoch + 1, (long long)g->batch_in_epoch,
                 g->data_source == CKPT_DATA_CIFAR10 ? "pass --data with the CIFAR-10 directory it was trained on"
                                                     : "drop --data",
                 resume_also(r, g, "--data", also, sizeof also));
    if (g->version == 3)
        report_printf(&r->report, "note: checkpoint '%s' has format version 3, which does not record whether it was "
                      "trained on synthetic data or --data: resuming assumes this run's is the one\n", path);
    if (g->version < 2)
        report_printf(&r->report, "note: checkpoint '%s' has format version 1, which does not record "
                      "its batch size, training-set size, --accum-steps, --no-shuffle or --drop-last: resuming "
                      "assumes this run's are the ones it was trained with\n", path);
    else {
        if (g->batch_size != c->batch_size && !regrouped && !same)
            die_user("checkpoint '%s' was trained with --batch-size %lld, this run has --batch-size %d: %s — pass "
                     "--batch-size %lld to continue it%s", path, (long long)g->batch_size, c->batch_size, why,
                     (long long)g->batch_size, resume_also(r, g, "--batch-size", also, sizeof also));
        if (g->train_size && train_size_opened && g->train_size != train_size_opened)
            die_user("checkpoint '%s' was trained on %lld training samples, this run has %lld: its shuffled order "
                     "differs — pass --train-size %lld (and the same --data) to continue it%s", path,
                     (long long)g->train_size, (long long)train_size_opened, (long long)g->train_size,
                     resume_also(r, g, "--train-size", also, sizeof also));
        if (g->accum_steps != r->accum && !regrouped)
            die_user("checkpoint '%s' was trained with --accum-steps %lld, this run has --accum-steps %d: its step "
                     "count means other positions — resume with the flags it was trained with (--accum-steps %lld)%s",
                     path, (long long)g->accum_steps, r->accum, (long long)g->accum_steps,
                     resume_also(r, g, "--accum-steps", also, sizeof also));
    }
    /* The training set itself (format version 9): the same source and size may still be other images, and
     * the run would continue on other samples without a word — at an epoch's end too (another run's data
     * is no continuation of this one's). For synthetic data the seed and size were checked: a signature
     * that differs then is another build's generator (or an edited file). */
    if (g->version >= 9 && g->data_signature != train_signature_opened) {
        if (data_source_opened == CKPT_DATA_CIFAR10)
            die_user("checkpoint '%s' was trained on other images than --data '%s' holds: its %lld training images "
                     "have signature %016llx, this run's %016llx — the run would continue on other samples: resume with "
                     "the --data it was trained on, or start a new run (drop --resume)%s", path, c->data,
                     (long long)g->train_size, (unsigned long long)g->data_signature,
                     (unsigned long long)train_signature_opened, resume_also(r, g, "--data", also, sizeof also));
        die_user("checkpoint '%s' was trained on synthetic data other than this trainer draws from --seed %lld and "
                 "--train-size %lld (signature %016llx, here %016llx): it was written by a build whose generator "
                 "differs, or edited since — resume it with the build that wrote it, or start a new run (drop "
                 "--resume)", path, (long long)c->seed, (long long)train_size_opened,
                 (unsigned long long)g->data_signature, (unsigned long long)train_signature_opened);
    }
    if (g->version < 9)
        report_printf(&r->report, "note: checkpoint '%s' has format version %u, which does not record a signature of "
                      "its training data: whether this run's %s the one it was trained on could not be checked\n",
                      path, g->version, data_source_opened == CKPT_DATA_CIFAR10 ? "--data is" : "synthetic data is");
    if (g->version >= 2) sampler_check(r, g); /* version 1 has had its note */
    /* Stopped inside an epoch beyond this run's last: not a finished run (its own --epochs went further,
     * which its schedule's length says when this run counts the same steps an epoch) */
    if (g->epoch >= c->epochs && g->batch_in_epoch > 0) {
        char fix[160];
        snprintf(fix, sizeof fix, "pass --epochs %lld or more to continue it", (long long)g->epoch + 1);
        if (g->version >= 6 && g->schedule_steps % r->steps_per_epoch == 0 &&
            g->schedule_steps / r->steps_per_epoch > g->epoch)
            snprintf(fix, sizeof fix, "pass --epochs %lld, as it was trained, to continue it (or any from %lld on)",
                     (long long)(g->schedule_steps / r->steps_per_epoch), (long long)g->epoch + 1);
        die_user("checkpoint '%s' stopped inside epoch %lld (batch %lld, step %lld), past this run's --epochs %d — "
                 "nothing to resume; %s", path, (long long)g->epoch + 1, (long long)g->batch_in_epoch,
                 (long long)g->step, c->epochs, fix);
    }
    if (g->epoch >= c->epochs)
        die_user("checkpoint '%s' is a finished run: %lld epoch%s done (step %lld), and this run has --epochs %d — "
                 "nothing to resume; pass --epochs above %lld to train further", path, (long long)g->epoch,
                 g->epoch == 1 ? "" : "s",
                 (long long)g->step, c->epochs, (long long)g->epoch);
    if (c->steps > 0 && r->step >= c->steps)
        die_user("checkpoint '%s' is already at step %lld%s, and this run stops at --steps %lld — nothing to resume; "
                 "raise --steps (or drop it) to train further", path, (long long)r->step,
                 r->step != g->step ? " of this run's schedule" : "", (long long)c->steps);
    /* The position must be one this schedule reaches: the right step count for it, on an optimizer
     * step (a group boundary of K under accumulation). epoch < --epochs, so nothing overflows. */
    int64_t expect_step = g->epoch * r->steps_per_epoch + (g->batch_in_epoch + r->accum - 1) / r->accum;
    if (g->batch_in_epoch > r->batches_per_epoch ||
        (g->batch_in_epoch % r->accum && g->batch_in_epoch != r->batches_per_epoch) || r->step != expect_step)
        die_user("checkpoint '%s' (step %lld: epoch %lld, batch %lld) is not a position of this run's schedule "
                 "(%lld batches per epoch%s) — resume with the --batch-size, --train-size, data, world size, "
                 "--accum-steps and --drop-last it was trained with", path, (long long)g->step, (long long)g->epoch + 1,
                 (long long)g->batch_in_epoch, (long long)r->batches_per_epoch,
                 r->accum > 1 ? ", one optimizer step per --accum-steps of them" : "");
    r->resume_unchecked = 0;
    report_printf(&r->report, "resumed from %s: step %lld, epoch %lld, batch %lld\n", path, (long long)r->step,
                  (long long)g->epoch + 1, (long long)g->batch_in_epoch);
    if (regrouped) regroup_note(r);
    else if (same && g->world_size != r->world_size)
        report_printf(&r->report, "note: checkpoint '%s' was trained on %lld device%s × --batch-size %lld, this run has "
                      "%d × %d: the same %lld samples a step, so it continues at its position (each device now "
                      "computes on %d of them, and batch norm's statistics with them)\n", path,
                      (long long)g->world_size, g->world_size == 1 ? "" : "s", (long long)g->batch_size,
                      r->world_size, c->batch_size, (long long)global, c->batch_size);
    if (r->step == g->step) schedule_note(r); /* re-counted steps: regroup_note compares the two rates */
    optimizer_note(r);
}

/* In a job of processes every rank reads --resume's file (as every PyTorch rank calls torch.load),
 * so a file they all refuse would print the same error once per rank. Rank 0 checks first; the
 * others wait for its verdict in a small sum (GATE_VALUES numbers), and check after it. When rank 0
 * refuses the file, its error is printed and its last words (die_last_words) put a large negative
 * number into that sum: the others stop at once with one line pointing at it — not at a timeout,
 * also under srun or mpirun, where no launcher of ours stops them. Every rank sums once at each of two points
 * (run_begin's file checks, run_sampler's checks against the sampler flags), resumed or not, so the
 * sums pair up. They also count the ranks given a --resume and, at the second, add the steps the
 * ranks resumed at (a stale file of the same name on one node would put that rank at another) and
 * the files' checksums (another run's file at the same step would start the replicas apart:
 * each rank takes its weights and momentum from its own file). */
#define GATE_REFUSED (-1e9)       /* rank 0 refused the --resume checkpoint (the others add at most 2^24) */
#define GATE_REFUSED_FLAGS (-3e9) /* …or this run's flags (run_begin's own checks, before the resume) */
#define GATE_VALUES 8             /* the sum's length, the same in both (gate_sum, gate_refused) */
static Run *gate_run;         /* rank 0, inside its checks: whom the last words speak for */
static pthread_t gate_thread; /* …and the thread they run on (the one that uses the communicator) */
int gate_flags;               /* rank 0 is checking the flags, not yet the checkpoint */

static void gate_refused(void) {
    if (!gate_run || !pthread_equal(gate_thread, pthread_self())) return;
    Run *r = gate_run;
    gate_run = NULL;
    double v[GATE_VALUES] = {gate_flags ? GATE_REFUSED_FLAGS : GATE_REFUSED};
    r->sum_across(r->sum_ctx, v, GATE_VALUES);
}

/* The sum and what every rank reads from it. */
static void gate_sum(Run *r, int second) {
    /* the checksum in two 24-bit halves' worth of it (48 bits): sums of up to 2^29 ranks stay exact */
    const uint64_t ck = r->resumed.checksum;
    const double hi = (double)(ck >> 40), lo = (double)((ck >> 16) & 0xffffff);
    /* and who has --save and --report: only rank 0 saves and reports, so either given to other ranks
     * alone would write nothing */
    const int save = r->cfg->save[0] != 0, report = r->cfg->report[0] != 0;
    double v[GATE_VALUES] = {r->cfg->resume[0] != 0, (double)r->step, hi, lo, save, save && r->rank == 0,
                             report, report && r->rank == 0};
    r->sum_across(r->sum_ctx, v, GATE_VALUES);
    r->job_saves = v[4] > 0;
    if (v[0] < 0)
        die_collateral(1, 2, "rank %d: rank 0 refused %s — see its error", r->rank,
                       v[0] < (GATE_REFUSED + GATE_REFUSED_FLAGS) / 2 ? "this run's flags" : "the --resume checkpoint");
    if (v[0] != 0 && v[0] != r->world_size)
        die_collateral(r->rank != 0, 2, "rank %d: --resume is given to %.0f of the %d ranks — give every rank the "
                       "same --resume, or none", r->rank, v[0], r->world_size);
    if (v[4] > 0 && v[5] == 0)
        die_collateral(r->rank != 0, 2, "rank %d: --save is given to %.0f of the %d ranks, but not to rank 0, the "
                       "one that saves: nothing would be saved — give rank 0 --save (best: every rank the same "
                       "command line)", r->rank, v[4], r->world_size);
    if (v[6] > 0 && v[7] == 0)
        die_collateral(r->rank != 0, 2, "rank %d: --report is given to %.0f of the %d ranks, but not to rank 0, the "
                       "one that writes it: nothing would be written — give rank 0 --report (best: every rank the "
                       "same command line)", r->rank, v[6], r->world_size);
    if (second && v[1] != (double)r->step * r->world_size)
        die_collateral(r->rank != 0, 2, "rank %d: the ranks resumed at different steps (this one at step %lld) — "
                       "give every rank the same checkpoint", r->rank, (long long)r->step);
    if (second && (v[2] != hi * r->world_size || v[3] != lo * r->world_size))
        die_collateral(r->rank != 0, 2, "rank %d: the ranks resumed from different checkpoints at the same step "
                       "(this one's '%s' has checksum %016llx) — each rank would start from its own weights and "
                       "momentum: give every rank the same checkpoint (a copy of the same file on each node)",
                       r->rank, r->cfg->resume, (unsigned long long)ck);
}

/* Around the checks of a --resume: rank 0 checks, then sums; the others sum, then check. */
void gate_before_checks(Run *r, int second) {
    if (!gated(r)) return;
    if (r->rank == 0) gate_run = r, gate_thread = pthread_self(), die_last_words = gate_refused;
    else gate_sum(r, second);
}
void gate_after_checks(Run *r, int second) {
    if (!gated(r) || r->rank != 0) return;
    gate_run = NULL, die_last_words = NULL;
    gate_sum(r, second);
}

void run_sampler(Run *r, int shuffle, int drop_last) {
    r->shuffle = shuffle, r->drop_last = drop_last;
    gate_before_checks(r, 1);
    if (r->resume_unchecked) resume_check(r);
    gate_after_checks(r, 1);
}

/* --evaluate: only the model is taken — weights and batch-norm statistics, whatever optimizer, batch
 * size, world size or position trained it. Its test set must be the one it learned for: synthetic
 * data is drawn from --seed (another seed is another task), and CIFAR-10 is not synthetic data. */
static void evaluate_resumed(Run *r, const CheckpointMeta *g) {
    const TrainConfig *c = r->cfg;
    if (g->data_source != CKPT_DATA_UNKNOWN && g->data_source != data_source_opened)
        die_user("checkpoint '%s' was trained on %s, and this run would test it on %s: %s", c->resume,
                 g->data_source == CKPT_DATA_CIFAR10 ? "CIFAR-10" : "synthetic data",
                 data_source_opened == CKPT_DATA_CIFAR10 ? "CIFAR-10 (--data)" : "synthetic data (no --data)",
                 g->data_source == CKPT_DATA_CIFAR10 ? "pass --data with the CIFAR-10 directory"
                                                     : "drop --data to test it on its own synthetic test set");
    if (data_source_opened == CKPT_DATA_SYNTHETIC && g->seed != c->seed)
        die_user("checkpoint '%s' was trained with --seed %lld, and the synthetic test set is drawn from the seed "
                 "(another seed is another task) — pass --seed %lld to test it", c->resume, (long long)g->seed,
                 (long long)g->seed);
    char when[96];
    if (g->batch_in_epoch == 0)
        snprintf(when, sizeof when, "epoch %lld (step %lld)", (long long)g->epoch, (long long)g->step);
    else
        snprintf(when, sizeof when, "step %lld (batch %lld of epoch %lld)", (long long)g->step,
                 (long long)g->batch_in_epoch, (long long)g->epoch + 1);
    report_printf(&r->report, "evaluating %s: the model after %s, trained on %lld device%s — training nothing\n",
                  c->resume, when, (long long)g->world_size, g->world_size == 1 ? "" : "s");
}

/* A checkpoint's state holding a NaN or an infinity: a diverged run's, saved by a build from before
 * run_epoch_end refused to save one (version 5 and 6 files still load), or a file made so. Every step
 * would compute from it, and --evaluate would report a NaN loss as a result, so it is refused here —
 * not after an epoch of training that ends in "diverged … lower --lr" naming this very file as the
 * good one. Scanned on the host, where checkpoint_load put it: once per resume. */
static void refuse_nonfinite(const char *path, const float *x, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            die_user("checkpoint '%s' cannot be used: %s not finite (NaN or inf) — the run that saved it had "
                     "diverged; use an earlier checkpoint of that run (and, to train on, a lower --lr)", path, what);
}

void run_resume(Run *r) {
    const TrainConfig *c = r->cfg;
    Model *m = r->model;
    CheckpointMeta expect = {0}, got;
    snprintf(expect.arch, sizeof expect.arch, "%s", m->arch);
    snprintf(expect.norm, sizeof expect.norm, "%s", m->norm_bn ? "bn" : "none");
    expect.n_params = m->n_param_floats;
    expect.n_buffers = m->n_buffer_floats;
    expect.shape_hash = m->shape_hash;
    expect.head_params = model_head_floats(m);
    Adam *adam = r->opt->adam;
    expect.optimizer = c->evaluate ? CKPT_OPT_ANY : adam ? CKPT_OPT_ADAM : CKPT_OPT_SGD;
    expect.evaluating = c->evaluate;
    /* --evaluate takes a checkpoint trained with --unused-param's head into a model without it */
    if (c->evaluate && !m->unused_params) expect.head_hash = model_shape_hash_with_head(m);
    size_t pb = (size_t)(m->n_param_floats + (expect.head_hash ? expect.head_params : 0)) * sizeof(float);
    float *p = xmalloc(pb), *mom = xmalloc(pb), *sq = adam || c->evaluate ? xmalloc(pb) : NULL;
    float *buf = xmalloc((size_t)(m->n_buffer_floats + 1) * sizeof(float));
    checkpoint_load(c->resume, &expect, &got, p, buf, mom, sq);
    r->resumed = got;
    refuse_nonfinite(c->resume, p, got.n_params, "the parameters are"); /* the model: --evaluate's too */
    refuse_nonfinite(c->resume, buf, got.n_buffers, "the batch-norm running statistics are");
    if (!c->evaluate) {
        refuse_nonfinite(c->resume, mom, got.n_params,
                         got.optimizer == CKPT_OPT_ADAM ? "Adam's moments are" : "the momentum buffer is");
        if (got.optimizer == CKPT_OPT_ADAM) refuse_nonfinite(c->resume, sq, got.n_params, "Adam's moments are");
    }
    if (c->evaluate) { /* the model alone: no optimizer state, no position */
        model_write_oihw(m, p, m->param_flat); /* the head, if any, comes after the model's own */
        device_copy_h2d(m->dev, m->buffer_flat, buf, (size_t)m->n_buffer_floats * sizeof(float));
        device_sync(m->dev);
        free(p), free(mom), free(buf), free(sq);
        /* its refusals exit: freed first — an ASan build (-O2) whose compiler kept an array's pointer
         * only where LeakSanitizer does not look reported that array as leaked at the exit */
        evaluate_resumed(r, &got);
        return;
    }
    if (got.seed != c->seed) {
        char also[240];
        free(p), free(mom), free(buf), free(sq); /* before the exit, as for --evaluate's refusals above */
        die_user("checkpoint '%s' was trained with --seed %lld, this run has --seed %lld — pass "
                 "--seed %lld to continue it%s", c->resume, (long long)got.seed, (long long)c->seed,
                 (long long)got.seed, resume_also(r, &got, "--seed", also, sizeof also));
    }
    model_write_oihw(m, p, m->param_flat); /* the file is in PyTorch's order (model.h) */
    device_copy_h2d(m->dev, m->buffer_flat, buf, (size_t)m->n_buffer_floats * sizeof(float));
    if (r->opt->momentum_buf) model_write_oihw(m, mom, r->opt->momentum_buf);
    if (adam) model_write_oihw(m, mom, adam->exp_avg), model_write_oihw(m, sq, adam->exp_avg_sq);
    device_sync(m->dev);
    /* at an epoch's end, E epochs of this run's steps: the same count unless the world size, batch size,
     * K or --drop-last changed (at_epoch_end; resume_check refuses what else could change it) */
    r->step = r->resumed_at_step = at_epoch_end(&got) ? got.epoch * r->steps_per_epoch : got.step;
    r->opt->steps = got.momentum_valid ? r->step : 0;
    if (adam) optim_set_adam_steps(r->opt, got.adam_steps); /* its bias corrections continue */
    r->epoch = r->last_epoch_done = got.epoch; /* the epochs before it are done */
    r->start_batch = got.batch_in_epoch;
    r->resume_unchecked = 1;
    if (!r->sum_across) resume_check(r); /* stages 1, 2: no sampler flags to wait for (run_sampler) */
    free(p), free(mom), free(buf), free(sq);
}
