/* test_loader.c — the input pipeline: epoch order, augmentation as specified (crop within zero
 * padding, flip, normalisation), bit-identical batches for any number of workers, batch counts,
 * explicit index lists, mid-epoch starts, and shutdown that never hangs. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data.h"
#include "loader.h"
#include "rng.h"
#include "tests.h"

static Dataset small_set(int64_t n) {
    Dataset ds;
    dataset_synthetic(&ds, n, 11, 1);
    return ds;
}

static LoaderConfig config(int batch_size, int workers, int prefetch, int augment) {
    return (LoaderConfig){.batch_size = batch_size, .workers = workers, .prefetch = prefetch, .augment = augment,
                          .shuffle = 1, .drop_last = 0, .pinned = 0, .seed = 42};
}

/* Every batch of one epoch, concatenated: x (n × 3072), y, and the batch sizes. */
typedef struct {
    int64_t n, n_batches;
    float *x;
    int32_t *y;
    int sizes[256];
} Epoch;

static Epoch run_epoch(Loader *l, const Dataset *ds, int64_t epoch, int64_t start_batch, const int64_t *idx, int64_t n_idx) {
    Epoch e = {0};
    e.x = malloc((size_t)ds->n * IMG_PIXELS * sizeof(float) + 1);
    e.y = malloc((size_t)ds->n * sizeof(int32_t) + 1);
    loader_start_epoch(l, epoch, start_batch, idx, n_idx);
    Batch *b;
    int64_t expect = start_batch;
    while ((b = loader_next(l))) {
        ck_assert_int_eq(b->index, expect++);
        ck_assert(e.n + b->n <= ds->n);
        memcpy(e.x + e.n * IMG_PIXELS, b->x, (size_t)b->n * IMG_PIXELS * sizeof(float));
        memcpy(e.y + e.n, b->y, (size_t)b->n * sizeof(int32_t));
        e.sizes[e.n_batches++] = b->n;
        e.n += b->n;
        loader_release(l, b);
    }
    ck_assert_ptr_null(loader_next(l)); /* and it stays at the end */
    return e;
}

static void epoch_free(Epoch *e) {
    free(e->x);
    free(e->y);
}

static int epochs_equal(const Epoch *a, const Epoch *b) {
    return a->n == b->n && a->n_batches == b->n_batches && !memcmp(a->sizes, b->sizes, sizeof a->sizes) &&
           !memcmp(a->x, b->x, (size_t)a->n * IMG_PIXELS * sizeof(float)) && !memcmp(a->y, b->y, (size_t)a->n * sizeof(int32_t));
}

// ----------------------------------------------------------------------------------------------

START_TEST(epoch_order_is_seeded_permutation) {
    enum { N = 500 };
    int64_t a[N], b[N], c[N], ref[N];
    loader_epoch_order(N, 42, 3, 1, a);
    loader_epoch_order(N, 42, 3, 1, b);
    loader_epoch_order(N, 42, 4, 1, c);
    char seen[N] = {0};
    for (int i = 0; i < N; i++) {
        ck_assert(a[i] >= 0 && a[i] < N && !seen[a[i]]);
        seen[a[i]] = 1;
    }
    ck_assert(!memcmp(a, b, sizeof a));
    ck_assert(memcmp(a, c, sizeof a)); /* a new order every epoch */
    randperm(N, 42 + 3, ref);          /* = torch.randperm(N, generator=manual_seed(seed + epoch)) */
    ck_assert(!memcmp(a, ref, sizeof a));
    loader_epoch_order(N, 42, 3, 0, a);
    for (int i = 0; i < N; i++) ck_assert_int_eq(a[i], i);
}
END_TEST

START_TEST(eval_sample_is_normalised_image) {
    Dataset ds = small_set(20);
    float out[IMG_PIXELS];
    for (int64_t i = 0; i < ds.n; i++) {
        loader_make_sample(&ds, i, 42, 0, 0, out);
        for (int c = 0; c < IMG_C; c++)
            for (int p = 0; p < IMG_H * IMG_W; p++) {
                uint8_t v = ds.images[i * IMG_PIXELS + c * IMG_H * IMG_W + p];
                float want = ((float)v / 255.0f - DATA_MEAN[c]) / DATA_STD[c]; /* ToTensor + Normalize */
                ck_assert_msg(out[c * IMG_H * IMG_W + p] == want, "sample %lld c %d p %d", (long long)i, c, p);
            }
    }
    /* the eval loader gives exactly these samples, in dataset order */
    LoaderConfig cfg = config(8, 2, 0, 0);
    cfg.shuffle = 0;
    Loader *l = loader_create(&ds, &cfg, NULL);
    Epoch e = run_epoch(l, &ds, 5, 0, NULL, 0);
    ck_assert_int_eq(e.n, ds.n);
    for (int64_t i = 0; i < ds.n; i++) {
        loader_make_sample(&ds, i, 42, 0, 0, out);
        ck_assert(!memcmp(out, e.x + i * IMG_PIXELS, sizeof out));
        ck_assert_int_eq(e.y[i], ds.labels[i]);
    }
    epoch_free(&e);
    loader_destroy(l);
    dataset_free(&ds);
}
END_TEST

