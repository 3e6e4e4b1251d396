/* comm.h — a communicator: the collectives DDP needs, behind one interface with two implementations.
 *
 *   NCCL       one communicator per job (its unique id travels from rank 0 through the store), its
 *              own high-priority CUDA stream, one GPU per rank. A watchdog thread polls
 *              ncclCommGetAsyncError and the age of the oldest unfinished operation; an error or
 *              a timeout aborts the communicator and exits, never a silent hang.
 *   host ring  a ring all-reduce (reduce-scatter, then all-gather) between the ranks' processes over
 *              TCP sockets, run by a communication thread. CPU workers use it directly; GPU workers
 *              with --comm host copy each buffer device → host → ring → device, as gloo does for
 *              CUDA tensors. It lets several workers share one GPU, which NCCL refuses.
 *
 * Operations are asynchronous and run in the order issued. Each starts only after everything already
 * issued on the device's compute stream (an event; the CPU backend computes synchronously, so there
 * it may start at once) and works in place. comm_wait makes the compute stream — not the host —
 * wait for all of them on NCCL; the host ring blocks the caller until they are done, as gloo's
 * work.wait() does. Every rank must issue the same operations in the same order.
 *
 * The code: comm.c (the interface, dispatching through a table of operations per backend),
 * comm_nccl.c and comm_host.c (the backends), comm_internal.h (what they share). */
#ifndef COMM_H
#define COMM_H

#include <stdint.h>

#include "device.h"
#include "store.h"

typedef enum { COMM_NCCL = 0, COMM_HOST = 1 } CommKind;

typedef struct Comm Comm;

/* Collective: every rank of the store's job calls it. timeout_s bounds every operation (and, on
 * NCCL, communicator creation): past it the job fails with an error naming what hung. */
Comm *comm_create(CommKind kind, Store *store, Device *dev, double timeout_s);
void comm_destroy(Comm *c);
const char *comm_describe(const Comm *c); /* "NCCL 2.28.9" / "host ring over TCP (127.0.0.1)" */
int comm_have_nccl(void);                 /* this binary was built with NCCL */
/* The backend for --comm `flag` (auto | nccl | host): auto is NCCL for GPU workers when built with
 * it, else the host ring. A combination that cannot work is a user error naming the fix: NCCL
 * without GPUs, without NCCL in the binary, or with more workers per node than `gpus`. */
CommKind comm_choose(const char *flag, int cuda, int gpus, int local_workers);

/* In-place SUM all-reduce / broadcast from root of count floats in the device's memory. They return
 * an id for comm_op_ms. */
int64_t comm_allreduce_async(Comm *c, float *buf, int64_t count);
/* The element types an all-reduce can carry: fp32, or 16-bit floats (DDP's fp16/bf16 compression
 * hooks). 16-bit buffers hold real 16-bit values (2 bytes each) on every backend; their sums are
 * rounded to the type at every addition, as NCCL's ncclHalf / ncclBfloat16 sums are. */
typedef enum { COMM_F32 = 0, COMM_F16 = 1, COMM_BF16 = 2 } CommDtype;
/* The mean over ranks, the way DDP averages gradients: each rank's values multiplied by fp32's
 * 1/world and rounded once to the element type, then summed — PyTorch's arithmetic, bit for bit per
 * contribution: DDP's reducer multiplies fp32 gradients by 1/world as it copies them into the bucket
 * (gradient_as_bucket_view=False, the default — and with True too whenever .grad is not yet the
 * bucket's view, as after zero_grad()'s default set_to_none; on a view it calls div_(world), which on
 * a CUDA tensor is the same multiply by the fp32 reciprocal — only a CPU tensor under gloo is truly
 * divided, which can differ by an ulp when world is not a power of two: docs/semantics.md), and the
 * compression hooks' div_(world) on a CUDA fp16/bf16 tensor is a multiply by the fp32 reciprocal
 * too. NCCL: ncclAvg, whose kernel
 * multiplies as it reads (no pass of its own), wherever its factor is that one (comm_internal.h:
 * fp32, or a power-of-two world); else a multiply pass on the communication stream and a SUM. Host
 * ring: the multiply on the host copy, before the ring. */
int64_t comm_allreduce_mean_async(Comm *c, void *buf, int64_t count, CommDtype type);
int64_t comm_broadcast_async(Comm *c, float *buf, int64_t count, int root);
/* Work issued on the compute stream from now on runs after every operation issued so far. */
void comm_wait(Comm *c);
/* …after operation `id` and those issued before it only (DDP steps each bucket as soon as its own
 * all-reduce is done). */
void comm_wait_op(Comm *c, int64_t id);
/* How long operation `id` ran on the communicator, in ms (waits for it to finish): the NCCL
 * stream's events around it, or the ring thread's wall time including the host copies. */
double comm_op_ms(Comm *c, int64_t id);

/* Blocking element-wise sum of n host doubles over all ranks; every rank gets the same bits. */
void comm_sum_doubles(Comm *c, double *v, int n);
/* The same, with the signature of trainer.h's SumAcrossFn (ctx is the Comm). */
void comm_sum_across(void *ctx, double *v, int n);
/* Every rank's device work issued so far is done, and every rank has reached this point. */
void comm_barrier(Comm *c, const char *what);

#endif
