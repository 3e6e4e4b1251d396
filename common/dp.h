/* dp.h — torch.nn.DataParallel: scatter, replicate, parallel_apply, gather, reduce-add (stage 2).
 *
 * One process drives N logical devices (GPUs, or virtual CPU devices on the CPU backend). Each
 * training step does what DataParallel does inside `loss = F.cross_entropy(model(x), y);
 * loss.backward()` (docs/semantics.md):
 *   dp_scatter      the whole batch sits on device 0; chunks of ceil(B/N) (the last takes the rest,
 *                   so there may be fewer chunks than devices) are copied to the other devices;
 *   dp_replicate    device 0's parameters and buffers are broadcast to the other devices, in ~10 MiB
 *                   groups, every step (device 0's replica *is* the master: no copy);
 *   dp_parallel_apply  a new host thread per replica (--dp-thread-pool: persistent threads), each
 *                   running its replica's forward on its own device and stream, holding the GIL for
 *                   each op's Python and releasing it for the launch; each thread has its own
 *                   convolution plan cache (plan_cache.h), so a new thread plans every forward
 *                   convolution again;
 *   dp_gather       the logits are concatenated on device 0, where the caller computes the loss;
 *   dp_backward     the logits' gradient is scattered back and every replica's backward runs in a
 *                   persistent per-device thread without the GIL (PyTorch's autograd device threads);
 *   dp_reduce_add   every replica's gradients are summed into device 0's (the master's), ~10 MiB at a
 *                   time; the optimizer then steps on device 0 only.
 * Batch norm: each replica normalises with its own chunk's statistics; only replica 0's running
 * statistics persist (they are the master's buffers; the others are overwritten by the next
 * broadcast).
 *
 * Python is modelled, not run: the host-side interpreter time PyTorch spends in each forward op and
 * in DataParallel's own functions is charged as time spent holding the GIL (common/gil.h), with
 * constants measured by tests/torch/calibrate_dp.py. Everything else — copies, kernels, waits — is
 * real and measured. Every phase is timed (CUDA events on device 0's stream, or wall-clock on the
 * CPU backend) and reported next to the modelled Python it contains (dp_report).
 *
 * The code: dp.c (the step and its copies), dp_threads.c (the replicas' threads), dp_python.c
 * (the modelled Python and stage 2's flags), dp_report.c (phase timing and the report). */
#ifndef DP_H
#define DP_H

#include <pthread.h>
#include <stdint.h>

#include "cli.h"
#include "crew.h"
#include "device.h"
#include "gil.h"
#include "model.h"
#include "plan_cache.h"
#include "timemark.h"
#include "trainer.h"

/* The phases of a step, in order; each ends where the next begins, so they add up to the step.
 * DP_INPUT is the time between the previous step's end and this step's scatter: waiting for the
 * batch on device 0 and zero_grad. */
typedef enum {
    DP_INPUT, DP_SCATTER, DP_REPLICATE, DP_FORWARD, DP_GATHER, DP_LOSS, DP_BACKWARD, DP_REDUCE,
    DP_OPTIMIZER, DP_PHASES
} DpPhase;
extern const char *const dp_phase_name[DP_PHASES];

#define DP_MAX_DEVICES 64 /* every one gets its lanes in a --trace: TRACE_MAX_DEVICES (dp.c checks) */
#define DP_BUCKET_BYTES ((size_t)10 << 20) /* broadcast_coalesced / reduce_add_coalesced buffer_size */

typedef struct DpConfig {
    int p2p;           /* 1: direct device-to-device copies; 0: staged through host memory (--p2p off) */
    int thread_pool;   /* 1: persistent forward threads instead of new ones every step */
    double switch_ms;  /* the GIL's switch interval (sys.getswitchinterval) */
    double op_us;      /* interpreter time per forward op, in each replica's thread */
    /* the Python of DataParallel itself (main thread, and each new thread's start-up) */
    double call_us;    /* per call of scatter, replicate, parallel_apply, gather, and their backward */
    double module_us;  /* replicate: per module, per replica (shallow copy, re-binding children) */
    double param_us;   /* replicate and reduce-add: per tensor, per replica */
    double thread_us;  /* parallel_apply: per thread (Python thread start-up, _worker's contexts) */
    double host_us;    /* < 0: the sum of the above; ≥ 0: scale them so one step's total is this */
    /* planning a forward convolution in a thread whose plan cache lacks it (plan_cache.h): the
     * calibrated cost of one plan, µs, with cudnn.benchmark off / on (not Python: no GIL held) */
    double plan_us, plan_bench_us;
    /* flags that set the fields above (applied by dp_config_resolve) */
    int gpus;          /* --gpus: logical devices; 0 = auto */
    int no_python;     /* --no-python: op_us = host_us = 0 */
    const char *p2p_flag; /* --p2p on|off */
    int evaluating;    /* --evaluate: one device, GPU0's replica, tests the checkpoint (set by dp_config_resolve) */
} DpConfig;