/* The constants themselves, written out here: the CIFAR-10 training set's per-channel mean and
 * standard deviation on the 0..1 scale, to 4 digits as most PyTorch CIFAR-10 code writes them. The
 * test above builds its expectation from DATA_MEAN and DATA_STD, so a digit typed wrong there passed
 * it (a mutation audit found that); this one pins them, through the loader, for a black and a white
 * pixel of each channel. */
START_TEST(normalisation_constants_are_cifar10s) {
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    Dataset ds = small_set(2);
    memset(ds.images, 0, IMG_PIXELS);                   /* image 0: every pixel 0 */
    memset(ds.images + IMG_PIXELS, 255, IMG_PIXELS);    /* image 1: every pixel 255 */
    float out[IMG_PIXELS];
    for (int i = 0; i < 2; i++) {
        loader_make_sample(&ds, i, 0, 0, 0, out);
        for (int c = 0; c < IMG_C; c++) {
            float want = ((float)(i ? 255 : 0) / 255.0f - mean[c]) / std[c];
            ck_assert_msg(out[c * IMG_H * IMG_W + 17] == want, "pixel %d, channel %d: %.9g, expected %.9g",
                          i ? 255 : 0, c, out[c * IMG_H * IMG_W + 17], want);
        }
    }
    dataset_free(&ds);
}
END_TEST

/* The augmentation, written out independently: pad the uint8 image with 4 zero pixels on every
 * side, cut the 32×32 window at (ox, oy), mirror it if flip, then normalise. One output pixel: */
static float reference_pixel(const uint8_t *img, int ox, int oy, int flip, int c, int y, int x) {
    int sx = (flip ? IMG_W - 1 - x : x) + ox - 4, sy = y + oy - 4; /* back from the 40×40 padded image */
    uint8_t v = (sx >= 0 && sx < IMG_W && sy >= 0 && sy < IMG_H) ? img[(c * IMG_H + sy) * IMG_W + sx] : 0;
    return ((float)v / 255.0f - DATA_MEAN[c]) / DATA_STD[c];
}

/* Does `got` equal the reference for (ox, oy, flip), bit for bit? A few pixels first (cheap reject). */
static int matches_reference(const float *got, const uint8_t *img, int ox, int oy, int flip) {
    static const int probe[][3] = {{0, 0, 0}, {1, 31, 31}, {2, 5, 27}, {0, 16, 3}, {1, 9, 20}, {2, 28, 12}};
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        int c = probe[k][0], y = probe[k][1], x = probe[k][2];
        if (got[(c * IMG_H + y) * IMG_W + x] != reference_pixel(img, ox, oy, flip, c, y, x)) return 0;
    }
    for (int c = 0; c < IMG_C; c++)
        for (int y = 0; y < IMG_H; y++)
            for (int x = 0; x < IMG_W; x++)
                if (got[(c * IMG_H + y) * IMG_W + x] != reference_pixel(img, ox, oy, flip, c, y, x)) return 0;
    return 1;
}

