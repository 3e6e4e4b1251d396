/* test_resume.c — resuming under other flags (issue 13): a checkpoint's data position (epoch, batch)
 * means "so many batches of world × batch samples of this seed's permutation of N samples, K per
 * optimizer step", read in order under --no-shuffle and from shards cut to length under --drop-last;
 * a run with another --batch-size, --train-size, rank count, --gpus, --accum-steps, --no-shuffle or
 * --drop-last (where it changes the shards) is refused naming the flag, the same flags continue bit
 * for bit, and a finished checkpoint says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"
#include "tests.h"

#define LIMIT "timeout -k 5 120 "
#define TINY "--device cpu --model tiny --test-size 32 --progress off --deterministic"

static int run(const char *stage, const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, LIMIT "%s/%s %s", test_root(), stage, args);
    return test_run(cmd, out);
}

static void run_ok(const char *stage, const char *args) {
    char *out;
    int rc = run(stage, args, &out);
    ck_assert_msg(rc == 0, "%s %s: exit %d\n%s", stage, args, rc, out);
    free(out);
}

static void expect_refused(const char *stage, const char *args, const char *want1, const char *want2) {
    char *out;
    int rc = run(stage, args, &out);
    ck_assert_msg(rc == 2, "%s %s: exit %d (want 2)\n%s", stage, args, rc, out);
    ck_assert_msg(strstr(out, want1) && strstr(out, want2) && !strstr(out, "this is a bug"),
                  "%s %s: message lacks '%s' / '%s':\n%s", stage, args, want1, want2, out);
    free(out);
}

/* The resumed run's step losses (DIR/resumed.jsonl: steps skip+1 … total) are the uninterrupted
 * run's (DIR/whole.jsonl), bit for bit. */
static void expect_continued_exactly(const char *dir, int skip, int total) {
    char path[700];
    double a[64], b[64];
    snprintf(path, sizeof path, "%s/whole.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, a, 64), total);
    snprintf(path, sizeof path, "%s/resumed.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, b, 64), total - skip);
    for (int i = 0; i < total - skip; i++)
        ck_assert_msg(a[i + skip] == b[i], "step %d: %.9g vs %.9g", i + skip + 1, a[i + skip], b[i]);
}

START_TEST(resume_under_other_flags_is_refused_or_exact) {
    char *dir = test_tmpdir(), args[2048], ck[700], *out;
    /* stage 1: 96 samples, batch 8 → 12 steps an epoch; stop after 5 */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --save %s/a", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/step00000005.ckpt", dir);
    /* a bigger batch used to hit loader.c's ASSERT; a smaller one silently read other samples */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "--batch-size 8", "--batch-size 32");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 4 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "pass --batch-size 8", "other samples");
    /* the same number of batches from another training set is still another order */
    snprintf(args, sizeof args, TINY " --train-size 90 --batch-size 8 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "trained on 96 training samples", "--train-size 96");
    /* stage 2 with another --gpus: another global batch */
    snprintf(args, sizeof args, TINY " --gpus 2 --train-size 96 --batch-size 8 --epochs 2 --steps 3 --save %s/b", dir);
    run_ok("stage2", args);
    snprintf(args, sizeof args, TINY " --gpus 3 --train-size 96 --batch-size 8 --epochs 2 --resume %s/b/step00000003.ckpt",
             dir);
    expect_refused("stage2", args, "trained by 2 ranks/GPUs", "--gpus");
    /* stage 1's checkpoint under stage 3 with 2 ranks */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --nproc-per-node 2 --master-port %d "
             "--resume %s", test_free_port(), ck);
    expect_refused("stage3", args, "trained by 1 ranks/GPUs", "--nproc-per-node");
    /* the same flags continue exactly: 5 + 7 steps equal 12 uninterrupted ones (the same --epochs: one schedule) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 12 --log-every 1 --report %s/whole.jsonl", dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 12 --log-every 1 --resume %s --save %s/c "
             "--report %s/resumed.jsonl", ck, dir, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from"), "%s", out);
    free(out);
    expect_continued_exactly(dir, 5, 12);
    /* a finished checkpoint says so (it used to print a summary of zeros) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --resume %s/c/epoch001.ckpt", dir);
    expect_refused("stage1", args, "is a finished run: 1 epochs done (step 12)", "--epochs above 1");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --resume %s", ck);
    expect_refused("stage1", args, "already at step 5", "--steps");
    free(dir);
}
END_TEST

/* The sampler's flags (stages 3–5): --no-shuffle reads every epoch in order, --drop-last cuts the
 * shards when the ranks do not divide the training set. A checkpoint records both (format version 3). */