/* The calibrated defaults (see stages/stage2_data_parallel/README.md for where they come from). */
DpConfig dp_config_defaults(void);
/* Stage 2's own flags (--gpus, --gil-*, --no-python, --dp-thread-pool, --dp-plan-us,
 * --dp-plan-bench-us, --p2p) as option rows writing into *c: config_options(&cfg, dp_options(&c)). */
const Option *dp_options(DpConfig *c);
/* After cli_parse: apply --no-python and --p2p, pick the device count when --gpus is auto (every
 * visible GPU, or 2 virtual devices on the CPU backend; one with --evaluate, which tests the checkpoint
 * on GPU0's replica as stage 2 does after every epoch), and set what DataParallel runs as PyTorch's
 * replicas do: NCHW (--layout nhwc is refused) and op by op, without CUDA graphs. */
void dp_config_resolve(DpConfig *c, DeviceKind kind);
/* Why no Python is modelled ("--no-python", "every --gil-* cost is 0", …), for messages. */
const char *dp_no_python_why(const DpConfig *c);

typedef struct DataParallel DataParallel;

/* A CUDA event for ordering work across devices; an unused placeholder without CUDA. */
#ifdef USE_CUDA
typedef cudaEvent_t DpEvent;
#else
typedef void *DpEvent;
#endif

typedef struct Replica {
    DataParallel *dp;
    int index;
    Device *dev;
    Model *model;
    float *x;           /* this step's input chunk (device 0: a view of the whole batch) */
    float *x_buf;       /* devices ≥ 1: where the scatter puts the chunk */
    int n, offset;      /* chunk size and offset in the batch, this step */
    GilThread gil;      /* its forward threads' GIL statistics (new every step, or --dp-thread-pool's) */
    double fwd_wait_s;  /* GIL wait during this step's forward */
    double fwd_py_s;    /* interpreter time charged during this step's forward */
    /* its forward thread's plan cache, this step: misses, our cuDNN calls' time, the charge on top */
    int64_t plan_misses;
    double plan_own_s, plan_charged_s;
    int64_t plan_misses_total; /* over the run */
    pthread_t fwd_thread, pool_thread, bwd_thread;
    DpEvent fwd_done, bwd_done;             /* on its stream: forward / backward issued so far */
    DpEvent staged_d2h[2], staged_h2d[2];   /* --p2p off: staging-buffer hand-offs */
} Replica;

