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
 * The price: two small collectives per batch-norm layer per step (ResNet-18: 40), each on the
 * critical path. The forward waits for its gather, and so does backward, which runs it on the same
 * stream as the gradient buckets (like PyTorch, whose process group has one NCCL stream): a
 * gather queues behind the bucket all-reduces issued before it. Each exchange is a host call between
 * two kernels, so CUDA graphs are off (PyTorch's eager mode has none either). Evaluation uses the running statistics,
 * with no collective. One rank has no one to synchronise with: like PyTorch, its batch norm stays
 * a plain one. */
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
