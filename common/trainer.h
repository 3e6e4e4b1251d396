/* trainer.h — what every stage's training loop needs besides the loop itself.
 *
 * The stage mains stay short and parallel by calling these: open the datasets the flags ask for,
 * move each batch to the device (InputPipe), record each step's loss, accuracy and time without
 * synchronising (StepLog), evaluate, save and resume checkpoints, and print the report (Run).
 *
 * Timing is honest: on CUDA a step's time is the interval between events recorded on the compute
 * stream at consecutive step starts (what the GPU really spent, host stalls included, no added
 * synchronisation); on the CPU backend it is wall-clock time. The first WARMUP_STEPS steps of a run
 * (cuDNN planning, caches) are excluded from the median.
 *
 * Gradient accumulation (stages 4–5, TrainConfig.accum_steps = K > 0): a step is an OPTIMIZER step of
 * K micro-batches. --steps, the LR schedule, the step log, the timing (ms per optimizer step;
 * images/s counts K × batch × world images per step) and checkpoints all count optimizer steps; an
 * epoch has ceil(batches / K) of them, its last group possibly shorter. Checkpoints therefore
 * always sit on a group boundary, and a resume inside an epoch must use the same K (at an epoch's
 * end another K is taken, its step count re-counted: resume.c's at_epoch_end). */
#ifndef TRAINER_H
#define TRAINER_H

#include <stdint.h>

#include "checkpoint.h"
#include "cli.h"
#include "clip.h"
#include "data.h"
#include "device.h"
#include "loader.h"
#include "model.h"
#include "optim.h"
#include "report.h"
#include "timemark.h"

#define WARMUP_STEPS 5

/* Datasets per --data / --train-size / --test-size / --seed. */
void data_open(const TrainConfig *cfg, Dataset *train, Dataset *test);
/* The training set's size data_open will give, from a config_resolve'd cfg (the flags, and what it
 * found in --data's files), for stages 3–5's launcher before any worker; 0 under --evaluate, which
 * trains nothing. */
int64_t data_train_size(const TrainConfig *cfg);
/* The bytes of host memory data_open's two sets will take (images and labels), likewise: every worker
 * holds the whole of both, so the launcher can refuse sizes its workers together cannot hold. */
double data_host_bytes(const TrainConfig *cfg);
/* What data_open opened, for ranks to compare (--data is each node's own path): the source, both
 * sets' sizes and their bytes (every label; every image byte of --data's files, every 61st of synthetic
 * data) hashed; *desc says it
 * in words ("CIFAR-10 (--data), 50000 training and 10000 test images"). */
uint64_t data_signature(char *desc, size_t len);
/* Loader settings from the flags: train (augment, shuffle) or evaluation (neither). */
LoaderConfig loader_config(const TrainConfig *cfg, int batch_size, int train);

/* ---- host batch → device, double-buffered on the copy stream --------------------------------- */
typedef struct InputPipe {
    Device *dev;
    Loader *loader;
    float *x[2];
    int32_t *y[2];
    Batch *held[2]; /* loader slots still referenced by an in-flight copy or step */
    int slot;
#ifdef USE_CUDA
    cudaEvent_t copied[2], consumed[2];
#endif
} InputPipe;
void input_init(InputPipe *p, Device *dev, Loader *loader, int max_batch);
/* Next batch of the epoch, its images and labels ready on the device's compute stream (the stream
 * waits for the copy; the host does not), or NULL at the end of the epoch. */
Batch *input_next(InputPipe *p, float **x, int32_t **y);
/* Release every held batch (end of epoch, or stopping early). */
void input_drain(InputPipe *p);
void input_destroy(InputPipe *p);

/* ---- per-step statistics kept on the device ---------------------------------------------------- */
/* One entry (slot) per batch the loss ran on — per micro-batch under accumulation — and one time
 * mark per step. */
typedef struct StepLog {
    Device *dev;
    int cap, count;        /* entries recorded this epoch (≤ cap) */
    int steps, step_first; /* steps begun this epoch; the current step's first entry */
    float *loss;           /* device: each entry's loss as the loss kernel wrote it (mean / k) */
    int32_t *correct;      /* device: correct predictions of each entry */
    int *n, *k;            /* host: samples in each entry; the K its loss was divided by */
    TimeMark *at;          /* a mark at each step start (cap + 1 of them; the epoch's end is not marked, so
                            * its last step is not timed: steplog_finish) */
} StepLog;
void steplog_init(StepLog *s, Device *dev, int cap);
void steplog_destroy(StepLog *s);
/* Mark the start of a step of n samples; returns its slot (pass &loss[slot], &correct[slot] to the
 * loss, with scale 1/n). */
