/* data.h — datasets in host memory: the embedded synthetic CIFAR-like set, or real CIFAR-10.
 *
 * A Dataset is N images of 3×32×32 bytes (CHW, as CIFAR-10's binary format stores them) and N labels.
 * The synthetic set is generated from a seed: every class has a smooth random object and colour
 * cast; each sample is its class's object (shifted, mirrored) over background clutter, with a
 * weaker object of another class, random contrast, brightness, tint and noise (data.c has the
 * recipe), so it is learnable but not trivial, and random crops and flips help as they do on CIFAR.
 * Real CIFAR-10 (--data DIR) is read from data_batch_1..5.bin and test_batch.bin; every file is
 * validated and a problem is reported naming the file and what is wrong with it. */
#ifndef DATA_H
#define DATA_H

#include <stdint.h>

#define IMG_C 3
#define IMG_H 32
#define IMG_W 32
#define IMG_PIXELS (IMG_C * IMG_H * IMG_W) /* 3072 bytes per image */
#define NUM_CLASSES 10

typedef struct Dataset {
    int64_t n;
    uint8_t *images; /* n × 3072, CHW */
    uint8_t *labels; /* n, each 0..9 */
    char source[64]; /* "synthetic(seed=…)" or "cifar10:train" — for the report */
} Dataset;

/* Synthetic: train and test are disjoint draws from the same distribution (test uses a different
 * stream of the same seed). n ≥ 1. Deterministic in (seed, n, train). */
void dataset_synthetic(Dataset *ds, int64_t n, uint64_t seed, int train);

/* CIFAR-10 binary: train = data_batch_1..5.bin (50000), test = test_batch.bin (10000).
 * limit > 0 keeps the first `limit` samples (--train-size / --test-size); asking for more than the
 * files hold is a user error. Errors (die_user): directory or file missing or unreadable, size not a
 * multiple of 3073, truncated file, label outside 0..9 (names the file and record index). A file that
 * is there but bad is to be removed before docs/get_cifar10.sh DIR runs again (the script keeps a set
 * whose files have the official size), and every message says so. */
void dataset_cifar10(Dataset *ds, const char *dir, int train, int64_t limit);
/* What dataset_cifar10 checks (the directory, each file's size, the limit, the labels it will read),
 * with the same errors, reading a byte a record; returns the split's record count. config_resolve runs
 * it before any worker starts. */
int64_t cifar10_check(const char *dir, int train, int64_t limit);
/* The files dataset_cifar10 reads, train then test: CIFAR10_FILES names. */
#define CIFAR10_FILES 6
extern const char *const cifar10_file_names[CIFAR10_FILES];

/* Both sets as CIFAR-10 binary files in dir (which must exist): train as data_batch_1..5.bin (split
 * as evenly as it goes, at least 5 samples), test as test_batch.bin. A folder holding any of the six
 * names already is refused (die_user) before a file is written; a failed write removes every file
 * this call wrote. Each is written as NAME.tmp, fsynced, and renamed to NAME once all six are whole,
 * so a killed export leaves only .tmp files, which the next call replaces (with a note). */
void dataset_write_cifar10(const Dataset *train, const Dataset *test, const char *dir);

void dataset_free(Dataset *ds);

/* Per-channel normalisation used for CIFAR-10 (torchvision's usual constants). */
extern const float DATA_MEAN[3];
extern const float DATA_STD[3];

#endif
