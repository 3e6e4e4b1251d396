/* checkpoint.h — saving and resuming training state, atomically and verifiably.
 *
 * File layout (little-endian): a fixed header (magic "DPDDPCKP", format version, header size, the
 * model description, counters, seed), then the parameter blob, the buffer blob (batch-norm running
 * statistics), the optimizer's state (SGD's momentum; Adam's exp_avg, then exp_avg_sq), and a 64-bit
 * FNV-1a checksum of everything before it.
 * A save writes "<path>.tmp", fsyncs it, renames it over <path> and fsyncs the directory, so a crash
 * never leaves a half-written checkpoint under the real name and an older checkpoint is never lost.
 * A load refuses — with an error naming the file and the problem — a missing file, a wrong magic or
 * version, a truncated file, a checksum mismatch, counters no save can produce (negative or huge
 * epoch / step / position: the checksum is no defence against edits), and a model that differs from
 * the one being trained (architecture, norm, parameter count, shape fingerprint). Older files are
 * still read, with `version` saying what they lack: version 1 records none of the position's meaning,
 * version 2 all but the sampler's shuffle and drop_last, version 3 all but the data source, version 4
 * all but the GradScaler's state and the optimizer's kind (it is SGD's), version 5 all but the
 * learning-rate schedule, version 6 all but its warm-up, version 7 all but the optimizer's
 * hyperparameters (momentum, weight decay, gradient clipping), version 8 all but the training set's
 * signature (a resume then cannot tell another --data of the same size from the one it trained on). */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "hash.h" /* fnv1a64: the checksum (and, for callers of this header, the model fingerprint) */

typedef struct CheckpointMeta {
    char arch[32];          /* "resnet18" | "tiny" */
    char norm[8];           /* "bn" | "none" */
    int64_t n_params;       /* floats in the parameter (and gradient, momentum) blob */
    int64_t n_buffers;      /* floats in the buffer blob */
    uint64_t shape_hash;    /* fingerprint of every parameter's name and shape */
    /* where training stands */
    int64_t step;           /* optimizer steps done */
    int64_t epoch;          /* epoch to continue in */
    int64_t batch_in_epoch; /* batches of that epoch already done (0 at an epoch boundary) */
    int64_t seed;
    int64_t momentum_valid; /* 1 once the optimizer has taken a step (its buffers exist) */
    int64_t world_size;     /* ranks (stage 2: GPUs) sharing each step's samples */
    /* what the position means (format version 2): one step reads world_size × batch_size samples of
     * a permutation of train_size samples seeded by seed + epoch, and an optimizer step is
     * accum_steps such batches; a run continues a checkpoint only when all of them agree, but for
     * world size, batch size and accum_steps at an epoch's end (resume.c's at_epoch_end), and for
     * stages 1–2's other split of the same world_size × batch_size samples (resume.c's same_samples) */
    int64_t batch_size;     /* per rank (stage 2: per GPU) */
    int64_t train_size;     /* samples in the training set (0: unknown) */
    int64_t accum_steps;    /* micro-batches per optimizer step (1 without accumulation) */
    /* the sampler (format version 3): the permutation, or 0..N−1 (--no-shuffle); every rank's shard
     * padded to the same length, or the tail dropped (--drop-last) */
    int64_t shuffle;        /* 1 | 0 */
    int64_t drop_last;      /* 0 | 1 */
    /* the data (format version 4): which dataset the permutation indexes — not its path, which may
     * move; the seed (synthetic) and train_size say the rest */
    int64_t data_source;    /* CKPT_DATA_* (0: unknown — older versions, or a writer that did not say) */
    /* the GradScaler (format version 5): what torch's scaler.state_dict() holds, so that an fp16 run
     * resumes with the scale it had reached rather than init_scale again. All 0: saved without a
     * scaler (stages 1–4, bf16, --amp off, --no-grad-scaler, or an older version): checkpoint_has_scaler */
    double scaler_scale;            /* the loss scale (a float32 value, as torch keeps it; may be 0) */
    int64_t scaler_growth_tracker;  /* finite steps in a row since the last growth or backoff */
    double scaler_growth_factor, scaler_backoff_factor;
    int64_t scaler_growth_interval;
    /* the optimizer (format version 5; SGD before): SGD's state is its momentum buffer, Adam's the two
     * moment buffers (exp_avg in momentum's place, exp_avg_sq after it) and its step count */
    int64_t optimizer;              /* CKPT_OPT_SGD | CKPT_OPT_ADAM */
    int64_t adam_steps;             /* the steps Adam took (its bias corrections' t; 0 for SGD) */
    /* the learning-rate schedule (format version 6): what the scheduler's state_dict holds, so that a
     * resume under another --schedule, --lr or --epochs can say where the learning rate jumps.
     * schedule 0: unknown (an older version) */
    int64_t schedule;               /* CKPT_SCHED_CONST | CKPT_SCHED_COSINE */
    int64_t schedule_steps;         /* its length in optimizer steps (cosine's T_max) */
    double lr;                      /* the base learning rate */
    /* its linear warm-up (format version 7; none before): SequentialLR's LinearLR */
    int64_t warmup_steps;           /* 0: none */
    double warmup_start_factor;     /* LinearLR's start_factor (0 when there is no warm-up) */
    /* the optimizer's hyperparameters (format version 8; unknown before): what optimizer.state_dict()'s
     * param_groups hold besides lr, and clip_grad_norm_'s max_norm, so that a resume under other
     * values can say so */
    double momentum;                /* --momentum (SGD's; 0 for Adam, which has none) */
    double weight_decay;            /* --weight-decay */
    double clip_grad_norm;          /* --clip-grad-norm (0: no clipping) */
    /* the training set itself (format version 9; unknown before): a hash of its bytes, so that a resume
     * on another set of the same source and size — another CIFAR-10-format directory, or a copy that
     * differs — is refused rather than continued on other samples (data_signature's training half) */
    uint64_t data_signature;
    uint32_t version;       /* set by checkpoint_load: the file's format version (1 to 9) */
    int64_t head_params;    /* in an expectation only, never saved: the floats --unused-param's extra
                             * head has in this model, so a count off by exactly that names the flag */
    uint64_t head_hash;     /* in an expectation only (--evaluate): this model's fingerprint with that head
                             * appended; a file that has it is taken, head and all — the caller's parameter
                             * arrays then hold n_params + head_params floats, the head last. 0: never */
    int evaluating;         /* in an expectation only: the errors say "evaluate it", not "resume it" */
    uint64_t checksum;      /* read back: the file's checksum, verified (the ranks of a job compare them) */
} CheckpointMeta;

