/* syncbn.h — nn.SyncBatchNorm for a DDP job: batch norm whose training statistics span every rank's
 * batch.
 *
 * Under DDP each rank normalises with the mean and variance of its own batch of B, so R ranks train
 * like one device whose batch norm sees B samples at a time, not R·B. Usually that is fine (and it
 * is what DDP and DataParallel do by default); with small per-GPU batches the statistics get noisy,
 * and then PyTorch scripts convert the model:
 *     model = nn.SyncBatchNorm.convert_sync_batchnorm(model)     # before DDP(model)
 * After that, every training forward of a batch-norm layer gathers each rank's per-channel count,
 * mean and M2 and normalises with the statistics of all R·B samples, and every backward gathers
 * each rank's two gradient sums (ops.h, BnSync). R ranks × batch B then train like one device at
 * batch R·B, batch norm included.
 *
 * The price: two small collectives per batch-norm layer per micro-step, i.e. per forward +
 * backward (ResNet-18: 40; with --accum-steps K, 40·K an optimizer step), each on the critical
 * path. The forward waits for its gather, and so does backward, which runs it on the same stream
 * as the gradient buckets (like PyTorch, whose process group has one NCCL stream): a gather queues
 * behind the bucket all-reduces issued before it. Both are latency-bound (a few KiB each), and ours
 * move more bytes than PyTorch's: each is a SUM all-reduce of an R-slot buffer of 3 floats per
 * channel per rank, where PyTorch's forward all-gathers 2c+1 floats a rank and its backward
 * all-reduces just the 2c sums — the price of every rank merging every slot in rank order, so that
 * all ranks get the same bits on NCCL and on the host ring. Our exchange is a host call between two
 * kernels (the host ring needs one), so CUDA graphs are off; PyTorch's SyncBatchNorm can be
 * captured. Evaluation uses the running statistics, with no collective. One rank has no one to
 * synchronise with: like PyTorch, its batch norm stays a plain one. Unlike PyTorch, whose
 * SyncBatchNorm refuses CPU tensors, ours also runs on CPU workers over the host ring, so a laptop
 * can run the lesson. */
#ifndef SYNCBN_H
#define SYNCBN_H

#include "comm.h"
#include "model.h"

/* Converts m's batch norm layers to SyncBatchNorm over the job's world ranks of comm (rank is this
 * process's); a note instead when there is nothing to synchronise (one rank, or no batch norm). */
void sync_batchnorm_convert(Model *m, Comm *comm, int rank, int world);
/* The exchanges this process has made so far, and their bytes (each rank's whole buffer): DDP's
 * counts line reports them, since their waits fall inside forward + backward, not in its exposed
 * communication. */
void syncbn_counts(int64_t *calls, int64_t *bytes);

#endif