START_TEST(augmentation_is_crop_and_flip) {
    Dataset ds = small_set(400);
    float got[IMG_PIXELS], again[IMG_PIXELS];
    int flips = 0, total = 0, identity = 0, ox_hist[9] = {0}, oy_hist[9] = {0}, corner[9][9] = {{0}};
    for (int64_t epoch = 0; epoch < 5; epoch++)
        for (int64_t i = 0; i < ds.n; i++) {
            loader_make_sample(&ds, i, 42, epoch, 1, got);
            /* which (offset, flip) produced it? exactly one must match */
            int matches = 0, mf = 0, mx = 0, my = 0;
            for (int flip = 0; flip < 2; flip++)
                for (int oy = 0; oy <= 8; oy++)
                    for (int ox = 0; ox <= 8; ox++)
                        if (matches_reference(got, ds.images + i * IMG_PIXELS, ox, oy, flip)) matches++, mf = flip, mx = ox, my = oy;
            ck_assert_msg(matches == 1, "sample %lld epoch %lld: %d matching crops", (long long)i, (long long)epoch, matches);
            flips += mf;
            ox_hist[mx]++;
            oy_hist[my]++;
            corner[my][mx]++;
            identity += mx == 4 && my == 4 && !mf;
            total++;
            /* keyed by (seed, epoch, index): asking again gives the same sample */
            loader_make_sample(&ds, i, 42, epoch, 1, again);
            ck_assert(!memcmp(got, again, sizeof got));
        }
    double rate = (double)flips / total;
    printf("loader: %.1f%% of %d augmented samples flipped\n", 100 * rate, total);
    ck_assert_msg(rate > 0.45 && rate < 0.55, "flip rate %.3f", rate);
    for (int k = 0; k < 9; k++) /* each offset ≈ 1/9 of 2000 = 222 */
        ck_assert_msg(ox_hist[k] > 150 && ox_hist[k] < 300 && oy_hist[k] > 150 && oy_hist[k] < 300,
                      "offset %d: x %d y %d times", k, ox_hist[k], oy_hist[k]);
    ck_assert_msg(identity < total / 10, "%d of %d samples unchanged", identity, total);
    /* RandomCrop draws the corner's row and column independently: all 81 corners occur (≈ 25 times
     * each in 2000; a column tied to the row, or one offset drawn for both, leaves most never seen) */
    for (int y = 0; y < 9; y++)
        for (int x = 0; x < 9; x++)
            ck_assert_msg(corner[y][x] > 0, "crop corner (x %d, y %d) never drawn in %d samples", x, y, total);
    /* a different seed or epoch gives a different augmentation of the same sample */
    loader_make_sample(&ds, 0, 42, 0, 1, got);
    int differ = 0;
    for (int64_t epoch = 1; epoch < 6; epoch++) {
        loader_make_sample(&ds, 0, 42, epoch, 1, again);
        differ += memcmp(got, again, sizeof got) != 0;
    }
    ck_assert_int_ge(differ, 4);
    dataset_free(&ds);
}
END_TEST

START_TEST(padding_is_zero_before_normalisation) {
    /* An all-white image: every padded pixel shows as (0 − mean)/std, every real one as (1 − mean)/std. */
    Dataset ds = {.n = 1, .images = malloc(IMG_PIXELS), .labels = calloc(1, 1)};
    memset(ds.images, 255, IMG_PIXELS);
    float out[IMG_PIXELS];
    int padded = 0;
    for (int64_t epoch = 0; epoch < 50; epoch++) {
        loader_make_sample(&ds, 0, 42, epoch, 1, out);
        for (int c = 0; c < IMG_C; c++)
            for (int p = 0; p < IMG_H * IMG_W; p++) {
                float v = out[c * IMG_H * IMG_W + p];
                float pad = (0.0f - DATA_MEAN[c]) / DATA_STD[c], white = (1.0f - DATA_MEAN[c]) / DATA_STD[c];
                ck_assert(v == pad || v == white);
                padded += v == pad;
            }
    }
    ck_assert_int_gt(padded, 0);
    free(ds.images);
    free(ds.labels);
}
END_TEST

START_TEST(same_batches_for_any_worker_count) {
    Dataset ds = small_set(300); /* 300 = 9 × 32 + 12: a short last batch too */
    Epoch ref = {0};
    int configs[][2] = {{0, 0}, {1, 0}, {4, 0}, {4, 1}, {3, 2}, {2, 8}}; /* workers, prefetch (0 = default) */
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        LoaderConfig cfg = config(32, configs[k][0], configs[k][1], 1);
        Loader *l = loader_create(&ds, &cfg, NULL);
        ck_assert_int_eq(loader_batches_per_epoch(l), 10);
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            Epoch e = run_epoch(l, &ds, epoch, 0, NULL, 0);
            ck_assert_int_eq(e.n_batches, 10);
            ck_assert_int_eq(e.sizes[9], 12);
            if (k == 0 && epoch == 1) {
                ref = e;
                /* and the content is what the spec says: slices of randperm(seed + epoch) */
                int64_t order[300];
                float s[IMG_PIXELS];
                loader_epoch_order(ds.n, 42, 1, 1, order);
                for (int i = 0; i < ds.n; i++) {
                    loader_make_sample(&ds, order[i], 42, 1, 1, s);
                    ck_assert(!memcmp(s, e.x + (int64_t)i * IMG_PIXELS, sizeof s));
                    ck_assert_int_eq(e.y[i], ds.labels[order[i]]);
                }
                continue;
            }
            if (epoch == 1) ck_assert_msg(epochs_equal(&e, &ref), "workers %d prefetch %d differ", configs[k][0], configs[k][1]);
            epoch_free(&e);
        }
        loader_destroy(l);
    }
    epoch_free(&ref);
    dataset_free(&ds);
}
END_TEST

