/* loader.c — the input pipeline: epoch order, augmentation, worker threads, a bounded prefetch ring.
 *
 * The consumer (the training loop) asks for batches 0, 1, 2, … of an epoch in order. `workers`
 * threads build them ahead of time into a ring of `prefetch` slots: batch b always goes to slot
 * b % prefetch and is built by worker b % workers. A worker may start batch b only once
 * b < head + prefetch, where head is the oldest batch the consumer has not released yet — so
 * the ring is *bounded*: workers run at most `prefetch` batches ahead, memory stays fixed, and a
 * slot is never overwritten while the consumer (or an asynchronous host-to-device copy from it)
 * still reads it. One mutex guards the ring state; two condition variables carry the wake-ups
 * (work_cv: "a slot was freed / a new epoch began" for workers, ready_cv: "a batch is ready /
 * a worker went idle" for the consumer). Nobody spins.
 *
 * Determinism: every random choice about a sample is keyed by hash3(seed, epoch, sample index),
 * not drawn from a generator shared by the thread that happens to build it, so the bytes of
 * every batch are identical for 0, 1 or 16 workers, and for any rank that sees the sample. */
#include "loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "rng.h"
#include "trace.h"

#define PAD 4 /* RandomCrop(32, padding=4): the crop's top-left corner is in 0..2·PAD */

typedef enum { SLOT_FREE, SLOT_BUILDING, SLOT_READY, SLOT_TAKEN } SlotState;

typedef struct {
    Batch batch;      /* x and y point into host_alloc'd (possibly pinned) memory */
    SlotState state;
} Slot;

struct Loader {
    const Dataset *ds;
    LoaderConfig cfg;
    Device *dev;
    int n_slots;
    Slot *slots;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* workers wait here for a slot or an epoch */
    pthread_cond_t ready_cv; /* the consumer waits here for a batch, or for workers to go idle */
    /* the current epoch; changed only by loader_start_epoch while no worker is building */
    int64_t epoch;
    const int64_t *order;    /* sample indices of the epoch: own_order or the caller's list */
    int64_t n_order;
    int64_t *own_order;      /* ds->n entries: randperm or 0..n−1 */
    int64_t n_batches;
    int64_t start_batch;
    uint64_t generation;     /* bumped by every loader_start_epoch: workers restart their count */
    int started;
    /* ring state */
    int64_t taken;           /* next batch the consumer will take */
    int64_t head;            /* oldest batch not yet released (head ≤ taken) */
    int busy;                /* workers building right now */
    int pausing;             /* loader_start_epoch is waiting for busy == 0: take no new work */
    int shutdown;
    double wait_seconds;
};

// ----------------------------------------------------------------------------------------------
// epoch order and samples (pure functions: the same answer from any thread)

void loader_epoch_order(int64_t n, uint64_t seed, int64_t epoch, int shuffle, int64_t *out) {
    /* seed + epoch, as torch.utils.data.DistributedSampler does (generator.manual_seed(seed + epoch)),
     * so a new epoch gets a new order and the same run reproduces it. */
    if (shuffle) randperm(n, seed + (uint64_t)epoch, out);
    else
        for (int64_t i = 0; i < n; i++) out[i] = i;
}

/* (v/255 − mean)/std for every byte value and channel, computed the way ToTensor + Normalize
 * compute it in float32, once: the per-pixel work is then one table lookup. */
static float norm_table[IMG_C][256];
static pthread_once_t norm_once = PTHREAD_ONCE_INIT;

static void norm_table_init(void) {
    for (int c = 0; c < IMG_C; c++)
        for (int v = 0; v < 256; v++) norm_table[c][v] = ((float)v / 255.0f - DATA_MEAN[c]) / DATA_STD[c];
}

void loader_make_sample(const Dataset *ds, int64_t index, uint64_t seed, int64_t epoch, int augment, float *out) {
    pthread_once(&norm_once, norm_table_init);
    ASSERT(index >= 0 && index < ds->n);
    const uint8_t *img = ds->images + (size_t)index * IMG_PIXELS;
    if (!augment) {
        for (int c = 0; c < IMG_C; c++)
            for (int i = 0; i < IMG_H * IMG_W; i++) out[c * IMG_H * IMG_W + i] = norm_table[c][img[c * IMG_H * IMG_W + i]];
        return;
    }
    /* Keyed by the sample's dataset index (not its position in the batch or the worker's id):
     * the same sample in the same epoch is cropped and flipped the same way whoever builds it. */
    uint64_t h = hash3(seed, (uint64_t)epoch, (uint64_t)index);
    int ox = (int)(h % (2 * PAD + 1));         /* crop corner in the 40×40 zero-padded image */
    int oy = (int)((h >> 16) % (2 * PAD + 1));
    int flip = (int)((h >> 32) & 1);           /* horizontal flip with p = 0.5 */
    for (int c = 0; c < IMG_C; c++) {
        /* Padding is zero *before* normalisation (torchvision pads the uint8 image, then
         * Normalize), so a padded pixel becomes (0 − mean)/std, not 0. */
        float pad_value = norm_table[c][0];
        for (int y = 0; y < IMG_H; y++) {
            int sy = y + oy - PAD;
            float *row = out + (c * IMG_H + y) * IMG_W;
            for (int x = 0; x < IMG_W; x++) {
                int sx = (flip ? IMG_W - 1 - x : x) + ox - PAD; /* crop, then flip the crop */
                int inside = sy >= 0 && sy < IMG_H && sx >= 0 && sx < IMG_W;
                row[x] = inside ? norm_table[c][img[(c * IMG_H + sy) * IMG_W + sx]] : pad_value;
            }
        }
    }
}