int steplog_begin(StepLog *s, int n);
/* Gradient accumulation: micro-batch `micro` (0 starts a new step and marks its time) of n samples,
 * whose loss is written divided by k (the idiom's loss / K: scale 1/(k·n)); returns its slot.
 * steplog_begin(s, n) is steplog_micro(s, 0, n, 1). */
int steplog_micro(StepLog *s, int micro, int n, int k);
/* The loss of the current step: the mean over every sample of its entries (synchronises: used only
 * every --log-every steps). */
double steplog_step_loss(StepLog *s);
/* End of epoch: synchronise once, return the sample-weighted mean loss and accuracy, and write the
 * step times (ms) to times[] (returns how many: every step but the epoch's last, whose end is not
 * marked — evaluation follows it). */
int steplog_finish(StepLog *s, double *mean_loss, double *accuracy, double *times);

/* ---- evaluation ------------------------------------------------------------------------------ */
/* Accuracy and mean loss of the model on a loader's epoch 0 (no augmentation), in eval mode. */
void evaluate(Model *m, InputPipe *in, StepLog *scratch, double *accuracy, double *loss);
/* The same over the given dataset indices only (DDP: this rank's shard), as sums to be added up
 * over ranks: sums[0] = Σ loss, sums[1] = correct predictions, sums[2] = samples. */
void evaluate_indices(Model *m, InputPipe *in, StepLog *scratch, const int64_t *indices, int64_t n,
                      double sums[3]);

/* ---- the run: report, timing across epochs, checkpoints --------------------------------------- */
/* Sums v[0..n−1] element-wise over every process of the job, in place (stages 3–5 all-reduce them
 * over their communicator). NULL = a single process: nothing to do. */
typedef void (*SumAcrossFn)(void *ctx, double *v, int n);

#define RUN_EXTRAS 16

typedef struct Run {
    const TrainConfig *cfg;
    const char *stage;     /* "stage1" … */
    Report report;         /* active on rank 0 only */
    Device **devs;         /* every device of this process, for peak memory */
    int n_devs;
    int world_size;        /* samples per step = world_size × batch_size */
    int rank;              /* this process's rank (0 when there is one process) */
    SumAcrossFn sum_across;
    void *sum_ctx;
    Model *model;          /* the model that is saved (stage 2: GPU0's master) */
    Optimizer *opt;
    int64_t batches_per_epoch;     /* loader batches (micro-batches under accumulation) */
    int accum;                     /* K: micro-batches per optimizer step (1 without accumulation) */
    int64_t steps_per_epoch;       /* optimizer steps: ceil(batches_per_epoch / K) */
    int64_t step, total_steps;     /* optimizer steps done / planned */
    int64_t epoch, start_batch;    /* where the loop starts (after a resume) */
    double *times;                 /* step times (ms) after warm-up, whole run */
    int n_times, cap_times, seen_steps;
    double data_wait_s, t_start, epoch_t0;
    int64_t resumed_at_step;       /* the step --resume continued from (0: a fresh run) */
    int64_t epoch_batch0;          /* the batch of the epoch at epoch_t0: the progress bar's ETA counts from it */
    double last_train_loss, last_train_acc, last_test_acc;
    int loss_read;              /* a training loss has been read back: the progress bar shows it */
    int64_t last_epoch_done;
    int64_t epoch_reported;        /* the number (1-based) of the last epoch run_epoch_end reported, whole or partial */
    int shuffle, drop_last;        /* the training sampler (run_sampler): part of a checkpoint's position */
    CheckpointMeta resumed;        /* --resume's checkpoint, checked against the run (resume_unchecked: */
    int resume_unchecked;          /* not yet — a DDP stage's sampler is known only at run_sampler) */
    struct { const char *key; double v; int integer; } extras[RUN_EXTRAS]; /* run_summary_* */
    int n_extras;
    /* Stage 5's GradScaler (scaler_init sets these): fills a checkpoint's scaler_* fields, as torch's
     * scaler.state_dict() goes into a checkpoint beside the model's. NULL: no scaler to save. */
    void (*save_scaler)(void *ctx, CheckpointMeta *meta);
    void *scaler_ctx;
    /* Called on rank 0 as a diverged run stops, before its error (no collective: the other ranks are
     * stopping too): stage 5 writes its per-step gradient counts there, the record of how it diverged. */
    void (*on_diverge)(void *ctx);
    void *diverge_ctx;
    int scaler_noted;      /* the resumed checkpoint's GradScaler state was taken, or its fate said */
    int scaler_dead_noted; /* the note that the scale fell below 1/FLT_MAX was printed */
    char *last_saved;      /* the last checkpoint this run wrote (rank 0), named when the run diverges */
    int64_t *state_counts; /* device: the divergence check's (zero, non-finite) counts, per part of the state */
    int stop_sig;          /* SIGINT or SIGTERM once every rank has agreed to stop early (stop.h), else 0 */
    int stop_ranks;        /* how many ranks had received it then */
    int job_saves;         /* some rank of the job has --save (rank 0: run_begin's gate): every rank stops cleanly */
    int evaluated;         /* --evaluate: run_evaluated has reported the test; the run trains nothing */
    GradClip clip;         /* --clip-grad-norm: the stage calls clip_grad_norm(&run.clip, grads) before its step */
} Run;

