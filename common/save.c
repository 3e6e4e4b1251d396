/* save.c — the checkpoints a run writes (--save: at each epoch's end, and where the run stops inside an
 * epoch: --steps, or a Ctrl-C / SIGTERM) and which of them it keeps (--keep-last). Reading one back is
 * resume.c's job; the file format is checkpoint.c's. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adam.h"
#include "stop.h"
#include "trainer_internal.h"

/* --keep-last N: remember the checkpoints this run wrote, oldest first, and remove all but the newest
 * N (only ours: a checkpoint directory may hold other runs' files). A run resumed into its own
 * directory starts the list with that directory's checkpoints up to where it resumed (run_keep_resumed). */
static char **kept;
static int n_kept;

static void prune_checkpoints(int keep, const char *just_saved) {
    if (keep <= 0) return;
    for (int i = 0; i < n_kept; i++) /* saved again under the same name: it is the newest now */
        if (!strcmp(kept[i], just_saved)) {
            free(kept[i]);
            memmove(kept + i, kept + i + 1, (size_t)(n_kept - i - 1) * sizeof *kept);
            n_kept--;
            break;
        }
    kept = xrealloc(kept, (size_t)(n_kept + 1) * sizeof *kept);
    kept[n_kept++] = xstrdup(just_saved);
    while (n_kept > keep) {
        if (unlink(kept[0]) != 0 && errno != ENOENT)
            fprintf(stderr, "warning: --keep-last: cannot remove %s: %s\n", kept[0], errno_string());
        free(kept[0]);
        memmove(kept, kept + 1, (size_t)--n_kept * sizeof *kept);
    }
}

/* A run resumed into its --save directory continues the run that wrote it (a fresh run, or one resumed
 * from elsewhere, is refused there: config_resolve), so its checkpoints up to the resumed step are this
 * run's too: --keep-last N keeps the newest N of them all, not N more after every resume. Later ones
 * (beyond this run's last step; the others are refused by checkpoint_probe) are another branch and stay;
 * so do earlier ones written under other settings than the resumed checkpoint's (a resume that
 * changed --lr, stopped, and left its stepN beside the original line's): a file holds no parent, so
 * the settings it records are the line it belongs to. Ordered by the step each holds, not by the
 * files' times. */
typedef struct Kept { int64_t step; char *path; } Kept;
static int by_step(const void *a, const void *b) {
    const Kept *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}
static int same_line(const CheckpointMeta *a, const CheckpointMeta *b) {
    return a->seed == b->seed && a->world_size == b->world_size && a->batch_size == b->batch_size &&
           a->train_size == b->train_size && a->accum_steps == b->accum_steps && a->shuffle == b->shuffle &&
           a->drop_last == b->drop_last && a->data_source == b->data_source && a->optimizer == b->optimizer &&
           a->schedule == b->schedule && a->schedule_steps == b->schedule_steps && a->lr == b->lr &&
           a->warmup_steps == b->warmup_steps && a->warmup_start_factor == b->warmup_start_factor &&
           a->momentum == b->momentum && a->weight_decay == b->weight_decay &&
           a->clip_grad_norm == b->clip_grad_norm && a->data_signature == b->data_signature &&
           !strcmp(a->arch, b->arch) && !strcmp(a->norm, b->norm);
}
void run_keep_resumed(const Run *r) {
    const TrainConfig *c = r->cfg;
    const CheckpointMeta *from = &r->resumed;
    /* Another world size, batch size or K (a regrouped resume at an epoch's end, or stages 1–2's
     * other split of one batch) makes this run's files another line than the resumed one's; and
     * re-counted steps (at_epoch_end) are not comparable with that line's, so none of it is taken */
    if (from->version >= 2 && (from->world_size != r->world_size || from->batch_size != c->batch_size ||
                               from->accum_steps != r->accum || from->step != r->step))
        return;
    DIR *d = c->keep_last > 0 ? opendir(c->save) : NULL;
    if (!d) return;
    Kept *found = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t epoch, step;
        if (!checkpoint_name_position(e->d_name, &epoch, &step)) continue;
        char *path = epoch >= 0 ? checkpoint_path(c->save, epoch, 0, 1) : checkpoint_path(c->save, 0, step, 0);
        CheckpointMeta g; /* the step it holds, and its line: from its header (a regular file's only) */
        if (!checkpoint_peek_meta(path, &g) || g.step > r->step || !same_line(&g, &r->resumed)) {
            free(path);
            continue;
        }
        found = xrealloc(found, (size_t)(n + 1) * sizeof *found);
        found[n++] = (Kept){g.step, path};
    }
    closedir(d);
    if (n) qsort(found, (size_t)n, sizeof *found, by_step); /* none of this line: no array */
    kept = xrealloc(kept, (size_t)(n_kept + n + 1) * sizeof *kept);
    for (int i = 0; i < n; i++) kept[n_kept++] = found[i].path;
    free(found);
}