/* Fill slot s with batch b of the current epoch. Reads only state that is fixed while a worker is
 * building (loader_start_epoch waits for busy == 0 before it changes any of it). */
static void build_batch(Loader *l, Slot *s, int64_t b) {
    int64_t first = b * l->cfg.batch_size;
    int64_t n = l->n_order - first;
    if (n > l->cfg.batch_size) n = l->cfg.batch_size;
    s->batch.n = (int)n;
    s->batch.index = b;
    TraceSpan span = trace_begin("load batch", "loader", b);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx = l->order[first + i];
        loader_make_sample(l->ds, idx, l->cfg.seed, l->epoch, l->cfg.augment, s->batch.x + (size_t)i * IMG_PIXELS);
        s->batch.y[i] = l->ds->labels[idx];
    }
    trace_end(span);
}

// ----------------------------------------------------------------------------------------------
// worker threads

typedef struct {
    Loader *l;
    int id;
} WorkerArg;

static void *worker_main(void *p) {
    WorkerArg *arg = p;
    Loader *l = arg->l;
    int id = arg->id, n_workers = l->cfg.workers;
    free(arg);
    char lane[32]; /* --trace */
    snprintf(lane, sizeof lane, "%sloader worker %d", l->cfg.shuffle ? "" : "eval ", id);
    trace_thread_name(lane);
    uint64_t generation = 0;
    int64_t next = 0; /* the next batch this worker builds: ≡ id (mod workers) */
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->shutdown) break;
        if (generation != l->generation) { /* a new epoch: first batch ≥ start_batch that is ours */
            generation = l->generation;
            next = l->start_batch + ((id - l->start_batch % n_workers) % n_workers + n_workers) % n_workers;
        }
        /* Our batch may start once its slot is free: b < head + slots (the bounded ring). */
        if (l->started && !l->pausing && next < l->n_batches && next < l->head + l->n_slots) {
            Slot *s = &l->slots[next % l->n_slots];
            ASSERT(s->state == SLOT_FREE);
            s->state = SLOT_BUILDING;
            l->busy++;
            pthread_mutex_unlock(&l->mu);
            build_batch(l, s, next); /* the slow part, without the lock */
            pthread_mutex_lock(&l->mu);
            s->state = SLOT_READY;
            l->busy--;
            next += n_workers;
            pthread_cond_broadcast(&l->ready_cv); /* the consumer, or loader_start_epoch waiting for idle */
            continue;
        }
        pthread_cond_wait(&l->work_cv, &l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

// ----------------------------------------------------------------------------------------------
// the public API

Loader *loader_create(const Dataset *ds, const LoaderConfig *cfg, Device *dev) {
    ASSERT(ds && ds->n >= 1 && cfg->batch_size >= 1 && cfg->workers >= 0);
    Loader *l = xcalloc(1, sizeof *l);
    l->ds = ds;
    l->cfg = *cfg;
    l->dev = dev;
    l->n_slots = cfg->prefetch > 0 ? cfg->prefetch : 2 * (cfg->workers > 0 ? cfg->workers : 1);
    l->slots = xcalloc((size_t)l->n_slots, sizeof(Slot));
    for (int i = 0; i < l->n_slots; i++) {
        l->slots[i].batch.x = host_alloc(dev, (size_t)cfg->batch_size * IMG_PIXELS * sizeof(float), cfg->pinned);
        l->slots[i].batch.y = host_alloc(dev, (size_t)cfg->batch_size * sizeof(int32_t), cfg->pinned);
        l->slots[i].state = SLOT_FREE;
    }
    l->own_order = xmalloc((size_t)ds->n * sizeof(int64_t));
    l->n_order = ds->n; /* until the first epoch, for loader_batches_per_epoch */
    int64_t n = l->n_order;
    l->n_batches = cfg->drop_last ? n / cfg->batch_size : (n + cfg->batch_size - 1) / cfg->batch_size;
    xmutex_init(&l->mu);
    xcond_init(&l->work_cv);
    xcond_init(&l->ready_cv);
    if (cfg->workers > 0) l->threads = xcalloc((size_t)cfg->workers, sizeof(pthread_t));
    for (int w = 0; w < cfg->workers; w++) {
        WorkerArg *arg = xmalloc(sizeof *arg);
        arg->l = l;
        arg->id = w;
        xthread_create(&l->threads[w], worker_main, arg);
    }
    return l;
}

void loader_destroy(Loader *l) {
    if (!l) return;
    /* Workers may be mid-batch or waiting for a slot the consumer never released (training stopped
     * mid-epoch): shutdown wakes the waiters, and a builder notices it when its batch is done. */
    pthread_mutex_lock(&l->mu);
    l->shutdown = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    for (int w = 0; w < l->cfg.workers; w++) pthread_join(l->threads[w], NULL);
    for (int i = 0; i < l->n_slots; i++) {
        host_free(l->dev, l->slots[i].batch.x, l->cfg.pinned);
        host_free(l->dev, l->slots[i].batch.y, l->cfg.pinned);
    }
    pthread_cond_destroy(&l->ready_cv);
    pthread_cond_destroy(&l->work_cv);
    pthread_mutex_destroy(&l->mu);
    free(l->threads);
    free(l->slots);
    free(l->own_order);
    free(l);
}

void loader_start_epoch(Loader *l, int64_t epoch, int64_t start_batch, const int64_t *indices, int64_t n_indices) {
    pthread_mutex_lock(&l->mu);
    /* Let batches being built finish (they read the old order), and hand out no new work meanwhile;
     * then everything the workers read can change safely. */
    l->pausing = 1;
    while (l->busy > 0) pthread_cond_wait(&l->ready_cv, &l->mu);
    if (indices) {
        for (int64_t i = 0; i < n_indices; i++) ASSERT(indices[i] >= 0 && indices[i] < l->ds->n);
        l->order = indices;
        l->n_order = n_indices;
    } else {
        loader_epoch_order(l->ds->n, l->cfg.seed, epoch, l->cfg.shuffle, l->own_order);
        l->order = l->own_order;
        l->n_order = l->ds->n;
    }
    int64_t bs = l->cfg.batch_size;
    l->n_batches = l->cfg.drop_last ? l->n_order / bs : (l->n_order + bs - 1) / bs;
    ASSERT(start_batch >= 0 && start_batch <= l->n_batches);
    l->epoch = epoch;
    l->start_batch = start_batch;
    /* Batches of the previous epoch still in the ring (built ahead, or never released) are dropped. */
    for (int i = 0; i < l->n_slots; i++) l->slots[i].state = SLOT_FREE;
    l->taken = l->head = start_batch;
    l->generation++;
    l->started = 1;
    l->pausing = 0;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
}

int64_t loader_batches_per_epoch(const Loader *l) { return l->n_batches; }

Batch *loader_next(Loader *l) {
    pthread_mutex_lock(&l->mu);
    ASSERT(l->started); /* call loader_start_epoch first */
    if (l->taken >= l->n_batches) {
        pthread_mutex_unlock(&l->mu);
        return NULL;
    }
    /* Holding as many batches as there are slots, the next one could never be built. */
    if (l->taken - l->head >= l->n_slots)
        die_at(__FILE__, __LINE__, "loader_next", "the consumer holds every prefetch slot (deadlock)",
               "release batches before asking for more, or raise LoaderConfig.prefetch");
    int64_t b = l->taken;
    Slot *s = &l->slots[b % l->n_slots];
    if (l->cfg.workers == 0) {
        /* Synchronous: build it here and now; its slot is free (b < head + slots). The training
         * thread waits for data all that time, so it counts as data-wait (as PyTorch's data time). */
        ASSERT(s->state == SLOT_FREE);
        s->state = SLOT_BUILDING;
        pthread_mutex_unlock(&l->mu);
        double t0 = time_now();
        build_batch(l, s, b);
        pthread_mutex_lock(&l->mu);
        l->wait_seconds += time_now() - t0;
    } else if (s->state != SLOT_READY) {
        /* The workers are behind: this is the data-wait the report shows. */
        double t0 = time_now();
        while (s->state != SLOT_READY) pthread_cond_wait(&l->ready_cv, &l->mu);
        l->wait_seconds += time_now() - t0;
    }
    ASSERT(s->batch.index == b);
    s->state = SLOT_TAKEN;
    l->taken++;
    pthread_mutex_unlock(&l->mu);
    return &s->batch;
}

void loader_release(Loader *l, Batch *b) {
    if (!b) return;
    pthread_mutex_lock(&l->mu);
    Slot *s = &l->slots[b->index % l->n_slots];
    ASSERT(&s->batch == b && s->state == SLOT_TAKEN);
    s->state = SLOT_FREE;
    /* Batches may be released out of order (the consumer holds a few while copies are in flight);
     * the ring advances past every released batch at its tail. */
    while (l->head < l->taken && l->slots[l->head % l->n_slots].state == SLOT_FREE) l->head++;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
}

double loader_take_wait_seconds(Loader *l) {
    pthread_mutex_lock(&l->mu);
    double w = l->wait_seconds;
    l->wait_seconds = 0.0;
    pthread_mutex_unlock(&l->mu);
    return w;
}
