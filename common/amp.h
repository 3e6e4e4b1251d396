/* amp.h — automatic mixed precision in the training loop: the --amp flags and the GradScaler.
 *
 * Autocast itself lives in the model (model_create_mixed: which op runs in which type). What the
 * loop adds is PyTorch's torch.amp.GradScaler, with its exact semantics:
 *
 *     scaler.scale(loss).backward()  scaler_scale_loss: the loss gradient is multiplied by the
 *                                    scale S (init 2^16), so small gradients survive fp16;
 *     scaler.unscale_(optimizer)     scaler_unscale: the unscale_ below, done early for code that
 *                                    reads the gradients first (clip_grad_norm_: clip.h);
 *     scaler.step(optimizer)         scaler_step: unscale_ (grads ·= 1/S, the reciprocal taken in
 *                                    double and rounded to float, as torch does) while checking for
 *                                    inf/NaN; a non-finite gradient anywhere skips the step;
 *     scaler.update()                scaler_update: skipped → S ·= backoff (0.5), growth counter
 *                                    reset; else counter + 1, and after growth_interval (2000)
 *                                    finite steps in a row S ·= growth (2), unless that is inf.
 *
 * No host synchronisation: S, 1/S, the growth counter and found_inf live in device memory; the
 * optimizer's kernel (SGD's, or Adam's through adam_step_unless) reads found_inf and writes nothing
 * when it is set (as PyTorch's fused optimizers
 * take found_inf), and update() is a one-thread kernel. The host never learns whether a step was
 * skipped until it asks (scaler_get_scale, scaler_skipped — at the report, not in the loop).
 * Under DDP the check runs on the gradients after the all-reduce, so every rank sees the same
 * values, finds the same inf and takes the same decision with no extra communication. With
 * gradient accumulation the scaler acts once per optimizer step (scale every micro-batch's loss,
 * step and update once). bf16 (and --amp off) run without a scaler: GradScaler(enabled=False)
 * makes every call a plain pass-through, as in PyTorch. A checkpoint carries the scaler's state
 * (scale, growth counter and the settings they mean something under: torch's scaler.state_dict()),
 * and a resumed fp16 run continues from it, as scaler.load_state_dict() does. */
#ifndef AMP_H
#define AMP_H

#include <stdint.h>

#include "cli.h"
#include "device.h"
#include "optim.h"
#include "precision.h"
#include "report.h"

typedef struct AmpConfig {
    const char *amp;            /* fp16 | bf16 | off */
    double init_scale, growth_factor, backoff_factor;
    int growth_interval;
    int no_grad_scaler;         /* fp16 without a scaler: the experiment of what it prevents */
    int grad_stats;             /* count zero / non-finite gradient elements every step */
    int channels_last;          /* 16-bit activations in NHWC on the GPU (torch.channels_last) */
    const char *grad_comm;      /* fp32 | fp16 | bf16: the all-reduce's type (validated here) */
    const char *show_scaler;    /* "" or a pattern of F / I steps: print the scales and exit */
    int64_t test_inf_step;      /* TEST ONLY (--test-inf-step): 0 = off; k = rank 0's loss gradient
                                 * is made +inf at optimizer step k (counted from 1 over the whole
                                 * run, a resumed checkpoint's steps included) */
} AmpConfig;
/* --grad-comm as a precision for ddp_register_comm_hook (PREC_FP32: no hook); bf16 needs sm80+. */
Precision amp_grad_comm(const AmpConfig *a, const Device *d);

/* PyTorch's GradScaler defaults; amp = default_amp ("fp16" in stage 5). */
void amp_defaults(AmpConfig *a, const char *default_amp);
/* The AMP option rows followed by `more` (may be NULL): pass the result as config_options' extra
 * rows. Returns a malloc'd, terminated table. */
Option *amp_options(AmpConfig *a, const Option *more);
/* Cross-flag rules: dies with one user error naming the fix. Call it right after parsing, so a bad
 * combination fails once, before any worker starts. */
void amp_check(const AmpConfig *a);
/* The autocast type for a run on d (checks again, and that bf16 has a GPU of compute capability
 * 8.0 or newer). */
Precision amp_precision(const AmpConfig *a, const Device *d);
/* 1 when d can run bf16: the CPU backend, or a GPU of compute capability 8.0+ (cuDNN's and
 * cuBLAS's bf16 kernels need Ampere); *major gets the compute capability's major (0 on the CPU). */