START_TEST(batch_counts_and_drop_last) {
    Dataset ds = small_set(100);
    for (int workers = 0; workers <= 2; workers += 2) {
        LoaderConfig cfg = config(32, workers, 0, 0);
        Loader *l = loader_create(&ds, &cfg, NULL);
        ck_assert_int_eq(loader_batches_per_epoch(l), 4);
        Epoch e = run_epoch(l, &ds, 0, 0, NULL, 0);
        ck_assert_int_eq(e.n_batches, 4);
        ck_assert_int_eq(e.sizes[3], 4);
        epoch_free(&e);
        loader_destroy(l);

        cfg.drop_last = 1;
        l = loader_create(&ds, &cfg, NULL);
        ck_assert_int_eq(loader_batches_per_epoch(l), 3);
        e = run_epoch(l, &ds, 0, 0, NULL, 0);
        ck_assert_int_eq(e.n_batches, 3);
        ck_assert_int_eq(e.n, 96);
        epoch_free(&e);
        loader_destroy(l);

        cfg = config(100, workers, 0, 0); /* exactly one full batch; and batch > n */
        l = loader_create(&ds, &cfg, NULL);
        e = run_epoch(l, &ds, 0, 0, NULL, 0);
        ck_assert_int_eq(e.n_batches, 1);
        ck_assert_int_eq(e.sizes[0], 100);
        epoch_free(&e);
        loader_destroy(l);
        cfg = config(128, workers, 0, 0);
        cfg.drop_last = 1;
        l = loader_create(&ds, &cfg, NULL);
        ck_assert_int_eq(loader_batches_per_epoch(l), 0);
        loader_start_epoch(l, 0, 0, NULL, 0);
        ck_assert_ptr_null(loader_next(l));
        loader_destroy(l);
    }
    dataset_free(&ds);
}
END_TEST

START_TEST(explicit_index_list) {
    Dataset ds = small_set(100);
    int64_t idx[50];
    for (int i = 0; i < 50; i++) idx[i] = (i * 37 + 5) % 100; /* a shard, in this exact order */
    LoaderConfig cfg = config(32, 3, 0, 1);
    Loader *l = loader_create(&ds, &cfg, NULL);
    Epoch e = run_epoch(l, &ds, 2, 0, idx, 50);
    ck_assert_int_eq(loader_batches_per_epoch(l), 2);
    ck_assert_int_eq(e.n_batches, 2);
    ck_assert_int_eq(e.sizes[0], 32);
    ck_assert_int_eq(e.sizes[1], 18);
    float s[IMG_PIXELS];
    for (int i = 0; i < 50; i++) {
        loader_make_sample(&ds, idx[i], 42, 2, 1, s);
        ck_assert(!memcmp(s, e.x + (int64_t)i * IMG_PIXELS, sizeof s));
        ck_assert_int_eq(e.y[i], ds.labels[idx[i]]);
    }
    epoch_free(&e);
    /* back to the whole dataset on the next epoch */
    e = run_epoch(l, &ds, 3, 0, NULL, 0);
    ck_assert_int_eq(e.n, 100);
    ck_assert_int_eq(loader_batches_per_epoch(l), 4);
    epoch_free(&e);
    loader_destroy(l);
    dataset_free(&ds);
}
END_TEST