struct DataParallel {
    int n;              /* logical devices */
    int k;              /* replicas taking part this step (= number of chunks) */
    int batch;          /* this step's global batch */
    int max_batch;      /* global batch the buffers are sized for */
    int64_t sample_floats; /* one input sample (the model's input activation: c × h × w) */
    Device **devs;
    Replica rep[DP_MAX_DEVICES];
    Model *master;      /* replica 0's model: saved, evaluated, stepped by the optimizer */
    DpConfig cfg;
    int python;         /* any modelled Python at all (else the GIL is never taken) */
    double host_scale;  /* from --gil-host-us: multiplies DataParallel's own Python costs */
    int n_modules, n_tensors; /* what replicate copies, counted as PyTorch's twin model has them */
    int direct;         /* every pair of devices copies directly (peer access or the same GPU) */
    Gil gil;
    GilThread main;     /* the main thread's GIL statistics */
    PlanCache main_cache; /* the main thread's plan cache (it runs the forward when k == 1) */
    float *batch0[2];   /* CPU backend: device 0's own copy of the whole batch (two slots, as the
                           GPU input pipe has), so device 0's memory account holds it too */
    int batch0_slot;
    /* on device 0 */
    float *logits, *dlogits;     /* the gathered [batch][classes] and its gradient (the loss's) */
    float *landing;              /* one reduce bucket arriving from another device */
    size_t landing_floats;
    /* --p2p off: two host staging buffers (pinned on CUDA), used in turn */
    void *staging[2];
    int stage_next;
    Replica *stage_last[2];      /* whose staged_h2d[b] last read buffer b (NULL: none) */
    /* worker threads */
    Crew bwd_crew, pool_crew;
    pthread_mutex_t start_mu;    /* Thread.start() waits until the new thread has bootstrapped */
    pthread_cond_t start_cv;
    int started;
    /* phase timing, this epoch: mark 0 = the step's start, mark p ≥ 1 = the end of phase p */
    int cap, step;
    int64_t steps_seen;          /* steps of earlier epochs (for the warm-up) */
    double (*py_ms)[DP_PHASES];  /* modelled Python charged in each phase (ms), per step */
    double *wait_ms;             /* mean GIL wait of the replica threads in forward (ms), per step */
    double (*plan)[3];           /* per step, mean per replica thread: plan misses, planning ms
                                    (ours + charge), of which our cuDNN calls' ms */
    int *ks;                     /* per step, the replicas that took part (k) */
    double cur_py_s[DP_PHASES];  /* this step's, being accumulated */
    TimeMark (*at)[DP_PHASES];   /* the marks, on device 0's compute stream (or wall clock) */
    DpEvent replicated, dlogits_ready; /* device 0: parameters broadcast / logits' gradient scattered */
    /* timed steps of the whole run (after the warm-up), for the medians */
    double *ph_ms[DP_PHASES], *ph_py_ms[DP_PHASES], *step_ms, *step_wait_ms, *step_plan[3];
    int n_samples, cap_samples;
    int timed_replica_threads;   /* a timed step ran its forward on replica threads (k > 1) */
};

/* PyTorch's chunk rule: sizes of the chunks a batch of `batch` splits into over n devices
 * (chunk = ceil(batch / n), the last takes the rest). Returns the number of chunks (≤ n). */
int dp_chunks(int batch, int n, int *sizes);

/* n logical devices of `kind`, with opts' deterministic / benchmark / allow_tf32. CUDA: device i is
 * GPU i % (visible GPUs), with a one-line notice when GPUs are shared. n outside [1, 64] is a user
 * error naming --gpus. */
Device **dp_devices_create(int n, DeviceKind kind, const Device *opts);
void dp_devices_destroy(Device **devs, int n);

/* models[i] lives on devs[i] (created with max_batch ≥ the largest chunk); models[0] is the master.
 * max_batch: the global batch; steps_cap: most steps in one epoch (phase timing slots). */
void dp_init(DataParallel *dp, Device **devs, int n, Model **models, int max_batch, int steps_cap,
             const DpConfig *cfg);
void dp_destroy(DataParallel *dp);
/* Plan every replica's convolutions for the chunks a global batch of `batch` makes. */
void dp_prepare(DataParallel *dp, int batch);
/* What this DataParallel is: devices, copies, threads, and the modelled Python and its cost. */
void dp_describe(const DataParallel *dp, Report *r);

/* The step, in order (see the top of this file). x is the whole batch on device 0. Between
 * dp_gather and dp_backward the caller computes the loss (the DP_LOSS phase); after dp_reduce_add
 * it steps the optimizer on the master, then calls dp_step_end (the DP_OPTIMIZER phase). */
void dp_scatter(DataParallel *dp, const float *x, int batch);
void dp_replicate(DataParallel *dp);
void dp_parallel_apply(DataParallel *dp); /* every replica's unprepared forwards end up in the master's count */
void dp_gather(DataParallel *dp);          /* → dp->logits on device 0 */
void dp_backward(DataParallel *dp);        /* from dp->dlogits on device 0 */
void dp_reduce_add(DataParallel *dp);      /* → master->grad_flat */
/* The step is over (the optimizer has stepped): closes its phase timing. */
void dp_step_end(DataParallel *dp);

/* End of an epoch's steps: read this epoch's phase times (synchronises device 0 once). */
void dp_epoch_end(DataParallel *dp);
/* Phase breakdown (median ms per step), modelled Python per phase, GIL statistics — on the console
 * and as JSON records "phases", "gil" and "gil_thread". Call before run_finish. */
void dp_report(DataParallel *dp, Run *run);

/* Modelled Python (µs) in one step of a global batch `batch`: DataParallel's own (main thread and
 * thread start-ups) in *host_us, the forward ops' over all replicas in *ops_us; returns the sum. */
double dp_python_us(const DataParallel *dp, int batch, double *host_us, double *ops_us);

#endif
