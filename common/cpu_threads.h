/* cpu_threads.h — the CPU backend's intra-op threads: torch.set_num_threads for our convolutions,
 * batch norm and ReLU.
 *
 * What you will learn: how a CPU framework uses every core without giving up reproducibility. A
 * convolution is split into independent pieces — the images of a batch for the forward pass and the
 * input gradient, the columns of the weight gradient; batch norm by channel, ReLU by block — and a
 * small pool of persistent threads runs the pieces side by side. No output element is summed by two
 * threads, and each is summed in the same order whatever the thread count, so one thread and eight
 * give the same bits (tested).
 *
 * How many threads: --cpu-threads, else OMP_NUM_THREADS (PyTorch reads it too), else the host's
 * cores shared out among the workers on it — LOCAL_WORLD_SIZE processes (stages 3–5), or the replica
 * threads of one process (stage 2). torchrun sets OMP_NUM_THREADS=1 for every worker when it starts
 * more than one; sharing the cores out does the same job without leaving cores idle. A caller that
 * finds the pool busy (stage 2's replicas run at once) runs its piece alone, in its own thread. */
#ifndef CPU_THREADS_H
#define CPU_THREADS_H

#define CPU_THREADS_MAX 256

/* Threads for the pool from now on (1 = none: everything runs in the calling thread). */
void cpu_threads_set(int n);
int cpu_threads_get(void);
/* How many processes share this host's cores: a launched worker says LOCAL_WORLD_SIZE (launch.c). */
void cpu_threads_share(int processes);
/* No OMP_NUM_THREADS warning from this process: a worker other than its host's first, which says it
 * for them all (they share one environment: one line a host, not one a rank). */
void cpu_threads_quiet(void);
/* The automatic count for a process that runs `replicas` devices at once in threads (stage 2; 1
 * otherwise): OMP_NUM_THREADS when set to a positive integer, else the online cores divided among
 * LOCAL_WORLD_SIZE × replicas workers, at least 1. */
int cpu_threads_auto(int replicas);

/* Run fn(arg, lo, hi) over [0, count) in contiguous ranges, one per thread, each at least `grain`
 * long, and return when all are done. The calling thread runs the first range. */
typedef void (*CpuRangeFn)(void *arg, int lo, int hi);
void cpu_parallel_for(int count, int grain, CpuRangeFn fn, void *arg);

#endif
