/* trainer_internal.h — what the run's four files share, and the stage mains do not need.
 *
 * What trainer.h declares is spread over four files, one job each:
 *   input.c    the run's input: the datasets from the flags, the loader's settings, each batch moved to
 *              the device (InputPipe);
 *   trainer.c  step statistics, evaluation, and the run itself: its report, timing, the stop at a
 *              divergence or a signal;
 *   save.c     the checkpoints it writes (--save) and which it keeps (--keep-last);
 *   resume.c   resuming from a --resume checkpoint: what is checked against the run, what may change
 *              with a note, and the gate by which a job's rank 0 checks before the other ranks. */
#ifndef TRAINER_INTERNAL_H
#define TRAINER_INTERNAL_H

#include <stdint.h>

#include "trainer.h"

/* ---- input.c: what data_open opened, for what a checkpoint's data position means (save.c
 * writes it, resume.c checks it) and what --evaluate reports ---- */
extern int64_t train_size_opened;
extern int data_source_opened; /* CKPT_DATA_* */
extern uint64_t train_signature_opened; /* the training set's half of data_signature: its source, size and bytes */
extern int64_t test_size_opened;
extern char test_source_opened[sizeof ((Dataset *)0)->source];

/* ---- resume.c ---- */
/* A job of processes (stages 3–5, more than one rank): the ranks sum, and rank 0 speaks for them. */
static inline int gated(const Run *r) { return r->sum_across && r->world_size > 1; }
/* Around run_begin's checks (second = 0) and run_sampler's (second = 1): rank 0 checks, then sums;
 * the others sum, then check. gate_flags is set while rank 0 checks the flags, before the file. */
extern int gate_flags;
void gate_before_checks(Run *r, int second);
void gate_after_checks(Run *r, int second);
/* Load --resume's checkpoint into the run and check it (run_begin; a job's sampler at run_sampler). */
void run_resume(Run *r);

/* ---- save.c ---- */
/* Write the run's state as a checkpoint (rank 0 only; the others return): at an epoch's end
 * (end_of_epoch = 1, epochNNN.ckpt) or inside one (stepNNN.ckpt, batch_in_epoch batches into it). */
void run_save(Run *r, int64_t epoch, int64_t batch_in_epoch, int end_of_epoch);
/* With --keep-last, a run resumed into its own --save directory counts that line's checkpoints up to
 * where it resumed as its own (run_begin, once the checkpoint is loaded). */
void run_keep_resumed(const Run *r);

#endif
