/* launch.h — one process per GPU: the launcher (our torchrun), and the worker's side of it.
 *
 * `./stage3` started by hand finds no rank variables in its environment and becomes the launcher:
 * before any CUDA call (a CUDA context does not survive fork), it forks and execs --nproc-per-node
 * copies of itself, each with torchrun's variables — RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, GROUP_RANK (node rank), MASTER_ADDR, MASTER_PORT — then waits. If any worker
 * exits non-zero or dies by a signal, it SIGTERMs the others, SIGKILLs them after a grace period,
 * and exits non-zero naming the root cause: the rank, its exit code or signal, and the step it was
 * in (workers publish their step in a shared page: worker_status.h). Its own exit code is the root's
 * (128 + the signal for one killed), or 1 when the root was a stopped worker (SIGSTOP): that one ends
 * by the launcher's SIGTERM, which is no cause of the job's. Workers also die with the
 * launcher (PR_SET_PDEATHSIG), so none is ever orphaned.
 *
 * The same binary is a worker when started by torchrun --no-python (RANK, …), srun (SLURM_PROCID,
 * SLURM_LOCALID, SLURM_NTASKS, in a step of two or more tasks: SLURM_STEP_ID) or mpirun
 * (OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE); an sbatch script or a one-task step launches here.
 * Part of torchrun's or mpirun's set without another launcher's complete one is refused, naming what
 * is missing; torchrun's names that no torchrun set (no TORCHELASTIC_RUN_ID: launcher "environment",
 * often left over in a shell) are named in every error they cause, with how to unset them.
 * Under torchrun, its agent already holds MASTER_PORT for its own store (TORCHELASTIC_USE_AGENT_STORE
 * = True), so rank 0 hosts ours on MASTER_PORT + 1.
 *
 * Test-only: STAGE3_FAIL_AT=r:s makes rank r exit with code 3 at the start of step s;
 * STAGE3_FAIL_AT=r:s:SIG (e.g. 1:4:KILL, 0:2:SEGV) makes it kill itself with that signal instead. */
#ifndef LAUNCH_H
#define LAUNCH_H

#include <stdint.h>

#include "comm.h"          /* CommKind: the backend is chosen by comm_choose */
#include "worker_status.h" /* launch_step, launch_mark_collateral */

#define LAUNCH_SAVE_S 120.0 /* after a failure: the most a worker writing a checkpoint is waited for */
#define LAUNCH_GRACE_S 5.0 /* after a failure: SIGTERM → SIGKILL (the others have nothing to save then) */
#define LAUNCH_STOP_S 30.0 /* after a Ctrl-C or SIGTERM to the launcher: the workers' time to stop at a step
                            * boundary and save (stop.h) before SIGKILL — torchrun's default wait */
#define LAUNCH_CPU_WORKERS_PER_CORE 64 /* the most CPU workers per core the launcher starts: on 2 cores,
                                       * 128 tiny-model workers took 41 s to start and take 3 steps (the
                                       * rendezvous times out at 60 s); 1000 all timed out */

typedef struct LaunchConfig {
    int nproc_per_node;      /* 0 = one per visible GPU (2 on the CPU backend) */
    int nnodes, node_rank;
    const char *master_addr; /* where rank 0 hosts the rendezvous store */
    int master_port;
    int standalone;          /* --standalone: one node, master_port = a free one, picked by the launcher */
    const char *device;      /* --device: auto | cuda | cpu */
    const char *comm;        /* --comm: auto | nccl | host */
    const char *report, *trace; /* --report, --trace (NULL or "": none): refused before any worker when
                                 * another run is writing them, not after the rendezvous */
    const char *save;        /* --save DIR (NULL or "": none): node 0's launcher, where rank 0 saves, makes
                              * it and checks that it takes files before any worker starts */
    int64_t train_size;      /* the training set's size (data_train_size; 0: not checked here) */
    int drop_last;           /* --drop-last: with train_size, a shard left empty is refused here, once —
                              * the workers' refusal came once per rank, the same line */
    double data_bytes;       /* what each worker's datasets take in host memory (data_host_bytes; 0: not
                              * checked): sizes this node's workers together cannot hold are refused here,
                              * once — each worker alone may fit, and the kernel then kills one mid-setup */
} LaunchConfig;

typedef struct Worker {
    int rank, local_rank, world_size, local_world_size, node_rank;
    char master_addr[256];
    int master_port;         /* the store's port (MASTER_PORT + 1 under torchrun's agent store) */
    const char *launcher;    /* this stage's own name ("stage3", "stage4", …: we launched it), "torchrun",
                              * "srun", "mpirun" or "environment" */
} Worker;

/* Call at the top of main, after the flags are parsed and before any CUDA call. Without rank
 * variables in the environment this process becomes the launcher and never returns (it exits
 * with the job's status). In a worker it fills *w from the environment and returns. */
void launch_or_join(int argc, char **argv, const LaunchConfig *cfg, Worker *w);

/* Resolve --device ("auto") for `gpus` visible GPUs, then --comm through comm_choose for
 * `local_workers` workers per node (exit 2 with the fix on a bad combination). *cuda = 1 for GPU
 * workers. */
void launch_resolve(const LaunchConfig *cfg, const char *launcher, int gpus, int local_workers,
                    int *cuda, CommKind *comm);
/* The GPUs this node's `local_workers` have between them, `gpus` being those this process sees: under
 * srun or mpirun one visible GPU is a task's own (CUDA_VISIBLE_DEVICES per task), so one each. Fewer
 * than local_workers: workers share GPUs (--comm host). */
int launch_node_gpus(const char *launcher, int gpus, int local_workers);
/* The GPU a worker uses: its local rank (NCCL), or local rank mod GPUs (--comm host shares). */
int launch_gpu_of(const Worker *w, int gpus);

#endif