START_TEST(mid_epoch_start_is_tail_of_full_epoch) {
    Dataset ds = small_set(300);
    for (int workers = 0; workers <= 3; workers += 3) {
        LoaderConfig cfg = config(32, workers, 2, 1);
        Loader *l = loader_create(&ds, &cfg, NULL);
        Epoch full = run_epoch(l, &ds, 4, 0, NULL, 0);
        Epoch tail = run_epoch(l, &ds, 4, 7, NULL, 0); /* batches 7, 8, 9 */
        ck_assert_int_eq(tail.n_batches, 3);
        ck_assert_int_eq(tail.n, 300 - 7 * 32);
        ck_assert(!memcmp(tail.x, full.x + (int64_t)7 * 32 * IMG_PIXELS, (size_t)tail.n * IMG_PIXELS * sizeof(float)));
        ck_assert(!memcmp(tail.y, full.y + 7 * 32, (size_t)tail.n * sizeof(int32_t)));
        epoch_free(&tail);
        tail = run_epoch(l, &ds, 4, 10, NULL, 0); /* starting at the end: an empty epoch */
        ck_assert_int_eq(tail.n_batches, 0);
        epoch_free(&tail);
        epoch_free(&full);
        loader_destroy(l);
    }
    dataset_free(&ds);
}
END_TEST

START_TEST(restart_and_destroy_mid_epoch_do_not_hang) {
    /* The suite's timeout is the hang detector. */
    Dataset ds = small_set(640);
    LoaderConfig ref_cfg = config(16, 0, 0, 1);
    Loader *ref_l = loader_create(&ds, &ref_cfg, NULL);
    Epoch ref = run_epoch(ref_l, &ds, 1, 0, NULL, 0);
    loader_destroy(ref_l);
    for (int iter = 0; iter < 40; iter++) {
        LoaderConfig cfg = config(16, 1 + iter % 4, 1 + iter % 3, 1);
        Loader *l = loader_create(&ds, &cfg, NULL);
        if (iter % 5 == 0) { /* never started */
            loader_destroy(l);
            continue;
        }
        loader_start_epoch(l, 0, 0, NULL, 0);
        Batch *b = loader_next(l); /* take one and keep it: the workers fill the ring and block */
        ck_assert_ptr_nonnull(b);
        if (iter % 2) {
            /* abandon epoch 0 halfway; epoch 1 must come out exactly as from a fresh loader */
            loader_release(l, b);
            Epoch e = run_epoch(l, &ds, 1, 0, NULL, 0);
            ck_assert(epochs_equal(&e, &ref));
            epoch_free(&e);
            loader_start_epoch(l, 2, 0, NULL, 0);
            ck_assert_ptr_nonnull(loader_next(l)); /* taken, never released */
        }
        loader_destroy(l);
    }
    epoch_free(&ref);
    dataset_free(&ds);
}
END_TEST

START_TEST(out_of_order_release_and_wait_counter) {
    Dataset ds = small_set(200);
    LoaderConfig cfg = config(20, 2, 3, 1);
    Loader *l = loader_create(&ds, &cfg, NULL);
    loader_start_epoch(l, 0, 0, NULL, 0);
    int64_t seen = 0;
    Batch *prev = NULL, *cur;
    while ((cur = loader_next(l))) { /* hold two at a time, release the older one after the newer arrives */
        ck_assert_int_eq(cur->index, seen++);
        if (prev && seen % 2) {
            loader_release(l, cur); /* newer first */
            loader_release(l, prev);
            prev = NULL;
        } else {
            if (prev) loader_release(l, prev);
            prev = cur;
        }
    }
    if (prev) loader_release(l, prev);
    ck_assert_int_eq(seen, 10);
    double w = loader_take_wait_seconds(l);
    ck_assert(w >= 0.0 && w < 60.0);
    ck_assert(loader_take_wait_seconds(l) == 0.0); /* reset by the take */
    loader_destroy(l);
    dataset_free(&ds);
}
END_TEST

/* With no workers the consumer builds every batch itself when it asks (loader.h): all that time the
 * training thread waits for data, so it is data-wait, as PyTorch's data time with num_workers=0. The
 * counter is read and reset by loader_take_wait_seconds; what the assertion needs is only that building
 * real batches counted some time at all, where a loader that forgot the synchronous path reports 0.
 * out_of_order_release_and_wait_counter uses workers, and accepts 0. */
START_TEST(synchronous_loading_counts_as_data_wait) {
    Dataset ds = small_set(256);
    LoaderConfig cfg = config(128, 0, 0, 1); /* 128 augmented images a batch: far above the clock's resolution */
    Loader *l = loader_create(&ds, &cfg, NULL);
    loader_start_epoch(l, 0, 0, NULL, 0);
    int n = 0;
    for (Batch *b; (b = loader_next(l)); loader_release(l, b)) n++;
    ck_assert_int_eq(n, 2);
    const double w = loader_take_wait_seconds(l);
    ck_assert_msg(w > 0, "two batches built on the consumer's thread counted %g s of data wait", w);
    ck_assert(loader_take_wait_seconds(l) == 0.0); /* reset by the take */
    loader_destroy(l);
    dataset_free(&ds);
}
END_TEST