enum { CKPT_DATA_UNKNOWN = 0, CKPT_DATA_SYNTHETIC = 1, CKPT_DATA_CIFAR10 = 2 };
enum { CKPT_OPT_SGD = 0, CKPT_OPT_ADAM = 1, CKPT_OPT_ANY = -1 /* an expectation only: --evaluate reads the model
                                                                 * whatever optimizer trained it */ };
enum { CKPT_SCHED_UNKNOWN = 0, CKPT_SCHED_CONST = 1, CKPT_SCHED_COSINE = 2 };

/* Write atomically. params/momentum have n_params floats, buffers n_buffers floats (host memory);
 * exp_avg_sq (n_params floats) is given exactly when meta->optimizer is Adam (momentum is then its
 * exp_avg), NULL for SGD. Returns the file's checksum (its last 8 bytes: checkpoint_file_checksum). */
uint64_t checkpoint_save(const char *path, const CheckpointMeta *meta, const float *params,
                     const float *buffers, const float *momentum, const float *exp_avg_sq);

/* fsync the directory holding path, so that a rename into it is durable (checkpoint_save's, and the
 * synthetic set's export, data.c). A file system that cannot fsync a directory is let be: the data
 * itself is synced already. */
void fsync_dir_of(const char *path);

/* Read and verify `path` against `expect` (arch, norm, n_params, n_buffers, shape_hash and the
 * optimizer must match, unless expect->optimizer is CKPT_OPT_ANY; its counters are ignored). On
 * success fills *meta with the file's meta and the host arrays (sized as in expect; exp_avg_sq only
 * for Adam, may be NULL for SGD; given whenever the optimizer is CKPT_OPT_ANY). Any problem is a user
 * error (exit 2) that names the file and the fix. */
void checkpoint_load(const char *path, const CheckpointMeta *expect, CheckpointMeta *meta,
                     float *params, float *buffers, float *momentum, float *exp_avg_sq);

/* The start of a checkpoint, as checkpoint_load checks it first: the magic, a whole first header, a
 * version this trainer reads and its header size — so that --resume with a file that is no checkpoint
 * (another file, an empty one) is refused with the other flag checks (cli.c), before the run header
 * and the model. The rest (sizes, checksum, the model) is checkpoint_load's. A problem is a user error
 * (exit 2) naming the file and the fix, in checkpoint_load's words. */
void checkpoint_check_start(const char *path);

/* The model a checkpoint was saved for (its header's arch and norm), so that --evaluate builds that
 * model without being told. 0 when the file is no readable checkpoint (checkpoint_load then says
 * what is wrong with it); arch and norm get NUL-terminated strings of at most 31 and 7 bytes. */
int checkpoint_peek_model(const char *path, char arch[32], char norm[8]);

