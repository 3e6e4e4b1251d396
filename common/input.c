/* input.c — a run's input: the datasets its flags ask for, the loader's settings, and each batch moved
 * to the device (InputPipe).
 *
 * data_open also records what it opened: the sizes and the source, which the run writes into its
 * checkpoints (what their data position means) and resume.c checks a --resume against; and a hash of
 * the bytes, which the ranks of a job compare (data_signature), since --data is each node's own copy —
 * its training set's part goes into the checkpoints too, since another --data of the same size is
 * other samples.
 * The InputPipe holds two device slots: on CUDA each batch is copied into one on the copy stream,
 * which the compute stream (not the host) waits for, so that with pinned memory the copy overlaps the
 * previous step; on the CPU backend a step reads the loader's batch in place. */
#include <stdio.h>
#include <string.h>

#include "hash.h"
#include "trace.h"
#include "trainer_internal.h"

/* ---- data ------------------------------------------------------------------------------------ */

/* The training set's size and source, for what a checkpoint's data position means (every stage opens
 * its data here before run_begin). */
int64_t train_size_opened;
int data_source_opened; /* CKPT_DATA_* */
uint64_t train_signature_opened; /* the hash below, up to the end of the training set */
int64_t test_size_opened;  /* …and the test set's, for what --evaluate reports */
static uint64_t data_signature_opened;
char test_source_opened[sizeof ((Dataset *)0)->source];

void data_open(const TrainConfig *cfg, Dataset *train, Dataset *test) {
    /* Both sets, whole, before either is made: checked allocation by allocation, a training set that fits
     * alone is generated (minutes, for millions of samples) before the test set's malloc fails, and that
     * says "malloc failed" at a line of data.c. Stages 3–5's launcher asks the same for all its workers. */
    double need = data_host_bytes(cfg), have = host_mem_available();
    if (have > 0 && need > have)
        die_user("the training and test sets are held whole in host memory (%.2f GiB), more than the %.2f GiB "
                 "available here — give a smaller --train-size or --test-size", need / 1073741824.0,
                 have / 1073741824.0);
    if (cfg->evaluate) /* the loop never reads it: one synthetic sample stands in (CIFAR-10's test file suffices) */
        dataset_synthetic(train, 1, (uint64_t)cfg->seed, 1);
    else if (cfg->data[0])
        dataset_cifar10(train, cfg->data, 1, cfg->train_size > 0 ? cfg->train_size : 0);
    else
        dataset_synthetic(train, cfg->train_size, (uint64_t)cfg->seed, 1);
    if (cfg->data[0]) dataset_cifar10(test, cfg->data, 0, cfg->test_size > 0 ? cfg->test_size : 0);
    else dataset_synthetic(test, cfg->test_size, (uint64_t)cfg->seed, 0);
    train_size_opened = train->n;
    data_source_opened = cfg->data[0] ? CKPT_DATA_CIFAR10 : CKPT_DATA_SYNTHETIC;
    test_size_opened = test->n;
    snprintf(test_source_opened, sizeof test_source_opened, "%s", test->source);
    /* Files read from --data: every byte, since a node's copy may differ anywhere (a damaged or edited
     * image; every 61st byte let 60 in 61 such changes train on silently) — 0.2 s for all of CIFAR-10,
     * less than reading it. Synthetic data is drawn from --seed and the sizes, which the ranks compare
     * anyway: a sample of it says the generator is the same, in a few ms. */
    uint64_t h = fnv1a64(FNV1A64_INIT, &data_source_opened, sizeof data_source_opened);
    const Dataset *sets[2] = {train, test};
    for (int s = 0; s < 2; s++) {
        h = fnv1a64(h, &sets[s]->n, sizeof sets[s]->n);
        h = fnv1a64(h, sets[s]->labels, (size_t)sets[s]->n);
        if (cfg->data[0]) h = fnv1a64(h, sets[s]->images, (size_t)sets[s]->n * IMG_PIXELS);
        else
            for (int64_t i = 0; i < sets[s]->n * IMG_PIXELS; i += 61) h = fnv1a64(h, sets[s]->images + i, 1);
        /* the training set alone, for the checkpoints: another test set (--test-size) trains the same */
        if (s == 0) train_signature_opened = h;
    }
    data_signature_opened = h;
}

int64_t data_train_size(const TrainConfig *cfg) {
    if (cfg->evaluate) return 0;
    if (cfg->train_size > 0) return cfg->train_size; /* given, or the synthetic set's default */
    return cfg->data_train_records; /* config_resolve's look at --data's files */
}

double data_host_bytes(const TrainConfig *cfg) {
    int64_t test = cfg->test_size > 0 ? cfg->test_size : cfg->data_test_records;
    return (double)(data_train_size(cfg) + test) * (IMG_PIXELS + 1); /* a byte of label each */
}