void run_save(Run *r, int64_t epoch, int64_t batch_in_epoch, int end_of_epoch) {
    const TrainConfig *c = r->cfg;
    if (r->rank != 0) return; /* replicas are identical: one copy is enough */
    Model *m = r->model;
    CheckpointMeta meta = {0};
    snprintf(meta.arch, sizeof meta.arch, "%s", m->arch);
    snprintf(meta.norm, sizeof meta.norm, "%s", m->norm_bn ? "bn" : "none");
    meta.n_params = m->n_param_floats;
    meta.n_buffers = m->n_buffer_floats;
    meta.shape_hash = m->shape_hash;
    meta.step = r->step;
    meta.epoch = epoch;
    meta.batch_in_epoch = batch_in_epoch;
    meta.seed = c->seed;
    meta.momentum_valid = r->opt->steps > 0;
    meta.world_size = r->world_size;
    meta.batch_size = c->batch_size;
    meta.train_size = train_size_opened;
    meta.accum_steps = r->accum;
    meta.shuffle = r->shuffle;
    meta.drop_last = r->drop_last;
    meta.data_source = data_source_opened;
    meta.data_signature = train_signature_opened;
    meta.schedule = !strcmp(c->schedule, "cosine") ? CKPT_SCHED_COSINE : CKPT_SCHED_CONST;
    meta.schedule_steps = r->total_steps;
    meta.lr = c->lr;
    meta.warmup_steps = c->warmup_steps;
    meta.warmup_start_factor = c->warmup_start_factor;
    if (r->save_scaler) r->save_scaler(r->scaler_ctx, &meta);
    else if (c->resume[0] && !r->scaler_noted && checkpoint_has_scaler(&r->resumed)) { /* stages 1–4 */
        r->scaler_noted = 1;
        report_printf(&r->report, "note: checkpoint '%s' holds a GradScaler state (scale %g), which %s has no use for "
                                  "(only stage 5 has a GradScaler): this run's checkpoints do not carry it\n",
                      c->resume, r->resumed.scaler_scale, r->stage);
    }
    Adam *adam = r->opt->adam;
    meta.optimizer = adam ? CKPT_OPT_ADAM : CKPT_OPT_SGD;
    meta.adam_steps = adam ? optim_adam_steps(r->opt) : 0;
    meta.momentum = r->opt->momentum; /* the optimizer's own: 0 for Adam, whatever --momentum says */
    meta.weight_decay = r->opt->weight_decay;
    meta.clip_grad_norm = r->clip.max_norm;
    size_t pb = (size_t)m->n_param_floats * sizeof(float);
    float *p = xmalloc(pb), *mom = xcalloc(1, pb), *sq = adam ? xmalloc(pb) : NULL;
    float *buf = xmalloc((size_t)(m->n_buffer_floats + 1) * sizeof(float));
    /* in PyTorch's order whatever the model's layout (model.h: "The public order") */
    model_read_oihw(m, m->param_flat, p);
    device_copy_d2h(m->dev, buf, m->buffer_flat, (size_t)m->n_buffer_floats * sizeof(float));
    if (r->opt->momentum_buf) model_read_oihw(m, r->opt->momentum_buf, mom);
    if (adam) model_read_oihw(m, adam->exp_avg, mom), model_read_oihw(m, adam->exp_avg_sq, sq);
    /* epochNNN = NNN epochs completed; stepNNN = stopped inside an epoch after NNN steps */
    char *path = checkpoint_path(c->save, epoch, r->step, end_of_epoch);
    stop_save_begin(); /* a failure elsewhere waits for this write (stop.h) */
    const uint64_t sum = checkpoint_save(path, &meta, p, buf, mom, sq);
    report_printf(&r->report, "saved checkpoint %s\n", path);
    stop_save_end();
    prune_checkpoints(c->keep_last, path);
    json_begin(&r->report, "checkpoint");
    json_str(&r->report, "path", path);
    json_int(&r->report, "step", r->step);
    char hex[17]; /* the file's own checksum: a --resume of it from another directory, or after it moved,
                   * is still known for this run's file (report.c) */
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
    json_str(&r->report, "checksum", hex);
    json_end(&r->report);
    free(r->last_saved);
    r->last_saved = path;
    free(p), free(mom), free(buf), free(sq);
}
