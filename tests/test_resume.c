/* test_resume.c — resuming under other flags (issue 13): a checkpoint's data position (epoch, batch)
 * means "so many batches of world × batch samples of this seed's permutation of N samples, K per
 * optimizer step"; a run with another --batch-size, --train-size, rank count, --gpus or
 * --accum-steps is refused naming the flag, the same flags continue bit for bit, and a finished
 * checkpoint says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests.h"

#define LIMIT "timeout -k 5 120 "
#define TINY "--device cpu --model tiny --test-size 32 --progress off --deterministic"

static int run(const char *stage, const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, LIMIT "%s/%s %s", test_root(), stage, args);
    return test_run(cmd, out);
}

static void expect_refused(const char *stage, const char *args, const char *want1, const char *want2) {
    char *out;
    int rc = run(stage, args, &out);
    ck_assert_msg(rc == 2, "%s %s: exit %d (want 2)\n%s", stage, args, rc, out);
    ck_assert_msg(strstr(out, want1) && strstr(out, want2) && !strstr(out, "this is a bug"),
                  "%s %s: message lacks '%s' / '%s':\n%s", stage, args, want1, want2, out);
    free(out);
}

START_TEST(resume_under_other_flags_is_refused_or_exact) {
    char *dir = test_tmpdir(), args[2048], ck[700], *out;
    /* stage 1: 96 samples, batch 8 → 12 steps an epoch; stop after 5 */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --save %s/a", dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    free(out);
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
    ck_assert_int_eq(run("stage2", args, &out), 0);
    free(out);
    snprintf(args, sizeof args, TINY " --gpus 3 --train-size 96 --batch-size 8 --epochs 2 --resume %s/b/step00000003.ckpt",
             dir);
    expect_refused("stage2", args, "trained by 2 ranks/GPUs", "--gpus");
    /* stage 1's checkpoint under stage 3 with 2 ranks */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --nproc-per-node 2 --master-port %d "
             "--resume %s", test_free_port(), ck);
    expect_refused("stage3", args, "trained by 1 ranks/GPUs", "--nproc-per-node");
    /* the same flags continue exactly: 5 + 7 steps equal 12 uninterrupted ones (the same --epochs: one schedule) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 12 --log-every 1 --report %s/whole.jsonl", dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    free(out);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 12 --log-every 1 --resume %s --save %s/c "
             "--report %s/resumed.jsonl", ck, dir, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from"), "%s", out);
    free(out);
    double a[16], b[16];
    snprintf(args, sizeof args, "%s/whole.jsonl", dir);
    ck_assert_int_eq(test_read_losses(args, a, 16), 12);
    snprintf(args, sizeof args, "%s/resumed.jsonl", dir);
    ck_assert_int_eq(test_read_losses(args, b, 16), 7);
    for (int i = 0; i < 7; i++) ck_assert_msg(a[i + 5] == b[i], "step %d: %.9g vs %.9g", i + 6, a[i + 5], b[i]);
    /* a finished checkpoint says so (it used to print a summary of zeros) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --resume %s/c/epoch001.ckpt", dir);
    expect_refused("stage1", args, "is a finished run: 1 epochs done (step 12)", "--epochs above 1");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --resume %s", ck);
    expect_refused("stage1", args, "already at step 5", "--steps");
    free(dir);
}
END_TEST

/* A FIFO as a data file or as --report used to hang forever; a failing --report write used to be a
 * warning with exit 0; --save into an impossible place used to fail only after an epoch. */
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
    /* --keep-last 2: of 4 epoch checkpoints, the newest 2 remain */
    snprintf(args, sizeof args, TINY " --train-size 32 --batch-size 16 --epochs 4 --save %s/keep --keep-last 2", dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    free(out);
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
    tcase_add_test(tc, fifos_full_disks_and_bad_save_dirs_fail_at_once);
    suite_add_tcase(s, tc);
    return s;
}
