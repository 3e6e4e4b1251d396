/* write_synthetic.c — the embedded synthetic set, written out as CIFAR-10 binary files.
 *
 *   tests/write_synthetic DIR [--seed S] [--train-size N] [--test-size M]
 *
 * Writes DIR/data_batch_1..5.bin and DIR/test_batch.bin: the very samples ./stageN trains on without
 * --data (defaults: seed 0, 50000 and 10000, the GPU run's sizes). Another trainer can then read the
 * same bytes — tests/train_parity.sh trains PyTorch on them beside ./stage1 --data DIR, which is how
 * we check that our trainer learns as PyTorch does — and so can yours. DIR is created if it is
 * missing, with its parents; a file already there is never overwritten. The files get their names only
 * once all six are whole (written as NAME.tmp first): an export killed part-way leaves only .tmp files,
 * which a rerun replaces. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "errors.h"

static long long number(const char *flag, const char *text, long long min, long long max) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        die_user("%s '%s': give a whole number from %lld to %lld", flag, text, min, max);
    return v;
}

int main(int argc, char **argv) {
    /* As the stages do (cli_parse): a file-size limit (ulimit -f) would kill the process mid-write with
     * SIGXFSZ, silently, leaving a cut file; ignored, the write fails with EFBIG, and
     * dataset_write_cifar10 names it and removes the files it wrote */
    signal(SIGXFSZ, SIG_IGN);
    const char *dir = NULL;
    long long seed = 0, train = 50000, test = 10000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: %s DIR [--seed S] [--train-size N] [--test-size M]\n"
                   "writes the stages' synthetic set (defaults: seed 0, 50000 train, 10000 test) as CIFAR-10\n"
                   "binary files in DIR, for ./stageN --data DIR and for other trainers\n", argv[0]);
            return 0;
        }
        int known = !strcmp(a, "--seed") || !strcmp(a, "--train-size") || !strcmp(a, "--test-size");
        if (known && i + 1 >= argc) die_user("%s needs a value (see --help)", a);
        if (!strcmp(a, "--seed")) seed = number(a, argv[++i], 0, 4294967295LL); /* the stages' --seed range */
        else if (!strcmp(a, "--train-size")) train = number(a, argv[++i], 5, 100000000);
        else if (!strcmp(a, "--test-size")) test = number(a, argv[++i], 1, 100000000);
        else if (a[0] == '-') die_user("unknown option '%s' (see --help)", a);
        else if (dir) die_user("one directory only: '%s' and '%s'", dir, a);
        else dir = a;
    }
    if (!dir) die_user("give the directory to write into: %s DIR (see --help)", argv[0]);
    /* Both sets are made whole in memory before a byte is written: sizes it cannot hold are the flags'
     * fault, said before DIR is made (checked allocation by allocation, the training set was generated
     * before the test set's malloc failed, "out of host memory" at a line of data.c, exit 1). */
    double need = (double)(train + test) * (IMG_PIXELS + 1), have = host_mem_available();
    if (have > 0 && need > have)
        die_user("--train-size %lld and --test-size %lld need %.2f GiB of host memory (both sets are made whole "
                 "before writing), more than the %.2f GiB available here — give smaller ones", train, test,
                 need / 1073741824.0, have / 1073741824.0);
    make_dirs("DIR", dir); /* and its parents: the tutorial's data/synthetic in a fresh clone */
    Dataset tr, te;
    dataset_synthetic(&tr, train, (uint64_t)seed, 1);
    dataset_synthetic(&te, test, (uint64_t)seed, 0);
    dataset_write_cifar10(&tr, &te, dir);
    dataset_free(&tr);
    dataset_free(&te);
    printf("wrote synthetic(seed=%lld): %lld training samples (data_batch_1..5.bin) and %lld test samples "
           "(test_batch.bin) in %s\n", seed, train, test, dir);
    return 0;
}
