/* loader.h — the input pipeline: epoch order, augmentation, worker threads, prefetch queue.
 *
 * Each epoch's order is PyTorch's CPU randperm seeded with seed + epoch (rng.h) — what stage 3's
 * DistributedSampler gives with one rank — or, when `indices` is given, exactly that list (stage 3
 * passes each rank its shard). Batches are consecutive slices of the order (the last may be short
 * unless drop_last). Every random choice for a sample (crop offset within 4-pixel zero padding,
 * horizontal flip) is keyed by hash3(seed, epoch, sample index), so batches are bit-identical
 * whatever the number of worker threads.
 *
 * `workers` threads fill a bounded ring of `prefetch` batch slots (float32 NCHW, normalised, plus
 * int32 labels); batch b is built by worker b % workers; the consumer takes them strictly in order
 * and time spent blocked waiting is reported as data-wait. With pinned = 1 the slots are page-locked
 * (host_alloc), so host-to-device copies can be asynchronous and overlap compute.
 * workers = 0 builds each batch on the calling thread when it is asked for (no prefetch). */
#ifndef LOADER_H
#define LOADER_H

#include <pthread.h>
#include <stdint.h>

#include "data.h"
#include "device.h"

typedef struct Batch {
    int n;           /* samples in this batch */
    int64_t index;   /* batch number within the epoch */
    float *x;        /* n × 3 × 32 × 32, normalised */
    int32_t *y;      /* n labels */
} Batch;

typedef struct LoaderConfig {
    int batch_size;
    int workers;     /* 0 = synchronous */
    int prefetch;    /* ring slots; 0 = 2 × max(workers, 1) (loader_config, every stage's: that + 2) */
    int augment;     /* random crop + flip (training); 0 for evaluation */
    int shuffle;     /* 1: randperm(seed + epoch); 0: 0..N−1 */
    int drop_last;
    int pinned;
    uint64_t seed;
} LoaderConfig;

typedef struct Loader Loader; /* opaque: threads, ring, condition variables */

/* dev is used only for pinned allocations (may be a CPU device). */
Loader *loader_create(const Dataset *ds, const LoaderConfig *cfg, Device *dev);
void loader_destroy(Loader *l);

/* Start epoch `epoch`, beginning at batch `start_batch` (non-zero when resuming mid-epoch).
 * indices/n_indices: NULL/0 = the whole dataset in randperm/sequential order; otherwise exactly this
 * list (the caller owns it until the next loader_start_epoch or loader_destroy). */
void loader_start_epoch(Loader *l, int64_t epoch, int64_t start_batch, const int64_t *indices,
                        int64_t n_indices);
int64_t loader_batches_per_epoch(const Loader *l);
/* Next batch of the epoch in order, or NULL at the end of the epoch. Blocks while the worker is
 * behind (time added to the wait counter). The batch stays valid until loader_release. */
Batch *loader_next(Loader *l);
void loader_release(Loader *l, Batch *b);
/* Seconds the consumer spent blocked in loader_next since the last call (then reset). */
double loader_take_wait_seconds(Loader *l);

/* The epoch order itself (for tests and the sampler lesson): randperm(n, seed + epoch) or 0..n−1. */
void loader_epoch_order(int64_t n, uint64_t seed, int64_t epoch, int shuffle, int64_t *out);
/* Build one sample as the loader would (augment: crop + flip keyed by (seed, epoch, index)). */
void loader_make_sample(const Dataset *ds, int64_t index, uint64_t seed, int64_t epoch,
                        int augment, float *out);

#endif