uint64_t data_signature(char *desc, size_t len) {
    snprintf(desc, len, "%s, %lld training and %lld test images",
             data_source_opened == CKPT_DATA_CIFAR10 ? "CIFAR-10 (--data)" : "synthetic data",
             (long long)train_size_opened, (long long)test_size_opened);
    return data_signature_opened;
}

LoaderConfig loader_config(const TrainConfig *cfg, int batch_size, int train) {
    int w = cfg->workers;
    return (LoaderConfig){.batch_size = batch_size, .workers = w, .prefetch = 2 * (w > 0 ? w : 1) + 2,
                          .augment = train, .shuffle = train, .drop_last = 0,
                          .pinned = cfg->pin_memory, .seed = (uint64_t)cfg->seed};
}

/* ---- input pipe ------------------------------------------------------------------------------ */

void input_init(InputPipe *p, Device *dev, Loader *loader, int max_batch) {
    memset(p, 0, sizeof *p);
    p->dev = dev;
    p->loader = loader;
    if (dev->kind == DEV_CPU) return; /* the CPU backend reads the loader's batch in place */
    for (int s = 0; s < 2; s++) {
        p->x[s] = device_alloc(dev, (size_t)max_batch * IMG_PIXELS * sizeof(float), "input batch");
        p->y[s] = device_alloc(dev, (size_t)max_batch * sizeof(int32_t), "input labels");
#ifdef USE_CUDA
        CHECK_CUDA(cudaEventCreateWithFlags(&p->copied[s], cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreateWithFlags(&p->consumed[s], cudaEventDisableTiming));
        CHECK_CUDA(cudaEventRecord(p->consumed[s], dev->stream));
#endif
    }
}

static void release_slot(InputPipe *p, int s) {
    if (!p->held[s]) return;
#ifdef USE_CUDA
    /* The loader may refill this host buffer only once its copy has landed. */
    if (p->dev->kind == DEV_CUDA) CHECK_CUDA(cudaEventSynchronize(p->copied[s]));
#endif
    loader_release(p->loader, p->held[s]);
    p->held[s] = NULL;
}

Batch *input_next(InputPipe *p, float **x, int32_t **y) {
    Device *d = p->dev;
#ifdef USE_CUDA
    /* Everything the previous step reads from its input slot has been issued by now. */
    if (d->kind == DEV_CUDA) CHECK_CUDA(cudaEventRecord(p->consumed[p->slot], d->stream));
#endif
    TraceSpan span = trace_begin("input", "input", -1); /* waiting for the loader + issuing the copy */
    Batch *b = loader_next(p->loader);
    if (!b) {
        trace_end(span);
        return NULL;
    }
    int s = p->slot ^= 1;
    release_slot(p, s); /* the batch from two steps ago */
    p->held[s] = b;
    if (d->kind == DEV_CPU) {
        *x = b->x, *y = b->y;
        trace_end(span);
        return b;
    }
#ifdef USE_CUDA
    /* Copy on the copy stream, after the step that last used this slot, and make the compute stream
     * (not the host) wait for it: with pinned memory the copy overlaps the previous step. */
    device_bind(d);
    CHECK_CUDA(cudaStreamWaitEvent(d->copy_stream, p->consumed[s], 0));
    TraceDev copy = trace_dev_begin(d, TRACE_COPY, NULL, "H2D copy", "copy", b->index);
    CHECK_CUDA(cudaMemcpyAsync(p->x[s], b->x, (size_t)b->n * IMG_PIXELS * sizeof(float),
                               cudaMemcpyHostToDevice, d->copy_stream));
    CHECK_CUDA(cudaMemcpyAsync(p->y[s], b->y, (size_t)b->n * sizeof(int32_t),
                               cudaMemcpyHostToDevice, d->copy_stream));
    trace_dev_end(copy);
    CHECK_CUDA(cudaEventRecord(p->copied[s], d->copy_stream));
    CHECK_CUDA(cudaStreamWaitEvent(d->stream, p->copied[s], 0));
#endif
    *x = p->x[s], *y = p->y[s];
    trace_end(span);
    return b;
}

void input_drain(InputPipe *p) {
    release_slot(p, 0);
    release_slot(p, 1);
}

void input_destroy(InputPipe *p) {
    input_drain(p);
    if (p->dev->kind == DEV_CPU) return;
    for (int s = 0; s < 2; s++) {
        device_free(p->dev, p->x[s]);
        device_free(p->dev, p->y[s]);
#ifdef USE_CUDA
        cudaEventDestroy(p->copied[s]);
        cudaEventDestroy(p->consumed[s]);
#endif
    }
}