START_TEST(holding_every_slot_fails_loudly) {
    /* A consumer that keeps every slot and asks for more would wait forever: the loader says so
     * and exits instead (in a child process here, so the runner survives). */
    Dataset ds = small_set(100);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        LoaderConfig cfg = config(10, 1, 2, 0);
        Loader *l = loader_create(&ds, &cfg, NULL);
        loader_start_epoch(l, 0, 0, NULL, 0);
        loader_next(l);
        loader_next(l);
        loader_next(l); /* both slots held: must not block */
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    /* die_at exits with 1 (any failure exit is accepted: valgrind turns it into its own code) */
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0, "status %d", status);
    dataset_free(&ds);
}
END_TEST

/* prefetch 0 asks for loader.h's default ring, 2 × max(workers, 1) slots, as torch's prefetch_factor 2:
 * a consumer holding that many batches at once still gets every one (and only one more would be the
 * deadlock holding_every_slot_fails_loudly refuses). The stages pass a prefetch of their own, and the
 * tests passed prefetch 0 only with one worker held two at a time, so a ring of 1 × workers passed. */
START_TEST(default_ring_is_two_batches_per_worker) {
    Dataset ds = small_set(100);
    for (int workers = 0; workers <= 3; workers++) {
        LoaderConfig cfg = config(10, workers, 0, 0);
        Loader *l = loader_create(&ds, &cfg, NULL);
        loader_start_epoch(l, 0, 0, NULL, 0);
        const int slots = 2 * (workers > 0 ? workers : 1);
        Batch *held[8];
        for (int i = 0; i < slots; i++) {
            held[i] = loader_next(l); /* a ring smaller than the default dies here: the consumer holds it all */
            ck_assert_ptr_nonnull(held[i]);
            ck_assert_int_eq(held[i]->index, i);
        }
        for (int i = 0; i < slots; i++) loader_release(l, held[i]);
        int64_t rest = 0;
        for (Batch *b; (b = loader_next(l)); loader_release(l, b)) ck_assert_int_eq(b->index, slots + rest++);
        ck_assert_int_eq(slots + rest, 10);
        loader_destroy(l);
    }
    dataset_free(&ds);
}
END_TEST

START_TEST(pinned_on_cpu_device) {
    Dataset ds = small_set(100);
    Device dev = {0};
    device_init(&dev, DEV_CPU, 0, -1);
    LoaderConfig cfg = config(32, 2, 0, 1);
    Loader *plain = loader_create(&ds, &cfg, &dev);
    cfg.pinned = 1; /* no GPU here: host_alloc falls back to ordinary memory */
    Loader *pinned = loader_create(&ds, &cfg, &dev);
    Epoch a = run_epoch(plain, &ds, 0, 0, NULL, 0), b = run_epoch(pinned, &ds, 0, 0, NULL, 0);
    ck_assert(epochs_equal(&a, &b));
    epoch_free(&a);
    epoch_free(&b);
    loader_destroy(plain);
    loader_destroy(pinned);
    device_destroy(&dev);
    dataset_free(&ds);
}
END_TEST

Suite *suite_loader(void) {
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60); /* a deadlocked loader fails here instead of hanging the run */
    tcase_add_test(tc, epoch_order_is_seeded_permutation);
    tcase_add_test(tc, eval_sample_is_normalised_image);
    tcase_add_test(tc, normalisation_constants_are_cifar10s);
    tcase_add_test(tc, augmentation_is_crop_and_flip);
    tcase_add_test(tc, padding_is_zero_before_normalisation);
    tcase_add_test(tc, same_batches_for_any_worker_count);
    tcase_add_test(tc, batch_counts_and_drop_last);
    tcase_add_test(tc, explicit_index_list);
    tcase_add_test(tc, mid_epoch_start_is_tail_of_full_epoch);
    tcase_add_test(tc, restart_and_destroy_mid_epoch_do_not_hang);
    tcase_add_test(tc, out_of_order_release_and_wait_counter);
    tcase_add_test(tc, synchronous_loading_counts_as_data_wait);
    tcase_add_test(tc, holding_every_slot_fails_loudly);
    tcase_add_test(tc, default_ring_is_two_batches_per_worker);
    tcase_add_test(tc, pinned_on_cpu_device);
    suite_add_tcase(s, tc);
    return s;
}