START_TEST(resume_under_other_sampler_flags_is_refused_or_exact) {
    char *dir = test_tmpdir(), args[2048], ck[700], *out;
    const char *one = TINY " --train-size 96 --batch-size 8 --epochs 2 --nproc-per-node 1";
    snprintf(args, sizeof args, "%s --master-port %d --steps 5 --no-shuffle --save %s/ns", one, test_free_port(), dir);
    run_ok("stage3", args);
    snprintf(ck, sizeof ck, "%s/ns/step00000005.ckpt", dir);
    snprintf(args, sizeof args, "%s --master-port %d --resume %s", one, test_free_port(), ck);
    expect_refused("stage3", args, "trained with --no-shuffle, this run shuffles", "pass --no-shuffle");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "trained with --no-shuffle", "stage1 has no --no-shuffle: continue it with ./stage3");
    /* a shuffled checkpoint (stage 1's) under --no-shuffle */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --save %s/sh", dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --master-port %d --no-shuffle --resume %s/sh/step00000005.ckpt", one,
             test_free_port(), dir);
    expect_refused("stage3", args, "trained with shuffled epochs, this run has --no-shuffle", "drop --no-shuffle");
    /* --no-shuffle continues exactly: 5 + 7 steps equal 12 uninterrupted ones; --drop-last with one rank
     * drops nothing, so it may differ */
    snprintf(args, sizeof args, "%s --master-port %d --no-shuffle --steps 12 --log-every 1 --report %s/whole.jsonl",
             one, test_free_port(), dir);
    run_ok("stage3", args);
    snprintf(args, sizeof args, "%s --master-port %d --no-shuffle --drop-last --steps 12 --log-every 1 --resume %s "
             "--report %s/resumed.jsonl", one, test_free_port(), ck, dir);
    ck_assert_int_eq(run("stage3", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from") && !strstr(out, "does not record"), "%s", out);
    free(out);
    expect_continued_exactly(dir, 5, 12);
    /* 97 samples over 2 ranks: --drop-last makes shards of 48, without it 49 (one padded) */
    const char *two = TINY " --train-size 97 --batch-size 8 --epochs 2 --nproc-per-node 2";
    snprintf(args, sizeof args, "%s --master-port %d --steps 3 --drop-last --save %s/dl", two, test_free_port(), dir);
    run_ok("stage3", args);
    snprintf(ck, sizeof ck, "%s/dl/step00000003.ckpt", dir);
    snprintf(args, sizeof args, "%s --master-port %d --resume %s", two, test_free_port(), ck);
    expect_refused("stage3", args, "trained with --drop-last, this run has not: 97 samples over 2 ranks",
                   "pass --drop-last");
    snprintf(args, sizeof args, "%s --master-port %d --drop-last --steps 4 --resume %s", two, test_free_port(), ck);
    ck_assert_int_eq(run("stage3", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* A version 2 checkpoint (before the sampler was recorded) resumes with a note that says so. */
START_TEST(version2_checkpoint_resumes_with_a_note) {
    char *dir = test_tmpdir(), args[2048], ck[700], *out;
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 2 --save %s", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/step00000002.ckpt", dir);
    long n;
    unsigned char *b = (unsigned char *)test_slurp(ck, &n);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(b[8], 3);
    b[8] = 2;
    memset(b + 152, 0, 16); /* version 2 wrote zeros where version 3 records the sampler */
    uint64_t h = fnv1a64(FNV1A64_INIT, b, (size_t)n - 8);
    for (int i = 0; i < 8; i++) b[n - 8 + i] = (unsigned char)(h >> (8 * i));
    FILE *f = fopen(ck, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(b, 1, (size_t)n, f), n);
    fclose(f);
    free(b);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 3 --resume %s", ck);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "format version 2, which does not record --no-shuffle or --drop-last") &&
                  strstr(out, "resumed from"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* A FIFO as a data file or as --report used to hang forever; a failing --report write used to be a
 * warning with exit 0; --save into an impossible place (or onto a checkpoint name that is a directory)
 * used to fail only after an epoch. */
START_TEST(fifos_full_disks_and_bad_save_dirs_fail_at_once) {
    char *dir = test_tmpdir(), path[700], args[2048], *out;
    snprintf(path, sizeof path, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --report %s", path);
    expect_refused("stage1", args, "is a FIFO", path);
    snprintf(path, sizeof path, "%s/data", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/data/data_batch_1.bin", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    snprintf(args, sizeof args, TINY " --data %s/data --steps 1", dir);
    expect_refused("stage1", args, "is not a regular file", "data_batch_1.bin");
    if (access("/dev/full", W_OK) == 0) {
        ck_assert_int_eq(run("stage1", TINY " --train-size 64 --steps 2 --report /dev/full", &out), 1);
        ck_assert_msg(strstr(out, "writing the --report file '/dev/full' failed"), "%s", out);
        free(out);
    }
    snprintf(path, sizeof path, "%s/plain", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --save %s/plain/ckpts", dir);
    ck_assert_int_eq(run("stage1", args, &out), 2);
    ck_assert_msg(strstr(out, "--save") && !strstr(out, "epoch 1"), "trained before failing:\n%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/names", dir); /* the first save's name is a directory */
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/names/epoch001.ckpt", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(args, sizeof args, TINY " --train-size 64 --epochs 1 --save %s/names", dir);
    expect_refused("stage1", args, "epoch001.ckpt' exists and is not a regular file", "remove it");
    /* --keep-last 2: of 4 epoch checkpoints, the newest 2 remain */
    snprintf(args, sizeof args, TINY " --train-size 32 --batch-size 16 --epochs 4 --save %s/keep --keep-last 2", dir);
    run_ok("stage1", args);
    const char *want[] = {"epoch001.ckpt", "epoch002.ckpt", "epoch003.ckpt", "epoch004.ckpt"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/keep/%s", dir, want[i]);
        ck_assert_msg((access(path, F_OK) == 0) == (i >= 2), "%s %s", path, i >= 2 ? "missing" : "kept");
    }
    free(dir);
}
END_TEST

Suite *suite_resume(void) {
    Suite *s = suite_create("resume");
    TCase *tc = tcase_create("resume");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, resume_under_other_flags_is_refused_or_exact);
    tcase_add_test(tc, resume_under_other_sampler_flags_is_refused_or_exact);
    tcase_add_test(tc, version2_checkpoint_resumes_with_a_note);
    tcase_add_test(tc, fifos_full_disks_and_bad_save_dirs_fail_at_once);
    suite_add_tcase(s, tc);
    return s;
}