/* "DIR/epoch003.ckpt" (end of an epoch) or "DIR/step00001234.ckpt" (inside one) for a save directory
 * (creates DIR if needed; a DIR that cannot be created is a user error). Returns a malloc'd string. */
char *checkpoint_path(const char *dir, int64_t epoch, int64_t step, int end_of_epoch);

/* Check before training that checkpoints can be written into dir: create it if needed (mkdir -p),
 * then open, write, fsync, close, rename and remove a probe file — a save's calls; and that none of
 * the names this run will write — the end-of-epoch ones (epochs first_epoch+1 … last_epoch), the
 * one where --steps stop_step stops (if > 0), and their .tmp — is already something other than a
 * file (a directory there would fail the save after an epoch of training). A run resumed from a
 * checkpoint (resumed_from; NULL for a fresh run) must find no file at those names either: it would
 * write over its run's later checkpoints — nor a step checkpoint of a step it will pass (first_step,
 * last_step], since a stop on a signal saves at a step of its own (stop.h). A failure is a user
 * error naming the call or the path, and the fix. */
void checkpoint_probe(const char *dir, int64_t first_epoch, int64_t last_epoch, int64_t stop_step,
                      const char *resumed_from, int64_t first_step, int64_t last_step);

/* One run at a time saves into a directory: two runs writing the same epochNNN.ckpt names would
 * overwrite each other's checkpoints, and the check of what a --save directory holds (cli.c) sees only
 * what is there when a run starts. The process that saves takes an exclusive lock on DIR/.lock — an
 * open-file-description lock (fcntl F_OFD_SETLK), so that others can test it without taking it — and
 * holds it until it ends; the kernel drops it however the process ends, so a crashed run never blocks
 * the next. The file stays (taking a lock on a file another run may be unlinking is a race), holding
 * the last holder's name, pid and host for the message of a run that finds it taken.
 * checkpoint_lock creates dir if needed and takes the lock (again for the same dir: nothing); held by
 * another process, or impossible to take, it is a user error that names the holder and the fix.
 * checkpoint_lock_check only refuses as checkpoint_lock would when another process holds it: it takes
 * nothing and creates nothing. Neither ever counts this process's own lock as another run's. */
void checkpoint_lock(const char *dir);
void checkpoint_lock_check(const char *dir);

/* A checkpoint's header alone (its meta), without the arrays or their checksum: 1 when path is a
 * regular file with a readable header of a version this trainer knows, 0 otherwise (checkpoint_load
 * says what is wrong with it). */
int checkpoint_peek_meta(const char *path, CheckpointMeta *m);

/* The checksum a checkpoint file ends with (what checkpoint_save returned for it; unverified): 1 and
 * *sum when path is a regular file of at least a header and a checksum that starts with the magic, 0
 * otherwise. Two files with one checksum hold one checkpoint, wherever they are (a report's record
 * names a file by it too: report.c). Never blocks. */
int checkpoint_file_checksum(const char *path, uint64_t *sum);

/* 1 if path is a regular file that starts with a checkpoint's magic (whatever its version or state):
 * what --report / --trace must never truncate. Never blocks (a FIFO is not one). */
int checkpoint_is_one(const char *path);

/* 1 if `name` (a file name, no directory) is one a save in its directory writes: epochNNN.ckpt,
 * stepNNNNNNNN.ckpt, or either with the .tmp a save writes first — names no other output may take. */
int checkpoint_name_is_one(const char *name);
/* The position a checkpoint's name says: epochNNN.ckpt → *epoch = NNN, *step = -1; stepNNNNNNNN.ckpt
 * → *epoch = -1, *step = N. 0 for any other name (a .tmp included). */
int checkpoint_name_position(const char *name, int64_t *epoch, int64_t *step);

/* The checkpoints in dir — regular files named as checkpoint_path names them (epochNNN.ckpt,
 * stepNNNNNNNN.ckpt) — counted; *newest (when not NULL) gets the most recently modified one's path
 * (malloc'd; NULL when there is none). A missing or unreadable dir holds none. */
int checkpoint_list(const char *dir, char **newest);
/* The partial checkpoints in dir — NAME.ckpt.tmp, left by a write that was interrupted (a second
 * Ctrl-C, a killed process) — counted; *first (when not NULL) gets one's name (malloc'd, or NULL). */
int checkpoint_list_partial(const char *dir, char **first);

/* 1 if m holds a GradScaler state (its growth interval is set; the scale itself may have reached 0). */
int checkpoint_has_scaler(const CheckpointMeta *m);

/* s with every byte that is not printable ASCII written as \xNN (for error messages that quote a
 * checkpoint's header strings, which may be anything). Returns out. */
const char *checkpoint_escape(const char *s, size_t len, char *out, size_t cap);


#endif