/* Print the header (device, model, data, flags), open --report, resume from --resume if given
 * (restoring parameters, buffers, momentum and the position in the data). With
 * cfg->accum_steps > 0 the run accumulates gradients: the header shows the effective batch
 * K × batch × world, and a checkpoint inside an epoch must sit on a group boundary of the same K (one
 * at an epoch's end may continue under another: the top of this file).
 * Several processes (stages 3–5): every rank calls this with its rank and a sum_across function;
 * only rank 0 prints, writes the report and saves checkpoints; training losses, correct counts and
 * sample counts are summed over ranks (so the report shows the job's mean), and the summary lists every
 * rank's peak memory (each process owns one device, n_devs == 1; the first 64 ranks one by one, the
 * largest over all of them in the epoch lines and the summary). The test accuracy and loss given
 * to run_epoch_end are already the whole job's (ddp_evaluate all-reduces them). */
void run_begin(Run *r, const TrainConfig *cfg, const char *stage, Device **devs, int n_devs,
               int world_size, int rank, SumAcrossFn sum_across, void *sum_ctx, Model *m,
               Optimizer *opt, int64_t batches_per_epoch, const char *data_desc);
/* The training sampler's settings (DistributedSampler's shuffle and drop_last), which a checkpoint
 * records with its position. Stages 1 and 2 never call it: their loaders always shuffle and never
 * drop (run_begin records that), and run_begin checks a resumed checkpoint at once. A job of
 * processes (sum_across given) has sampler flags, so its checkpoint is checked only here (ddp_init
 * calls it, before the first step): one saved under another setting is refused — its position
 * would mean other samples. */
void run_sampler(Run *r, int shuffle, int drop_last);
/* --evaluate (PyTorch examples' `if args.evaluate: validate(...); return`): run_begin has loaded only
 * --resume's model; the stage evaluates it as it would after an epoch and hands the result here, which
 * reports it (console and an "evaluate" JSON record) and ends the run — run_done is then true, so the
 * training loop never starts, and run_finish prints no training summary. */
void run_evaluated(Run *r, double test_acc, double test_loss);
/* --evaluate done, --steps reached, or a signal's stop agreed (stop.h: with --save, SIGINT or SIGTERM ends the run at a
 * step boundary, where the usual end-of-run path saves it). */
int run_done(const Run *r);
int64_t run_last_step(const Run *r); /* the optimizer step this run ends at: --steps, else the schedule's end */
double run_lr(const Run *r); /* learning rate for the next step */
double run_lr_at(const Run *r, int64_t step); /* …for optimizer step `step` (0: the run's first) */
/* After each optimizer step (slot: its last entry; batch: the loader batch it ended with): logging
 * (every --log-every steps), progress bar. */
void run_step_end(Run *r, StepLog *log, int slot, int64_t batch);
/* After each epoch — or the part of one done when --steps stops the run inside it: statistics,
 * evaluation result, report line, checkpoint (--save; mid-epoch position kept for --resume). A state
 * that holds a NaN or an infinity (parameters, batch-norm statistics, the optimizer's) has diverged:
 * the run stops there (exit 2), naming the last good checkpoint, and writes none of it. */
void run_epoch_end(Run *r, StepLog *log, double test_acc, double test_loss, double data_wait_s);
/* A field for the summary's JSON record (e.g. DDP's collective counts), before run_finish. */
void run_summary_int(Run *r, const char *key, int64_t v);
void run_summary_num(Run *r, const char *key, double v);
/* Final summary (console + JSON); closes the report. */
void run_finish(Run *r);
/* The process's exit code: 0, or 128 + the signal that stopped the run early (130 for Ctrl-C, 143
 * for SIGTERM), as a shell reports a process the signal killed — the run did not finish, and a script
 * that chains the next command with && must not go on as if it had. */
int run_exit_code(const Run *r);

#endif