int amp_bf16_supported(const Device *d, int *major);
/* --show-scaler: drive a GradScaler with the pattern's finite / inf steps, print the scale after
 * each update() on one line (and a note if an F step came where 1/scale overflows: from there the
 * scales are not torch's); returns the exit status. No device needed. */
int amp_show_scaler(const AmpConfig *a);

typedef struct GradScaler {
    Device *dev;
    int enabled;               /* fp16 with a scaler */
    double growth_factor, backoff_factor;
    int growth_interval;
    /* device memory, one block: scale, inv_scale, found_inf (floats), growth_tracker (int32),
     * skipped (int64) */
    void *state;
    float *scale, *inv_scale, *found_inf;
    int32_t *growth_tracker;
    int64_t *skipped;
    int64_t steps;             /* optimizer steps in this run (scaler_update calls) */
    int64_t first_step;        /* optimizer steps done before it (a resumed checkpoint's) */
    int evaluating;            /* --evaluate: nothing is trained, the checkpoint's scale is not taken */
    int unscaled;              /* scaler_unscale ran for this optimizer step: scaler_step does not unscale */
    /* per-step gradient statistics (AmpConfig.grad_stats): device int64 pairs (zero, non-finite) */
    int64_t *stats;
    int64_t stats_cap;
    int64_t test_inf_step;
    int rank;
    Precision prec;            /* autocast's low type (the divergence record names it) */
    Report *report;            /* the run's, for that record (NULL: no run) */
} GradScaler;

struct Run;
/* run (may be NULL: one rank, one step, nothing resumed) gives the rank (the test-only inf goes into
 * rank 0's gradient only, so the other ranks see it only through the all-reduce), the bound of the
 * per-step statistics (its total steps) and the checkpoint it resumed: an enabled scaler takes that
 * checkpoint's scale and growth counter (scaler.load_state_dict) — refused when it was saved under
 * other --growth-factor / --backoff-factor / --growth-interval — and registers itself so that the
 * run's checkpoints carry its state. A checkpoint without a state starts at --init-scale (said). */
void scaler_init(GradScaler *s, Device *d, const AmpConfig *a, Precision p, struct Run *run);
void scaler_destroy(GradScaler *s);
/* scaler.scale(loss).backward(): dloss (count fp32 values, the loss gradient) *= S. */
void scaler_scale_loss(GradScaler *s, float *dloss, int64_t count);
/* scaler.unscale_(optimizer): grads ·= 1/S while checking for inf/NaN, now instead of inside
 * scaler_step — for whatever reads or changes the gradients before the step: clip_grad_norm_ must see
 * the true gradients, not S times them. --grad-stats counts them here too, before they are clipped.
 * Once per optimizer step. Disabled: no unscaling (the counting still happens). */
void scaler_unscale(GradScaler *s, float *grads, int64_t count);
/* scaler.step(optimizer): unscale and check grads (count fp32 values) unless scaler_unscale already
 * did, then the optimizer step unless a gradient was inf/NaN. Disabled: optimizer step as usual. */
void scaler_step(GradScaler *s, Optimizer *o, float *params, float *grads, int64_t count,
                 double lr);
/* scaler.update(): the new scale on the device. */
void scaler_update(GradScaler *s);

/* These synchronise (for reports, tests and --show-scaler, not for the step). */
float scaler_get_scale(GradScaler *s);  /* 1 when disabled, like get_scale() */
int64_t scaler_skipped(GradScaler *s);  /* optimizer steps skipped so far */
/* Zero and non-finite gradient elements counted at optimizer step `step` (0-based); 0 if the
 * statistics are off or the step is out of range. */
void scaler_grad_counts(GradScaler *s, int64_t step, int64_t *zero, int64_t *nonfinite);
/* One console line (precision, scale, skipped steps) and a {"type":"amp",...} JSON line with the
 * dtype configuration, the final scale, skipped steps and the per-step gradient counts.
 * sum_across (stage 5's Run.sum_across, or NULL for one process) sums values over the ranks: the
 * report says whether every rank ended with the same scale and skipped the same number of steps.
 * Every rank calls it (a collective); only the reporting rank prints. */
void scaler_report(GradScaler *s, const AmpConfig *a, Precision p, Report *r,
                   void (*sum_across)(void *ctx, double *v, int n), void *sum_ctx);

#endif
