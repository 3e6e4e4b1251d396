/* test_resume.c — resuming under other flags (issue 13): a checkpoint's data position (epoch, batch)
 * means "so many batches of world × batch samples of this seed's permutation of N samples, K per
 * optimizer step", read in order under --no-shuffle and from shards cut to length under --drop-last;
 * a run with another --batch-size, --train-size, rank count, --gpus, --accum-steps, --no-shuffle or
 * --drop-last (where it changes the shards) is refused naming the flag, the same flags continue bit
 * for bit, and a finished checkpoint says so. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "clock.h"
#include "device.h"
#include "hash.h"
#include "model.h"
#include "optim.h"
#include "tests.h"

#define LIMIT "timeout -k 5 120 "
#define TINY "--device cpu --model tiny --test-size 32 --progress off --deterministic"

/* Stages 3–5 get a free rendezvous port (a --master-port in args comes later and wins), so that
 * another job holding the default 29500 fails no test; stages 1 and 2 have no such flag. */
static int run(const char *stage, const char *args, char **out) {
    char cmd[4096], port[32] = "";
    if (strcmp(stage, "stage1") && strcmp(stage, "stage2"))
        snprintf(port, sizeof port, "--master-port %d ", test_free_port());
    snprintf(cmd, sizeof cmd, LIMIT "%s/%s %s%s", test_root(), stage, port, args);
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

/* The run exits 0 and says want1 and want2 (want2 may be NULL). */
static void ok_saying(const char *stage, const char *args, const char *want1, const char *want2) {
    char *out;
    int rc = run(stage, args, &out);
    ck_assert_msg(rc == 0 && strstr(out, want1) && (!want2 || strstr(out, want2)), "%s %s: exit %d, want '%s'%s%s:\n%s",
                  stage, args, rc, want1, want2 ? " and " : "", want2 ? want2 : "", out);
    free(out);
}

/* Run `stage args`, refused (exit 2) or accepted, saying want1 and want2 (as expect_refused /
 * ok_saying) — and `path` is byte for byte what it was. */
static void keeps_file(const char *path, int refused, const char *stage, const char *args, const char *want1,
                       const char *want2) {
    long n0, n1;
    char *before = test_slurp(path, &n0);
    if (refused) expect_refused(stage, args, want1, want2);
    else ok_saying(stage, args, want1, want2);
    char *after = test_slurp(path, &n1);
    ck_assert_msg(before && after && n0 == n1 && !memcmp(before, after, (size_t)n0), "%s was overwritten", path);
    free(before), free(after);
}

/* The number of times `needle` occurs in `hay`. */
static int occurrences(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
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

/* A run stopped and resumed with "this same command" (the stop line's advice), --report and all, keeps
 * one report: the resumed run's records follow the stopped run's, every step's loss the uninterrupted
 * run's — the file used to be emptied, losing steps 1 to 5. A report whose last checkpoint record is
 * another file (here the run's end, resumed from step 5 again) is still emptied, as any other run's.
 * Stage 1, and a 2-rank stage 3, whose rank 0 writes the report. */
START_TEST(a_resumed_run_continues_its_report) {
    char *dir = test_tmpdir(), args[2048], path[700];
    double a[64], b[64];
    const char *stages[2][2] = {{"stage1", ""}, {"stage3", "--nproc-per-node 2"}};
    for (int s = 0; s < 2; s++) {
        const char *stage = stages[s][0], *more = stages[s][1];
        const char *flags = TINY " --train-size 64 --batch-size 8 --epochs 2 --log-every 1";
        snprintf(args, sizeof args, "%s %s --report %s/%s_whole.jsonl", flags, more, dir, stage);
        run_ok(stage, args);
        snprintf(args, sizeof args, "%s %s --steps 5 --save %s/%s --report %s/%s.jsonl", flags, more, dir, stage, dir,
                 stage);
        run_ok(stage, args);
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, stage);
        FILE *f = s ? NULL : fopen(path, "a"); /* stage 1's ends in a line cut short, as by a run killed writing it */
        ck_assert(s || (f && fputs("{\"type\":\"ep", f) >= 0 && fclose(f) == 0));
        snprintf(args, sizeof args, "%s %s --save %s/%s --report %s/%s.jsonl --resume %s/%s/step00000005.ckpt", flags,
                 more, dir, stage, dir, stage, dir, stage);
        ok_saying(stage, args, "is the log of the run that --resume", "this run appends its records to it");
        if (!s) { /* the resumed run's first record starts a line of its own */
            char *text = test_slurp(path, NULL);
            ck_assert_msg(text && strstr(text, "{\"type\":\"ep\n{\"type\":\"config\""), "%s", text);
            free(text);
        }
        snprintf(path, sizeof path, "%s/%s_whole.jsonl", dir, stage);
        const int total = test_read_losses(path, a, 64);
        ck_assert_int_eq(total, s ? 8 : 16); /* stage 3: 2 ranks × 8 a step */
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, stage);
        ck_assert_int_eq(test_read_losses(path, b, 64), total);
        for (int i = 0; i < total; i++) ck_assert_msg(a[i] == b[i], "%s step %d: %.9g vs %.9g", stage, i + 1, a[i], b[i]);
        /* its last checkpoint record is now epoch002.ckpt: resuming step 5 again starts a report of its own */
        snprintf(args, sizeof args, "%s %s --report %s/%s.jsonl --resume %s/%s/step00000005.ckpt", flags, more, dir,
                 stage, dir, stage);
        run_ok(stage, args);
        ck_assert_int_eq(test_read_losses(path, b, 64), total - 5);
    }
    free(dir);
}
END_TEST

/* A job killed after its epoch-1 checkpoint (rank 0 SIGKILLed at step 7: a lost node, the OOM killer)
 * left report records of steps 5 and 6, past that checkpoint's step 4; resumed from it with the same
 * command, it trains them again. The report then holds each step once, every loss the uninterrupted
 * run's, and says what it dropped — it used to hold steps 5 and 6 twice, the dead run's and the
 * resumed one's. The records of the steps up to the checkpoint written after it (the epoch's "comm"
 * records) stay. */
START_TEST(a_report_past_its_checkpoint_is_cut_back_on_resume) {
    char *dir = test_tmpdir(), args[2048], path[700], *out;
    double a[64], b[64];
    const char *flags = TINY " --train-size 64 --batch-size 8 --epochs 2 --log-every 1 --nproc-per-node 2";
    snprintf(args, sizeof args, "%s --report %s/whole.jsonl", flags, dir);
    run_ok("stage3", args);
    snprintf(path, sizeof path, "%s/whole.jsonl", dir);
    const int total = test_read_losses(path, a, 64);
    ck_assert_int_eq(total, 8); /* 4 steps an epoch */
    snprintf(args, sizeof args, "%s --save %s/ck --report %s/run.jsonl", flags, dir, dir);
    setenv("STAGE3_FAIL_AT", "0:7:KILL", 1);
    int rc = run("stage3", args, &out);
    unsetenv("STAGE3_FAIL_AT");
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    ck_assert_msg(rc != 0 && test_read_losses(path, b, 64) == 6, "exit %d, %d steps:\n%s", rc,
                  test_read_losses(path, b, 64), out);
    free(out);
    snprintf(args, sizeof args, "%s --save %s/ck --report %s/run.jsonl --resume %s/ck/epoch001.ckpt", flags, dir, dir,
             dir);
    ok_saying("stage3", args, "this run appends its records to it",
              "with records of steps 5 to 6 from a run that ended without saving them");
    ck_assert_int_eq(test_read_losses(path, b, 64), total);
    for (int i = 0; i < total; i++) ck_assert_msg(a[i] == b[i], "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
    double comm[64];
    ck_assert_int_eq(test_report_series(path, "comm", "step", comm, 64), total); /* steps 1–4's, 1–4 written after */
    for (int i = 0; i < total; i++) ck_assert_msg(comm[i] == i + 1, "comm record %d is step %g", i + 1, comm[i]);
    free(dir);
}
END_TEST

/* A stopped run resumed from another directory (a job script that cd's elsewhere, absolute paths
 * where the first run gave relative ones) or after its folder moved still continues its report: the
 * report's checkpoint record names the file by its checksum too, not only by the path as the first
 * run, in its own directory, wrote it. That path leads nowhere from here, and the report, its steps 1
 * to 5, used to be emptied without a word. */
START_TEST(a_report_continues_from_another_directory_or_a_moved_one) {
    char *dir = test_tmpdir(), cmd[12288], path[700], *out, root[4096];
    double a[64], b[64];
    const char *flags = TINY " --train-size 64 --batch-size 8 --epochs 2 --log-every 1";
    ck_assert(realpath(test_root(), root)); /* the runs below start in other directories */
    snprintf(cmd, sizeof cmd, "%s --report %s/whole.jsonl", flags, dir);
    run_ok("stage1", cmd);
    snprintf(path, sizeof path, "%s/whole.jsonl", dir);
    const int total = test_read_losses(path, a, 64);
    ck_assert_int_eq(total, 16);
    /* stopped at step 5 in DIR/a, with paths relative to it */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/a && cd %s/a && " LIMIT "%s/stage1 %s --steps 5 --save ck --report run.jsonl",
             dir, dir, root, flags);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    free(out);
    /* resumed from DIR: "ck/step00000005.ckpt" is no file there */
    snprintf(cmd, sizeof cmd, "cd %s && " LIMIT "%s/stage1 %s --steps 10 --save a/ck --report a/run.jsonl --resume "
             "a/ck/step00000005.ckpt", dir, root, flags);
    ck_assert_msg(test_run(cmd, &out) == 0 && strstr(out, "this run appends its records to it"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/a/run.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, b, 64), 10);
    /* the folder moved, resumed from inside its new name: the record's path "a/ck/step00000010.ckpt" is gone */
    snprintf(cmd, sizeof cmd, "mv %s/a %s/b && cd %s/b && " LIMIT "%s/stage1 %s --save ck --report run.jsonl --resume "
             "ck/step00000010.ckpt", dir, dir, dir, root, flags);
    ck_assert_msg(test_run(cmd, &out) == 0 && strstr(out, "this run appends its records to it"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/b/run.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, b, 64), total);
    for (int i = 0; i < total; i++) ck_assert_msg(a[i] == b[i], "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
    free(dir);
}
END_TEST

/* A --resume refused (here another --seed) has written its "config" record when it is refused: the
 * report it continues used to keep that record of a run that trained nothing, and every refused try
 * added one, each reading as a run of its own. The resume that then continues drops them: the report
 * holds the stopped run's config and its own, and every step once. */
START_TEST(a_refused_resume_leaves_no_record_in_the_report) {
    char *dir = test_tmpdir(), args[2048], path[700];
    double a[64], b[64], cfg[8];
    const char *flags = TINY " --train-size 64 --batch-size 8 --epochs 2 --log-every 1";
    snprintf(args, sizeof args, "%s --report %s/whole.jsonl", flags, dir);
    run_ok("stage1", args);
    snprintf(path, sizeof path, "%s/whole.jsonl", dir);
    const int total = test_read_losses(path, a, 64);
    snprintf(args, sizeof args, "%s --steps 5 --save %s/ck --report %s/run.jsonl", flags, dir, dir);
    run_ok("stage1", args);
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "%s --seed %d --save %s/ck --report %s/run.jsonl --resume %s/ck/step00000005.ckpt",
                 flags, 3 + i, dir, dir, dir);
        expect_refused("stage1", args, "was trained with --seed 0", "pass --seed 0 to continue it");
    }
    snprintf(args, sizeof args, "%s --save %s/ck --report %s/run.jsonl --resume %s/ck/step00000005.ckpt", flags, dir,
             dir, dir);
    ok_saying("stage1", args, "this run appends its records to it", NULL);
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    ck_assert_int_eq(test_report_series(path, "config", "batch_size", cfg, 8), 2);
    ck_assert_int_eq(test_read_losses(path, b, 64), total);
    for (int i = 0; i < total; i++) ck_assert_msg(a[i] == b[i], "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
    free(dir);
}
END_TEST

/* A resume that was killed before it saved is superseded by the next resume of the same checkpoint,
 * even where its steps, counted under another batch size (a regrouped resume at an epoch's end), do not
 * pass the checkpoint's: a 2-rank job at --batch-size 8 (4 steps an epoch) killed at step 6 after
 * epoch001.ckpt (step 4); resumed at --batch-size 16 (2 steps an epoch: it goes on from step 2),
 * killed at step 4 after writing step 3; resumed so again, to the end. The report holds the first
 * run's steps 1–4 and the last run's 3–6, two configs — the killed resume's config and step 3 used
 * to stay, as that step 3 is not past the checkpoint's step 4. */
START_TEST(a_resume_killed_before_saving_is_superseded_by_the_next) {
    char *dir = test_tmpdir(), args[2048], path[700], *out;
    double steps[64], cfg[8];
    char flags[512];
    snprintf(flags, sizeof flags, TINY " --train-size 64 --epochs 3 --log-every 1 --nproc-per-node 2 --save %s/ck "
             "--report %s/run.jsonl", dir, dir);
    const char *env[2] = {"0:6:KILL", "0:4:KILL"};
    for (int i = 0; i < 3; i++) {
        if (!i) snprintf(args, sizeof args, "%s --batch-size 8", flags);
        else snprintf(args, sizeof args, "%s --batch-size 16 --resume %s/ck/epoch001.ckpt", flags, dir);
        if (i < 2) setenv("STAGE3_FAIL_AT", env[i], 1);
        int rc = run("stage3", args, &out);
        unsetenv("STAGE3_FAIL_AT");
        ck_assert_msg(i < 2 ? rc != 0 : rc == 0, "run %d: exit %d\n%s", i + 1, rc, out);
        free(out);
    }
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    ck_assert_int_eq(test_report_series(path, "config", "batch_size", cfg, 8), 2);
    const int n = test_report_series(path, "step", "step", steps, 64);
    const double want[] = {1, 2, 3, 4, 3, 4, 5, 6};
    ck_assert_msg(n == 8, "%d step records", n);
    for (int i = 0; i < 8; i++) ck_assert_msg(steps[i] == want[i], "step record %d is step %g", i + 1, steps[i]);
    free(dir);
}
END_TEST

/* --warmup-steps: every step's lr is torch's SequentialLR([LinearLR, CosineAnnealingLR]) (the fixture's
 * "cosine+warmup=3,0.25" case: 3 epochs of 3 steps); a run stopped inside the warm-up and resumed ends
 * where the uninterrupted one ends, bit for bit; a resume under another warm-up continues, saying where
 * the learning rate jumps and which flags continue the checkpoint's own; a warm-up as long as the run,
 * or a start factor without a warm-up, is refused. */
START_TEST(warmup_follows_torch_and_resumes_exactly) {
    char *dir = test_tmpdir(), args[2048], path[700], *out;
    const char *flags = TINY " --train-size 96 --batch-size 32 --epochs 3 --log-every 1 --lr 0.1 --schedule cosine "
                        "--warmup-steps 3 --warmup-start-factor 0.25";
    snprintf(args, sizeof args, "%s --report %s/whole.jsonl", flags, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "warm-up: the learning rate rises linearly from 0.25 × 0.1 over the first 3 optimizer "
                              "steps, then follows --schedule cosine over the other 6"), "%s", out);
    free(out);
    double lr[16], torch_lr[16];
    snprintf(path, sizeof path, "%s/whole.jsonl", dir);
    ck_assert_int_eq(test_report_series(path, "step", "lr", lr, 16), 9);
    ck_assert_int_eq(test_torch_schedule("cosine+warmup=3,0.25", 9, 0.1, torch_lr, 16), 10);
    for (int i = 0; i < 9; i++)
        ck_assert_msg(fabs(lr[i] - torch_lr[i]) <= 1e-8 * torch_lr[i], "step %d: lr %.9g, torch %.9g", i + 1, lr[i],
                      torch_lr[i]);
    ck_assert(lr[0] == 0.025 && lr[3] == 0.1); /* 0.25 × lr first; lr at the milestone */
    snprintf(args, sizeof args, "%s --steps 2 --save %s/a", flags, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --resume %s/a/step00000002.ckpt --report %s/resumed.jsonl", flags, dir, dir);
    ok_saying("stage1", args, "resumed from", NULL);
    expect_continued_exactly(dir, 2, 9);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --epochs 3 --lr 0.1 --steps 3 --resume "
             "%s/a/step00000002.ckpt", dir);
    ok_saying("stage1", args, "after 3 warm-up steps from 0.25 × lr; this run has --schedule cosine over 9 steps at "
              "--lr 0.1: at step 2 the learning rate is", "--warmup-steps 3 --warmup-start-factor 0.25)");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --epochs 3 --warmup-steps 9");
    expect_refused("stage1", args, "--warmup-steps 9 leaves no step for --schedule cosine: this run has 9 optimizer "
                   "steps", "warm up over fewer steps");
    /* past the warm-up, another start factor changes no step's lr: no note; another warm-up length
     * moves the cosine (T_max = total − W): a note, at the first step whose lr differs */
    snprintf(args, sizeof args, "%s --steps 5 --save %s/b", flags, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --epochs 3 --lr 0.1 --warmup-steps 3 "
             "--warmup-start-factor 0.5 --steps 7 --resume %s/b/step00000005.ckpt", dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from") && !strstr(out, "note: checkpoint"), "%s", out);
    free(out);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --epochs 3 --lr 0.1 --warmup-steps 2 "
             "--warmup-start-factor 0.25 --steps 7 --resume %s/b/step00000005.ckpt", dir);
    ok_saying("stage1", args, "at step 5 the learning rate is", "--warmup-steps 3 --warmup-start-factor 0.25)");
    /* in a job, rank 0 says it once and the others say why they stop */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 16 --epochs 3 --nproc-per-node 2 --warmup-steps 9");
    expect_refused("stage3", args, "--warmup-steps 9 leaves no step", "rank 1: rank 0 refused this run's flags");
    /* …also when it has a --resume to check after them */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 16 --epochs 3 --nproc-per-node 2 --warmup-steps 9 "
             "--resume %s/a/step00000002.ckpt", dir);
    expect_refused("stage3", args, "--warmup-steps 9 leaves no step", "rank 1: rank 0 refused this run's flags");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --warmup-start-factor 0.1");
    expect_refused("stage1", args, "--warmup-start-factor 0.1", "give --warmup-steps N too");
    free(dir);
}
END_TEST

/* Stages 1 and 2 read one loader of world × batch samples a step, which nn.DataParallel's GPUs split:
 * inside an epoch a stage 2 checkpoint of 2 GPUs × 8 continues as 4 × 4, or as stage 1's 16 — the
 * same samples at every step (--norm none: the same losses, to the rounding of the gradients' sums,
 * as an uninterrupted stage 1 run) — with a note. Both used to be refused: "means other samples with
 * another count". A job of processes shards the samples by rank, so there the count must match. */
START_TEST(another_split_of_the_same_samples_continues) {
    char *dir = test_tmpdir(), args[2048], ck[700];
    const char *flags = TINY " --norm none --train-size 96 --epochs 2 --log-every 1";
    snprintf(args, sizeof args, "%s --gpus 2 --batch-size 8 --steps 3 --save %s/s", flags, dir);
    run_ok("stage2", args);
    snprintf(ck, sizeof ck, "%s/s/step00000003.ckpt", dir);
    snprintf(args, sizeof args, "%s --batch-size 16 --steps 8 --report %s/whole.jsonl", flags, dir);
    run_ok("stage1", args);
    const char *stage[2] = {"stage2", "stage1"}, *split[2] = {"--gpus 4 --batch-size 4", "--batch-size 16"};
    const char *note[2] = {"trained on 2 devices × --batch-size 8, this run has 4 × 4: the same 16 samples a step",
                           "this run has 1 × 16: the same 16 samples a step"};
    for (int v = 0; v < 2; v++) {
        snprintf(args, sizeof args, "%s %s --steps 8 --resume %s --report %s/r%d.jsonl", flags, split[v], ck, dir, v);
        ok_saying(stage[v], args, "resumed from", note[v]);
        char path[700];
        double a[16], b[16];
        snprintf(path, sizeof path, "%s/whole.jsonl", dir);
        ck_assert_int_eq(test_read_losses(path, a, 16), 8);
        snprintf(path, sizeof path, "%s/r%d.jsonl", dir, v);
        ck_assert_int_eq(test_read_losses(path, b, 16), 5);
        for (int i = 0; i < 5; i++)
            ck_assert_msg(fabs(a[i + 3] - b[i]) <= 1e-5 * fabs(a[i + 3]), "%s %s, step %d: %.9g, uninterrupted %.9g",
                          stage[v], split[v], i + 4, b[i], a[i + 3]);
    }
    /* another global batch is still refused, naming both ways to continue */
    snprintf(args, sizeof args, "%s --gpus 3 --batch-size 8 --resume %s", flags, ck);
    expect_refused("stage2", args, "resume with --gpus giving 2", "--gpus × --batch-size giving its 16 samples a step");
    /* …and a job's ranks each read their own shard: one rank of 16 is not two of 8 */
    snprintf(args, sizeof args, "%s --batch-size 16 --nproc-per-node 1 --master-port %d --resume %s", flags,
             test_free_port(), ck);
    expect_refused("stage3", args, "trained on 2 devices (ranks", "--nproc-per-node");
    /* a job's shards read the same samples as one loader only where the ranks divide the set: 97 samples
     * over 2 ranks pad one shard (splittable), so batch 3 of its epoch is not one device's batch 3 of 16 */
    snprintf(args, sizeof args, TINY " --norm none --train-size 97 --epochs 2 --batch-size 8 --steps 3 "
             "--nproc-per-node 2 --master-port %d --save %s/p", test_free_port(), dir);
    run_ok("stage3", args);
    snprintf(args, sizeof args, TINY " --norm none --train-size 97 --epochs 2 --batch-size 16 --resume "
             "%s/p/step00000003.ckpt", dir);
    expect_refused("stage1", args, "trained on 2 devices", "its data position (epoch 1, batch 3) means other samples");
    free(dir);
}
END_TEST

START_TEST(resume_under_other_flags_is_refused_or_exact) {
    char *dir = test_tmpdir(), args[2048], ck[700];
    /* stage 1: 96 samples, batch 8 → 12 steps an epoch; stop after 5 */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --save %s/a", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/step00000005.ckpt", dir);
    /* a bigger batch used to hit loader.c's ASSERT; a smaller one silently read other samples */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 32 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "--batch-size 8", "--batch-size 32");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 4 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "pass --batch-size 8", "other samples");
    /* (at an epoch's end another batch size continues: resume_at_an_epoch_end_regroups) */
    /* the same number of batches from another training set is still another order */
    snprintf(args, sizeof args, TINY " --train-size 90 --batch-size 8 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "trained on 96 training samples", "--train-size 96");
    /* another --seed: another shuffle and augmentation from the same position */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --seed 7 --resume %s", ck);
    expect_refused("stage1", args, "trained with --seed 0, this run has --seed 7", "pass --seed 0");
    /* several flags forgotten: the first refusal names them all, so one retry continues it — a resume
     * typed with the defaults used to be refused once per flag */
    snprintf(args, sizeof args, TINY " --train-size 90 --batch-size 32 --epochs 2 --seed 7 --resume %s", ck);
    expect_refused("stage1", args, "pass --seed 0 to continue it (it also needs --batch-size 8 --train-size 96)",
                   "this run has --seed 7");
    snprintf(args, sizeof args, TINY " --train-size 90 --batch-size 32 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "pass --batch-size 8 to continue it (it also needs --train-size 96)",
                   "this run has --batch-size 32");
    snprintf(args, sizeof args, TINY " --train-size 90 --batch-size 8 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "--train-size 96 (and the same --data) to continue it\n", "trained on 96");
    /* stage 2 with another --gpus: another global batch */
    snprintf(args, sizeof args, TINY " --gpus 2 --train-size 96 --batch-size 8 --epochs 2 --steps 3 --save %s/b", dir);
    run_ok("stage2", args);
    snprintf(args, sizeof args, TINY " --gpus 3 --train-size 96 --batch-size 8 --epochs 2 --resume %s/b/step00000003.ckpt",
             dir);
    expect_refused("stage2", args, "trained on 2 devices (ranks, or stage 2's GPUs)", "--gpus");
    /* (the same global batch split another way continues: another_split_of_the_same_samples_continues) */
    /* stage 1's checkpoint under stage 3 with 2 ranks */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --nproc-per-node 2 --master-port %d "
             "--resume %s", test_free_port(), ck);
    expect_refused("stage3", args, "trained on 1 device (ranks", "--nproc-per-node");
    /* the same flags continue exactly: 5 + 7 steps equal 12 uninterrupted ones (the same --epochs: one schedule) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 12 --log-every 1 --report %s/whole.jsonl", dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 12 --log-every 1 --resume %s --save %s/c "
             "--report %s/resumed.jsonl", ck, dir, dir);
    char *same;
    ck_assert_int_eq(run("stage1", args, &same), 0);
    ck_assert_msg(strstr(same, "resumed from") && strstr(same, "summary: 12 steps (7 in this run, resumed at 5) in ") &&
                      !strstr(same, "--schedule"), "%s", same); /* the same schedule: no note */
    free(same);
    expect_continued_exactly(dir, 5, 12);
    /* a finished checkpoint says so (it used to print a summary of zeros) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --resume %s/c/epoch001.ckpt", dir);
    expect_refused("stage1", args, "is a finished run: 1 epoch done (step 12)", "--epochs above 1");
    /* another --epochs stretches the cosine schedule: the run goes on, saying where the learning rate
     * jumps and how to continue the checkpoint's own schedule (the same flags say nothing, above) */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 4 --steps 7 --resume %s", ck);
    ok_saying("stage1", args, "was trained with --schedule cosine over 24 steps at --lr 0.1; this run has --schedule "
              "cosine over 48 steps", "resume with --schedule cosine --epochs 2 --lr 0.1)");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 7 --lr 0.05 --resume %s", ck);
    ok_saying("stage1", args, "at --lr 0.05: at step 5 the learning rate is", NULL);
    /* resumed after that epoch and stopped inside the next: the report counts the epoch done before */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 14 --resume %s/c/epoch001.ckpt "
             "--report %s/after_epoch.jsonl --save %s/c", dir, dir, dir);
    run_ok("stage1", args);
    char rep[700];
    snprintf(rep, sizeof rep, "%s/after_epoch.jsonl", dir);
    ck_assert_int_eq((int)test_report_field(rep, "summary", "epochs"), 1);
    ck_assert_int_eq((int)test_report_field(rep, "summary", "steps"), 14);
    /* …and that stop, inside epoch 2, resumed with --epochs 1 is past this run's end, not a finished run
     * (it was called one: '1 epoch done (step 14)') */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --resume %s/c/step00000014.ckpt", dir);
    expect_refused("stage1", args, "stopped inside epoch 2 (batch 2, step 14), past this run's --epochs 1",
                   "pass --epochs 2, as it was trained, to continue it");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 2 --steps 5 --resume %s", ck);
    expect_refused("stage1", args, "already at step 5", "--steps");
    /* a finished cosine run trained further (--epochs 1 → 3, the same --lr): its cosine ended at step 12,
     * at 0, and this run's longer one is at 0.075 there — the note says the rate jumps and that nothing is
     * left to continue, though no flag but the length differs */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --save %s/f", dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 3 --steps 13 --resume %s/f/epoch001.ckpt",
             dir);
    ok_saying("stage1", args, "trained with --schedule cosine over 12 steps at --lr 0.1; this run has --schedule "
              "cosine over 36 steps at --lr 0.1: at step 12 the learning rate is",
              "its cosine ended at step 12, so none of it is left to continue");
    free(dir);
}
END_TEST

/* At an epoch's end a checkpoint means only "E epochs done", so another world size, batch size, K or
 * --drop-last continues it (resume.c's at_epoch_end), as a PyTorch script that loads its state and
 * starts the next epoch would: from 2 ranks × 8 to one device × 16 (the same global batch, the
 * same steps an epoch) the run goes on as one device × 16 from the start would, to DDP's float
 * rounding; from batch 8 to batch 16 the step count is re-counted (12 → 6) and every later step's
 * learning rate is this run's schedule at that step; the checkpoint and its line stay untouched. */
START_TEST(resume_at_an_epoch_end_regroups) {
    char *dir = test_tmpdir(), args[2048], path[700], *out;
    const char *t = "--device cpu --model tiny --norm none --test-size 32 --progress off --deterministic "
                    "--train-size 96 --lr 0.05 --log-every 1";
    snprintf(args, sizeof args, "%s --batch-size 16 --epochs 2 --report %s/whole.jsonl", t, dir);
    run_ok("stage1", args); /* 6 steps an epoch */
    snprintf(args, sizeof args, "%s --batch-size 8 --epochs 2 --steps 6 --nproc-per-node 2 --save %s/two", t, dir);
    run_ok("stage3", args);
    snprintf(args, sizeof args, "%s --batch-size 16 --epochs 2 --resume %s/two/epoch001.ckpt --report %s/resumed.jsonl",
             t, dir, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "ends epoch 1, and this run has 2 devices → 1, --batch-size 8 → 16: epoch 2 is the same "
                              "permutation") && strstr(out, "so the run continues there, at step 6 (6 steps an epoch, as "
                              "before)\n") && !strstr(out, "was at"), "%s", out);
    free(out);
    double a[16], b[16];
    snprintf(path, sizeof path, "%s/whole.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, a, 16), 12);
    snprintf(path, sizeof path, "%s/resumed.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, b, 16), 6);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(fabs(a[6 + i] - b[i]) <= 1e-5 * fabs(a[6 + i]), "step %d: %.9g (one device) vs %.9g (resumed "
                      "from 2 ranks)", 7 + i, a[6 + i], b[i]);
    /* batch 8 → 16 on one device: 12 steps done become 6; the checkpoint's line is not pruned by this one's */
    snprintf(args, sizeof args, "%s --batch-size 8 --epochs 1 --save %s/b8", t, dir);
    run_ok("stage1", args);
    snprintf(path, sizeof path, "%s/b8/epoch001.ckpt", dir);
    long n0, n1;
    char *before = test_slurp(path, &n0);
    snprintf(args, sizeof args, "%s --batch-size 16 --epochs 3 --resume %s --save %s/b8 --keep-last 1 --report "
             "%s/b16.jsonl", t, path, dir, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    char lr_note[160]; /* the rate its next step (step 7: index 6 of 18) takes, against the ended cosine's */
    snprintf(lr_note, sizeof lr_note, "; the learning rate there is %g (the checkpoint's schedule was at 0)\n",
             lr_schedule("cosine", 0.05, 0, 0, 6, 18));
    ck_assert_msg(strstr(out, "--batch-size 8 → 16") && strstr(out, "at step 6 of this run's schedule (6 steps an "
                                                                  "epoch; the checkpoint counted 12 steps)") &&
                      strstr(out, lr_note) && /* its cosine had ended */
                      strstr(out, "summary: 18 steps (12 in this run, resumed at 6)"), "%s", out);
    /* re-counted steps: the regroup note gives both rates; schedule_note, which compares the two schedules
     * step by step in one count, says nothing (its "at step 12" would be the checkpoint's count) */
    ck_assert_msg(!strstr(out, "was trained with --schedule"), "a schedule note for re-counted steps:\n%s", out);
    free(out);
    char *after = test_slurp(path, &n1);
    ck_assert_msg(before && after && n0 == n1 && !memcmp(before, after, (size_t)n0), "%s was changed", path);
    free(before), free(after);
    double lr[16];
    snprintf(path, sizeof path, "%s/b16.jsonl", dir);
    ck_assert_int_eq(test_report_series(path, "step", "lr", lr, 16), 12);
    for (int i = 0; i < 12; i++) {
        double want = lr_schedule("cosine", 0.05, 0, 0, 6 + i, 18);
        ck_assert_msg(fabs(lr[i] - want) <= 1e-8 * want, "step %d: lr %.17g, want %.17g", 7 + i, lr[i], want);
    }
    CheckpointMeta g;
    snprintf(path, sizeof path, "%s/b8/epoch003.ckpt", dir);
    ck_assert(checkpoint_peek_meta(path, &g));
    ck_assert(g.step == 18 && g.epoch == 3 && g.batch_size == 16 && g.world_size == 1);
    snprintf(path, sizeof path, "%s/b8/epoch002.ckpt", dir); /* --keep-last 1: this run's own older one went */
    ck_assert_int_ne(access(path, F_OK), 0);
    /* refused for another --seed, the "also needs" list names no --batch-size: at an epoch's end any
     * batch size continues it */
    snprintf(args, sizeof args, "%s --batch-size 16 --epochs 3 --seed 7 --resume %s/b8/epoch001.ckpt", t, dir);
    ck_assert_int_eq(run("stage1", args, &out), 2);
    ck_assert_msg(strstr(out, "pass --seed 0 to continue it") && !strstr(out, "--batch-size 8"),
                  "the refusal asks for a batch size an epoch's end does not need:\n%s", out);
    free(out);
    /* inside an epoch it is still refused (resume_under_other_flags_is_refused_or_exact), and so is a
     * step past --steps in this run's count */
    snprintf(args, sizeof args, "%s --batch-size 4 --epochs 3 --steps 20 --resume %s/b8/epoch001.ckpt", t, dir);
    expect_refused("stage1", args, "is already at step 24 of this run's schedule, and this run stops at --steps 20",
                   "raise --steps");
    free(dir);
}
END_TEST

/* --keep-last after a regrouped resume into the checkpoint's own directory: the resumed line (batch 16)
 * is another line than this run's (batch 32 or 8), whose step counts are in other units, so none of
 * its files is pruned, whichever way the steps were re-counted (18 → 9 used to remove epoch001, at
 * step 6 ≤ 9; 18 → 36 all three). */
START_TEST(keep_last_leaves_the_line_a_regrouped_resume_came_from) {
    char *dir = test_tmpdir(), args[2048], path[700];
    const char *t = TINY " --train-size 96 --epochs 4";
    const int batch[2] = {32, 8};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "%s --batch-size 16 --steps 18 --save %s/k%d", t, dir, i);
        run_ok("stage1", args); /* epoch001–003: steps 6, 12, 18 */
        snprintf(args, sizeof args, "%s --batch-size %d --resume %s/k%d/epoch003.ckpt --save %s/k%d --keep-last 1", t,
                 batch[i], dir, i, dir, i);
        run_ok("stage1", args);
        for (int e = 1; e <= 4; e++) {
            snprintf(path, sizeof path, "%s/k%d/epoch%03d.ckpt", dir, i, e);
            ck_assert_msg(access(path, F_OK) == 0, "batch 16 → %d, --keep-last 1: %s was removed", batch[i], path);
        }
    }
    free(dir);
}
END_TEST

/* A regrouped resume counts its steps otherwise: the resumed line's step8 (epoch 2, batch 2 at batch
 * 16) is this run's step 8 too at batch 32 (3 steps an epoch, resumed at 6), so a stop there would
 * write over it — refused, but as the earlier checkpoint it is (it used to be called a later one,
 * to resume from). */
START_TEST(a_regrouped_resume_names_an_earlier_step_file_so) {
    char *dir = test_tmpdir(), args[2048];
    const char *t = TINY " --train-size 96 --epochs 3";
    snprintf(args, sizeof args, "%s --batch-size 16 --steps 8 --save %s/d", t, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --batch-size 16 --steps 12 --resume %s/d/step00000008.ckpt --save %s/d", t, dir,
             dir);
    run_ok("stage1", args); /* epoch002.ckpt: step 12 */
    snprintf(args, sizeof args, "%s --batch-size 32 --resume %s/d/epoch002.ckpt --save %s/d", t, dir, dir);
    expect_refused("stage1", args, "step00000008.ckpt (epoch 2, batch 2 of its run), an earlier checkpoint than "
                   "--resume", "at step 8 would write over it");
    free(dir);
}
END_TEST

/* Adam's step count is not re-counted by a regrouped resume (torch's Adam keeps its state's "step"):
 * batch 8 → 16 resumes 12 Adam steps at this run's step 6, so the next checkpoint holds more Adam
 * steps than optimizer steps — and must resume (it used to be refused as corrupt, "Adam steps 18"). */
START_TEST(an_adam_regrouped_resume_saves_a_checkpoint_that_resumes) {
    char *dir = test_tmpdir(), args[2048];
    const char *t = TINY " --train-size 96 --optimizer adam --lr 0.001";
    snprintf(args, sizeof args, "%s --batch-size 8 --epochs 1 --save %s/a8", t, dir);
    run_ok("stage1", args); /* 12 steps, 12 Adam steps */
    snprintf(args, sizeof args, "%s --batch-size 16 --epochs 3 --steps 12 --resume %s/a8/epoch001.ckpt --save %s/a16",
             t, dir, dir);
    run_ok("stage1", args); /* epoch002.ckpt: step 12, 18 Adam steps */
    CheckpointMeta g;
    char path[700];
    snprintf(path, sizeof path, "%s/a16/epoch002.ckpt", dir);
    ck_assert(checkpoint_peek_meta(path, &g));
    ck_assert_msg(g.step == 12 && g.adam_steps == 18, "step %lld, Adam steps %lld", (long long)g.step,
                  (long long)g.adam_steps);
    snprintf(args, sizeof args, "%s --batch-size 16 --epochs 3 --resume %s", t, path);
    run_ok("stage1", args);
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
    /* at an epoch's end no position is lost: the refusal says what would change, the epochs after it */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --save %s/sh1", dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --master-port %d --no-shuffle --resume %s/sh1/epoch001.ckpt", one,
             test_free_port(), dir);
    expect_refused("stage3", args, "this run has --no-shuffle: the epochs from 2 on would be dealt in another order",
                   "drop --no-shuffle");
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
    ok_saying("stage3", args, "resumed from", NULL);
    /* …but at an epoch's end the next epoch is dealt out afresh (at_epoch_end): another --drop-last
     * continues it — 6 steps an epoch of 48 become 7 of 49, so epoch 1 ends at step 7 */
    snprintf(args, sizeof args, "%s --master-port %d --steps 6 --drop-last --save %s/dle", two, test_free_port(), dir);
    run_ok("stage3", args);
    snprintf(args, sizeof args, "%s --master-port %d --steps 8 --resume %s/dle/epoch001.ckpt", two, test_free_port(),
             dir);
    ok_saying("stage3", args, "ends epoch 1, and this run has --drop-last on → off", "at step 7 of this run's schedule");
    free(dir);
}
END_TEST

/* Writes the n bytes of an edited checkpoint to path with its checksum made good again (the file's
 * last 8 bytes: FNV-1a of the rest, little-endian), so that the loader reaches the edited field. */
static void write_resealed(const char *path, unsigned char *b, long n) {
    uint64_t h = fnv1a64(FNV1A64_INIT, b, (size_t)n - 8);
    for (int i = 0; i < 8; i++) b[n - 8 + i] = (unsigned char)(h >> (8 * i));
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(fwrite(b, 1, (size_t)n, f) == (size_t)n && fclose(f) == 0, "writing %s", path);
}

/* Writes the checkpoint `from` (today's format) to `to` as an older version's file
 * (test_ckpt_as_version: versions 5, 7, 8 and 9 added the GradScaler's 64 bytes, the warm-up's 16, the
 * optimizer's 24 and the training set's signature's 8 at the header's end), the checksum made good. Versions 1 and 2 recorded no
 * sampler or data source: zeros where versions 3 and 4 put them (152–175; what version 6 puts in
 * 176–191, the schedule, the older versions do not read). */
static void write_as_version(const char *from, const char *to, int version, int hsize) {
    long n9;
    size_t n;
    unsigned char *b9 = (unsigned char *)test_slurp(from, &n9);
    ck_assert_ptr_nonnull(b9);
    unsigned char *b = test_ckpt_as_version(version, (size_t)hsize, b9, (size_t)n9, &n);
    free(b9);
    if (version <= 2 && hsize >= 176) memset(b + 152, 0, 24);
    write_resealed(to, b, (long)n);
    free(b);
}

/* A version 2 checkpoint (before the sampler was recorded) resumes with a note that says so. */
START_TEST(version2_checkpoint_resumes_with_a_note) {
    char *dir = test_tmpdir(), args[2048], ck[700];
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 2 --save %s", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/step00000002.ckpt", dir);
    write_as_version(ck, ck, 2, 192);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 3 --resume %s", ck);
    ok_saying("stage1", args, "format version 2, which does not record --no-shuffle or --drop-last", "resumed from");
    /* at an epoch's end, resumed with --drop-last: version 2 recorded no --drop-last, so the regroup note
     * (nothing else changed) must not claim one went from off to on */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --save %s/e", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/e/epoch001.ckpt", dir);
    write_as_version(ck, ck, 2, 192);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --steps 9 --nproc-per-node 1 "
             "--drop-last --resume %s", ck);
    char *out;
    ck_assert_int_eq(run("stage3", args, &out), 0);
    ck_assert_msg(strstr(out, "format version 2, which does not record") && !strstr(out, "--drop-last off → on"),
                  "version 2 has no --drop-last to have changed:\n%s", out);
    free(out);
    /* a version 4 file (the same 192-byte header, with the sampler and the data source recorded) says
     * nothing of what versions 2 and 3 did not record */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 2 --save %s/v4", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/v4/step00000002.ckpt", dir);
    write_as_version(ck, ck, 4, 192);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 3 --resume %s", ck);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from") && occurrences(out, "does not record") == 1 &&
                      strstr(out, "does not record a signature of its training data"),
                  "a version 4 file noted as an older one (its one note: no signature of its data):\n%s", out);
    free(out);
    /* a version 1 file does not say what its step count means (no batch size): even at an epoch's end it
     * continues only on the world size it was trained on (at_epoch_end is version 2 on) */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --gpus 2 --save %s/w2", dir);
    run_ok("stage2", args);
    snprintf(ck, sizeof ck, "%s/w2/epoch001.ckpt", dir);
    write_as_version(ck, ck, 1, 128);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --resume %s", ck);
    expect_refused("stage1", args, "trained on 2 devices (ranks, or stage 2's GPUs), this run has 1",
                   "its step count (4 steps, which the learning-rate schedule counts) means another point of training");
    free(dir);
}
END_TEST

/* A checkpoint's step count and its data position must be a point of this run's schedule (resume_check's
 * last check): a file whose step disagrees with its epoch and batch — written by another tool, or edited,
 * its checksum made good — is refused naming the flags, not resumed with the learning rate of one point
 * and the samples of another. Here step 2 at batch 2 (8 batches an epoch) is rewritten as step 3, then
 * batch 2 as batch 9 (past the epoch's 8). */
START_TEST(a_checkpoint_whose_step_and_position_disagree_is_refused) {
    char *dir = test_tmpdir(), args[2048], ck[700];
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --steps 2 --save %s", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/step00000002.ckpt", dir);
    long n;
    unsigned char *b0 = (unsigned char *)test_slurp(ck, &n);
    ck_assert_ptr_nonnull(b0);
    const struct { int offset, was, now; } edit[2] = {{80, 2, 3}, {96, 2, 9}}; /* i64 step; i64 batch_in_epoch */
    for (int e = 0; e < 2; e++) {
        unsigned char *b = malloc((size_t)n);
        memcpy(b, b0, (size_t)n);
        ck_assert_int_eq(b[edit[e].offset], edit[e].was);
        b[edit[e].offset] = (unsigned char)edit[e].now;
        char path[720];
        snprintf(path, sizeof path, "%s/edited%d.ckpt", dir, e);
        write_resealed(path, b, n);
        free(b);
        snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --resume %s", path);
        expect_refused("stage1", args, "is not a position of this run's schedule (8 batches per epoch)",
                       "resume with the --batch-size, --train-size");
    }
    free(b0), free(dir);
}
END_TEST

/* The optimizer's hyperparameters ride in the checkpoint (format version 8). A resume under another
 * --momentum, --weight-decay or --clip-grad-norm used to go on with them silently; PyTorch's
 * optimizer.load_state_dict would have restored the checkpoint's momentum and weight_decay. It still goes
 * on with this run's flags, as under another --lr, but a note names what differs and the flags that
 * continue the checkpoint as it was; the same flags say nothing, and so does a version 7 file, which
 * does not record them. */
START_TEST(resume_under_other_optimizer_flags_says_so) {
    char *dir = test_tmpdir(), args[2048], ck[700], v7[720], *out;
    const char *t = TINY " --train-size 96 --batch-size 8 --epochs 2";
    snprintf(args, sizeof args, "%s --steps 5 --save %s/a", t, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/step00000005.ckpt", dir);
    static const struct { const char *flags, *was, *fix; } cases[] = {
        {"--momentum 0.5", "was trained with --momentum 0.9; this run has --momentum 0.5: this run's value is used",
         "restore the checkpoint's momentum from its param_groups (to continue the checkpoint as it was, resume "
         "with --momentum 0.9)"},
        {"--weight-decay 0.001", "was trained with --weight-decay 0.0005; this run has --weight-decay 0.001",
         "restore the checkpoint's weight_decay from its param_groups (to continue the checkpoint as it was, "
         "resume with --weight-decay 0.0005)"},
        {"--clip-grad-norm 1", "was trained with no --clip-grad-norm; this run has --clip-grad-norm 1",
         "as in PyTorch, where clip_grad_norm_ takes max_norm from the script and no state_dict holds it (to "
         "continue the checkpoint as it was, resume with --clip-grad-norm 0)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "%s --steps 6 %s --resume %s", t, cases[i].flags, ck);
        ok_saying("stage1", args, cases[i].was, cases[i].fix);
    }
    /* the same flags (the defaults, or given): no note */
    const char *same[2] = {"", "--momentum 0.9 --weight-decay 0.0005 --clip-grad-norm 0"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "%s --steps 6 %s --resume %s", t, same[i], ck);
        ck_assert_int_eq(run("stage1", args, &out), 0);
        ck_assert_msg(strstr(out, "resumed from") && !strstr(out, "note: checkpoint"), "%s", out);
        free(out);
    }
    /* a clipped run resumed unclipped and under another momentum: one note, both flags in its fix */
    snprintf(args, sizeof args, "%s --steps 5 --clip-grad-norm 1.5 --save %s/c", t, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --steps 6 --momentum 0.5 --resume %s/c/step00000005.ckpt", t, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(occurrences(out, "note: checkpoint") == 1 &&
                      strstr(out, "with --momentum 0.9, --clip-grad-norm 1.5; this run has --momentum 0.5, no "
                                  "--clip-grad-norm: this run's values are used") &&
                      strstr(out, "though not max_norm, which clip_grad_norm_ takes from the script (to continue the "
                                  "checkpoint as it was, resume with --momentum 0.9 --clip-grad-norm 1.5)"), "%s", out);
    free(out);
    /* Adam has no momentum: its weight decay (stage 5) */
    const char *adam = TINY " --train-size 96 --batch-size 8 --epochs 2 --optimizer adam --lr 0.001";
    snprintf(args, sizeof args, "%s --steps 5 --save %s/adam", adam, dir);
    run_ok("stage5", args);
    snprintf(args, sizeof args, "%s --steps 6 --weight-decay 0 --resume %s/adam/step00000005.ckpt", adam, dir);
    ok_saying("stage5", args, "was trained with --weight-decay 0.0005; this run has --weight-decay 0:",
              "resume with --weight-decay 0.0005)");
    /* in a job, rank 0 says it once */
    snprintf(args, sizeof args, "%s --batch-size 4 --nproc-per-node 2 --steps 5 --save %s/job", t, dir);
    run_ok("stage3", args);
    snprintf(args, sizeof args, "%s --batch-size 4 --nproc-per-node 2 --steps 6 --weight-decay 0.001 --resume "
             "%s/job/step00000005.ckpt", t, dir);
    ck_assert_int_eq(run("stage3", args, &out), 0);
    ck_assert_msg(occurrences(out, "this run has --weight-decay 0.001: this run's value is used") == 1, "%s", out);
    free(out);
    /* a version 7 file (a 272-byte header, without the optimizer's 24 bytes) loads, and says nothing of them
     * (its one note: no signature of its training data, which version 9 records) */
    snprintf(v7, sizeof v7, "%s/v7.ckpt", dir);
    write_as_version(ck, v7, 7, 272);
    snprintf(args, sizeof args, "%s --steps 6 --momentum 0.5 --weight-decay 0.001 --clip-grad-norm 1 --resume %s", t,
             v7);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from") && occurrences(out, "note: checkpoint") == 1 &&
                      strstr(out, "has format version 7, which does not record a signature of its training data"),
                  "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* A checkpoint whose state holds a NaN or an infinity (a diverged run's, saved by a build from before
 * run_epoch_end refused to save one — version 5 and 6 files still load — or one made so) used to be
 * taken: --evaluate reported "test loss nan" with exit 0, and a resume trained a whole epoch before
 * stopping as "diverged … lower --lr", naming that very file as the last good checkpoint. */
static void write_with_value(const char *from, const char *to, long offset, float v) {
    long n;
    unsigned char *b = (unsigned char *)test_slurp(from, &n);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_gt(n, offset + 4 + 8);
    memcpy(b + offset, &v, 4);
    write_resealed(to, b, n);
    free(b);
}

START_TEST(a_checkpoint_holding_nan_is_refused_at_once) {
    char *dir = test_tmpdir(), args[2048], ck[700], bad[720];
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --steps 2 --save %s", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/step00000002.ckpt", dir);
    long n;
    unsigned char *b = (unsigned char *)test_slurp(ck, &n);
    ck_assert_ptr_nonnull(b);
    int64_t np, nb; /* the header's n_params and n_buffers */
    memcpy(&np, b + 56, 8), memcpy(&nb, b + 64, 8);
    free(b);
    /* a NaN weight: refused for training and for --evaluate alike */
    snprintf(bad, sizeof bad, "%s/nan.ckpt", dir);
    write_with_value(ck, bad, 304, NAN); /* the first parameter, after format 9's header */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --resume %s", bad);
    expect_refused("stage1", args, "the parameters are not finite (NaN or inf)", "use an earlier checkpoint");
    snprintf(args, sizeof args, TINY " --evaluate --resume %s", bad);
    expect_refused("stage1", args, "the parameters are not finite (NaN or inf)", "use an earlier checkpoint");
    /* an infinite momentum: refused for training (--evaluate takes only the model) */
    snprintf(bad, sizeof bad, "%s/inf.ckpt", dir);
    write_with_value(ck, bad, 304 + 4 * (long)(np + nb), INFINITY);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --resume %s", bad);
    expect_refused("stage1", args, "the momentum buffer is not finite (NaN or inf)", "use an earlier checkpoint");
    snprintf(args, sizeof args, TINY " --evaluate --resume %s", bad);
    ok_saying("stage1", args, "evaluated", NULL);
    /* Adam's second moment, the blob after exp_avg (in momentum's place): an infinite exp_avg_sq is refused
     * too (its square root would silence that weight's updates) */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --steps 2 --optimizer adam --save %s/adam",
             dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/adam/step00000002.ckpt", dir);
    snprintf(bad, sizeof bad, "%s/adam_inf.ckpt", dir);
    write_with_value(ck, bad, 304 + 4 * (long)(2 * np + nb + 1), INFINITY); /* the second of exp_avg_sq */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 2 --optimizer adam --resume %s", bad);
    expect_refused("stage1", args, "Adam's moments are not finite (NaN or inf)", "use an earlier checkpoint");
    free(dir);
}
END_TEST

/* A FIFO as a data file or as --report used to hang forever; a failing --report write used to be a
 * warning with exit 0; --save into an impossible place (or onto a checkpoint name that is a directory)
 * used to fail only after an epoch. A full disk is the machine's state (exit 1) for --report and
 * --trace alike — a failed trace write, a rank's file or the merged one, used to exit 2. */
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
        ck_assert_int_eq(run("stage1", TINY " --train-size 64 --steps 2 --trace /dev/full --trace-steps 0:2", &out), 1);
        ck_assert_msg(strstr(out, "writing /dev/full failed (No space left on device): check free space"), "%s", out);
        free(out);
    }
    /* the merged trace of two ranks (~6 KB) over a 4 KB file-size limit that their own files (~3 KB) fit */
    char cmd0[2400];
    snprintf(cmd0, sizeof cmd0, "prlimit --fsize=4096 " LIMIT "%s/stage3 " TINY " --train-size 256 --batch-size 16 "
             "--steps 3 --nproc-per-node 2 --master-port %d --trace %s/t.json --trace-steps 1:3", test_root(),
             test_free_port(), dir);
    ck_assert_int_eq(test_run(cmd0, &out), 1);
    ck_assert_msg(strstr(out, "writing the merged file failed (File too large): check free space") &&
                  strstr(out, "t.json.rank1.json (open them one by one)"), "%s", out);
    free(out);
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
    /* --steps 8 at an epoch's end (4 steps an epoch) writes epoch002.ckpt, never step00000008.ckpt:
     * a directory under that name is no obstacle, and the run trains and saves */
    snprintf(path, sizeof path, "%s/boundary", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/boundary/step00000008.ckpt", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 16 --epochs 3 --steps 8 --save %s/boundary", dir);
    run_ok("stage1", args);
    snprintf(path, sizeof path, "%s/boundary/epoch002.ckpt", dir);
    ck_assert_msg(access(path, F_OK) == 0, "no %s", path);
    /* a file-size limit below the checkpoint's size (590 KB): not a silent SIGXFSZ death but the save's
     * error, naming ulimit -f; the checkpoint resumed from is untouched and no .tmp is left */
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --save %s/fsz", dir);
    run_ok("stage1", args);
    snprintf(path, sizeof path, "%s/fsz/epoch001.ckpt", dir);
    long n0, n1;
    char *before = test_slurp(path, &n0), cmd[2400];
    snprintf(cmd, sizeof cmd, "ulimit -f 256 && " LIMIT "%s/stage1 " TINY " --train-size 96 --batch-size 8 --epochs 2 "
             "--resume %s --save %s/fsz", test_root(), path, dir);
    ck_assert_int_eq(test_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "File too large") && strstr(out, "ulimit -f") && strstr(out, "epoch002.ckpt"), "%s", out);
    free(out);
    char *after = test_slurp(path, &n1);
    ck_assert_msg(before && after && n0 == n1 && !memcmp(before, after, (size_t)n0), "%s changed", path);
    free(before), free(after);
    snprintf(path, sizeof path, "%s/fsz/epoch002.ckpt.tmp", dir);
    ck_assert_msg(access(path, F_OK) != 0, "%s left behind", path);
    /* a partial checkpoint that an interrupted save left behind: named, never read */
    snprintf(path, sizeof path, "%s/part", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/part/epoch001.ckpt.tmp", dir);
    test_write_text(path, "half a checkpoint");
    snprintf(args, sizeof args, TINY " --train-size 32 --batch-size 16 --epochs 1 --save %s/part", dir);
    ok_saying("stage1", args, "holds 1 partial checkpoint (epoch001.ckpt.tmp), left by a save that was interrupted",
              "no run reads it");
    /* --keep-last 2: of 4 epoch checkpoints, the newest 2 remain */
    snprintf(args, sizeof args, TINY " --train-size 32 --batch-size 16 --epochs 4 --save %s/keep --keep-last 2", dir);
    run_ok("stage1", args);
    const char *want[] = {"epoch001.ckpt", "epoch002.ckpt", "epoch003.ckpt", "epoch004.ckpt"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/keep/%s", dir, want[i]);
        ck_assert_msg((access(path, F_OK) == 0) == (i >= 2), "%s %s", path, i >= 2 ? "missing" : "kept");
    }
    /* …and still 2 after a resume into that directory: the checkpoints before the resumed one are the
     * same run's (they used to stay, N more after every resume). One new epoch: the newest 2 are the
     * resumed checkpoint and the new one, so the oldest (epoch 3) goes — counted by step, not in the
     * directory's order */
    snprintf(args, sizeof args, TINY " --train-size 32 --batch-size 16 --epochs 5 --save %s/keep --keep-last 2 "
             "--resume %s/keep/epoch004.ckpt", dir, dir);
    run_ok("stage1", args);
    for (int i = 1; i <= 5; i++) {
        snprintf(path, sizeof path, "%s/keep/epoch%03d.ckpt", dir, i);
        ck_assert_msg((access(path, F_OK) == 0) == (i >= 4), "%s %s", path, i >= 4 ? "missing" : "kept");
    }
    /* …but a branch's checkpoint stays: resumed from epoch 1 under another --lr and stopped at step 3,
     * its step00000003 is no part of the line that epoch002 continues (it used to be pruned with it) */
    const char *b = TINY " --train-size 32 --batch-size 16 --epochs 3";
    snprintf(args, sizeof args, "%s --save %s/br", b, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --steps 3 --lr 0.05 --save %s/br --resume %s/br/epoch001.ckpt", b, dir, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --epochs 4 --save %s/br --keep-last 1 --resume %s/br/epoch003.ckpt", b, dir, dir);
    run_ok("stage1", args);
    const char *br[][2] = {{"epoch001.ckpt", "0"}, {"epoch002.ckpt", "0"}, {"epoch003.ckpt", "0"},
                           {"epoch004.ckpt", "1"}, {"step00000003.ckpt", "1"}};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/br/%s", dir, br[i][0]);
        ck_assert_msg((access(path, F_OK) == 0) == (br[i][1][0] == '1'), "%s %s", path,
                      br[i][1][0] == '1' ? "missing" : "kept");
    }
    free(dir);
}
END_TEST

/* A little CIFAR-10 in a fresh directory: 5 training files of 32 images, a test file of 32 (TINY's). */
static char *make_cifar(void) {
    char *dir = test_tmpdir(), path[700];
    const char *files[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin"};
    static unsigned char rec[3073];
    for (int k = 0; k < 6; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        for (int r = 0; r < 32; r++) {
            rec[0] = (unsigned char)((r + k) % 10);
            for (int p = 1; p < 3073; p++) rec[p] = (unsigned char)(r * 31 + p * 7 + k);
            ck_assert_int_eq(fwrite(rec, 1, sizeof rec, f), sizeof rec);
        }
        fclose(f);
    }
    return dir;
}

/* The data source (format version 4): a synthetic checkpoint continued on CIFAR-10 of the same size,
 * or the reverse, used to run on silently over other samples. */
START_TEST(resume_on_other_data_is_refused) {
    char *dir = test_tmpdir(), *cifar = make_cifar(), args[2048], *out;
    const char *t = TINY " --train-size 80 --batch-size 8 --epochs 1";
    snprintf(args, sizeof args, "%s --steps 2 --save %s/syn", t, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --steps 2 --data %s --save %s/cifar", t, cifar, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --steps 4 --data %s --resume %s/syn/step00000002.ckpt", t, cifar, dir);
    expect_refused("stage1", args, "was trained on synthetic data (no --data), this run reads CIFAR-10", "drop --data");
    snprintf(args, sizeof args, "%s --steps 4 --resume %s/cifar/step00000002.ckpt", t, dir);
    expect_refused("stage1", args, "was trained on CIFAR-10 (--data), this run reads synthetic data",
                   "pass --data with the CIFAR-10 directory");
    /* the same source continues, wherever its directory now is */
    snprintf(args, sizeof args, "%s --steps 4 --data %s/ --resume %s/cifar/step00000002.ckpt", t, cifar, dir);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from") && !strstr(out, "does not record"), "%s", out);
    free(out);
    free(cifar), free(dir);
}
END_TEST

/* The training set itself (format version 9): the same source and size may be other images. A CIFAR-10
 * checkpoint resumed with --data pointing at the synthetic set exported as CIFAR-10 files
 * (tests/write_synthetic), or at a copy of its files with one training image's byte changed, used to
 * continue silently on other samples — inside an epoch and at its end alike. Another test set trains the
 * same and continues; so does a version 8 file (no signature), saying the data could not be checked. */
START_TEST(resume_on_other_images_of_the_same_size_is_refused) {
    char *dir = test_tmpdir(), *cifar = make_cifar(), args[2048], cmd[2048], ck[700], v8[700], *out;
    const char *t = TINY " --train-size 80 --epochs 1";
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 2 --data %s --save %s/c", t, cifar, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/c/step00000002.ckpt", dir);
    snprintf(cmd, sizeof cmd, "%s/tests/write_synthetic %s/syn --train-size 160 --test-size 32 >/dev/null 2>&1",
             test_root(), dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 4 --data %s/syn --resume %s", t, dir, ck);
    expect_refused("stage1", args, "was trained on other images than --data",
                   "resume with the --data it was trained on, or start a new run (drop --resume)");
    /* refused for another flag first, the data is among what it also needs */
    snprintf(args, sizeof args, "%s --batch-size 4 --steps 4 --data %s/syn --resume %s", t, dir, ck);
    expect_refused("stage1", args, "pass --batch-size 8 to continue it", "(it also needs the --data it was trained on)");
    /* a copy of its files: one byte of the first training image changed is refused; the test file changed
     * (another test set, the same training samples) continues */
    snprintf(cmd, sizeof cmd, "cp -r %s %s/train_edit && cp -r %s %s/test_edit && "
             "printf 'Z' | dd of=%s/train_edit/data_batch_1.bin bs=1 seek=100 conv=notrunc status=none && "
             "printf 'Z' | dd of=%s/test_edit/test_batch.bin bs=1 seek=100 conv=notrunc status=none",
             cifar, dir, cifar, dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 4 --data %s/train_edit --resume %s", t, dir, ck);
    expect_refused("stage1", args, "was trained on other images than --data", "train_edit");
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 4 --data %s/test_edit --resume %s", t, dir, ck);
    ck_assert_int_eq(run("stage1", args, &out), 0);
    ck_assert_msg(strstr(out, "resumed from") && !strstr(out, "does not record"), "%s", out);
    free(out);
    /* at an epoch's end too: the next epoch would be another set's permutation */
    snprintf(args, sizeof args, "%s --batch-size 8 --data %s --save %s/e", t, cifar, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, TINY " --train-size 80 --epochs 2 --batch-size 16 --data %s/syn --resume "
             "%s/e/epoch001.ckpt", dir, dir);
    expect_refused("stage1", args, "was trained on other images than --data", "start a new run");
    /* a version 8 file records no signature: it continues, and says that the data could not be checked */
    snprintf(v8, sizeof v8, "%s/v8.ckpt", dir);
    write_as_version(ck, v8, 8, 296);
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 4 --data %s/syn --resume %s", t, dir, v8);
    ok_saying("stage1", args, "note: checkpoint '", "has format version 8, which does not record a signature of its "
              "training data: whether this run's --data is the one it was trained on could not be checked");
    /* synthetic data is drawn from --seed and the size, which are checked: a signature that differs there is
     * another build's generator — here, a file whose signature was edited (its checksum made good) */
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 2 --save %s/s", t, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/s/step00000002.ckpt", dir);
    long len;
    unsigned char *b = (unsigned char *)test_slurp(ck, &len);
    ck_assert_ptr_nonnull(b);
    b[296] ^= 1; /* the signature, u64 at 296 */
    write_resealed(ck, b, len);
    free(b);
    snprintf(args, sizeof args, "%s --batch-size 8 --steps 4 --resume %s", t, ck);
    expect_refused("stage1", args, "was trained on synthetic data other than this trainer draws from --seed 0 and "
                   "--train-size 80", "resume it with the build that wrote it, or start a new run (drop --resume)");
    free(cifar), free(dir);
}
END_TEST

/* A checkpoint of another world or of accumulation, given to a stage that has no such flag: the
 * message names the stage that can resume it, not a flag this one lacks. */
START_TEST(resume_in_the_wrong_stage_names_the_right_one) {
    char *dir = test_tmpdir(), args[2048];
    const char *t = TINY " --train-size 80 --batch-size 8 --epochs 1";
    snprintf(args, sizeof args, "%s --steps 2 --nproc-per-node 1 --accum-steps 2 --save %s/acc", t, dir);
    run_ok("stage4", args);
    snprintf(args, sizeof args, "%s --steps 4 --nproc-per-node 1 --resume %s/acc/step00000002.ckpt", t, dir);
    expect_refused("stage3", args, "stage3 takes one", "resume it with stage 4 or 5 and --accum-steps 2");
    /* another --batch-size, or another world's, is no way to continue it in a stage without --accum-steps:
     * the refusal names the accumulation first, not a --batch-size that would only be refused for it */
    snprintf(args, sizeof args, "%s --steps 4 --batch-size 16 --resume %s/acc/step00000002.ckpt", t, dir);
    expect_refused("stage1", args, "stage1 takes one", "resume it with stage 4 or 5 and --accum-steps 2");
    snprintf(args, sizeof args, "%s --steps 4 --gpus 2 --batch-size 4 --resume %s/acc/step00000002.ckpt", t, dir);
    expect_refused("stage2", args, "stage2 takes one", "resume it with stage 4 or 5 and --accum-steps 2");
    /* refused for another flag first (the seed, read before the position is judged): its "also needs" list
     * names no --accum-steps, which stage 1 does not have */
    snprintf(args, sizeof args, "%s --steps 4 --seed 7 --resume %s/acc/step00000002.ckpt", t, dir);
    char *out;
    ck_assert_int_eq(run("stage1", args, &out), 2);
    ck_assert_msg(strstr(out, "pass --seed 0 to continue it") && !strstr(out, "--accum-steps 2"),
                  "stage 1's refusal names a flag it does not have:\n%s", out);
    free(out);
    /* at an epoch's end the accumulation may change, as the batch size may (at_epoch_end): a stage without
     * --accum-steps continues a stage 4 epoch, saying so */
    snprintf(args, sizeof args, "%s --nproc-per-node 1 --accum-steps 2 --save %s/end", t, dir);
    run_ok("stage4", args);
    snprintf(args, sizeof args, TINY " --train-size 80 --batch-size 8 --epochs 2 --nproc-per-node 1 --resume "
             "%s/end/epoch001.ckpt", dir);
    ok_saying("stage3", args, "ends epoch 1, and this run has --accum-steps 2 → 1", "at step 10 of this run's schedule");
    snprintf(args, sizeof args, "%s --steps 2 --nproc-per-node 2 --save %s/two", t, dir);
    run_ok("stage3", args);
    snprintf(args, sizeof args, "%s --steps 4 --resume %s/two/step00000002.ckpt", t, dir);
    expect_refused("stage1", args, "trained on 2 devices", "resume with the stage that wrote it");
    free(dir);
}
END_TEST

/* A job of processes refuses a bad --resume once, not once per rank: rank 0 checks the file first and
 * the other ranks wait for it (resume.c's gate) — at the file's own checks (run_begin) and at
 * those against the sampler's flags (run_sampler). A waiting rank may say that rank 0 went away. */
START_TEST(a_refused_resume_is_reported_once_per_job) {
    char *dir = test_tmpdir(), args[2048], path[700], *out;
    const char *t = TINY " --train-size 96 --batch-size 8 --nproc-per-node 2";
    snprintf(args, sizeof args, "%s --epochs 1 --save %s/j", t, dir);
    run_ok("stage3", args);
    snprintf(path, sizeof path, "%s/not_a_checkpoint", dir);
    test_write_text(path, "not a checkpoint at all\n");
    snprintf(path, sizeof path, "%s/header_only", dir);
    test_write_ckpt_header_only(path);
    static const struct { const char *flags, *file, *said; } cases[] = {
        {"--epochs 2", "not_a_checkpoint", "is not a checkpoint of this trainer"}, /* the launcher's flag checks */
        {"--epochs 2", "header_only", "is truncated"},                             /* checkpoint_load */
        {"--epochs 2 --seed 7", "j/epoch001.ckpt", "trained with --seed 0, this run has --seed 7"},
        {"--epochs 1", "j/epoch001.ckpt", "is a finished run"},                        /* resume_check */
        {"--epochs 2 --drop-last --train-size 95", "j/epoch001.ckpt", "--train-size"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(args, sizeof args, "%s %s --resume %s/%s", t, cases[k].flags, dir, cases[k].file);
        int rc = run("stage3", args, &out);
        int n = 0;
        for (const char *p = out; (p = strstr(p, cases[k].said)); p++) n++;
        ck_assert_msg(rc == 2 && n == 1 && !strstr(out, "this is a bug"), "%s: exit %d, '%s' said %d times:\n%s",
                      cases[k].flags, rc, cases[k].said, n, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* One file under two flags used to be destroyed: --report or --trace on the --resume checkpoint
 * emptied it before it was read (and then blamed the checkpoint); --report F --trace F interleaved
 * both into one corrupt file with exit 0. Refused up front, the checkpoint untouched — and so are a
 * symlink to the other flag's file, /dev/stdout into the console's file, the --save lock, and a
 * report another run is writing (by stage 3's launcher before any worker starts). */
START_TEST(report_or_trace_on_the_checkpoint_is_refused) {
    char *dir = test_tmpdir(), args[2048], ck[700];
    long n0, n1;
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --steps 2 --save %s/a", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/step00000002.ckpt", dir);
    char *before = test_slurp(ck, &n0);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --resume %s --report %s", ck, ck);
    expect_refused("stage1", args, "--report", "--resume");
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --resume %s --trace %s/a/../a/%s", ck,
             dir, "step00000002.ckpt");
    expect_refused("stage1", args, "are the same file", "give --trace another file name");
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --report %s", ck); /* a typo */
    expect_refused("stage1", args, "is a checkpoint", "give --report another file name");
    char *after = test_slurp(ck, &n1);
    ck_assert_msg(n0 == n1 && !memcmp(before, after, (size_t)n0), "the checkpoint was changed");
    free(before), free(after);
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --report %s/out --trace %s/out", dir, dir);
    expect_refused("stage1", args, "are the same file", "each corrupting the other");
    /* …also through a symlink to a file not there yet (the trace's rename used to replace the report) */
    char cmd[2600], *out;
    snprintf(cmd, sizeof cmd, "ln -s %s/target.json %s/link.json", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --report %s/target.json --trace %s/link.json", dir, dir);
    expect_refused("stage1", args, "are the same file", "each corrupting the other");
    /* /dev/stdout while the output goes to a file: the report would write over the console's lines */
    snprintf(cmd, sizeof cmd, "%s/stage1 " TINY " --train-size 64 --steps 1 --report /dev/stdout > %s/log.txt 2>&1; "
             "echo \"exit $?\"; cat %s/log.txt", test_root(), dir, dir);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "exit 2") && strstr(out, "is where this run's output goes"), "%s", out);
    free(out);
    /* the --save directory's lock file is no report */
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --save %s --report %s/.lock", dir, dir);
    expect_refused("stage1", args, "has the name of a lock file", "give --report another file name");
    /* a kernel's pseudo-file looks regular, and failed only after the training, blaming free space */
    expect_refused("stage1", TINY " --train-size 64 --steps 1 --report /proc/self/status", "is a kernel pseudo-file",
                   "give --report a file of its own");
    /* a symlink whose target is a checkpoint name or the lock of --save (the link's own name hid it) */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/s && ln -s s/epoch002.ckpt %s/ck.json && ln -s s/.lock %s/lk.json", dir,
             dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --save %s/s --report %s/ck.json", dir, dir);
    expect_refused("stage1", args, "(a link to", "has the name of a checkpoint that --save");
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --save %s/s --report %s/lk.json", dir, dir);
    expect_refused("stage1", args, "(a link to", "has the name of a lock file");
    /* the files a trace writes besides its own name: FILE.tmp, and each rank's FILE.rankN.json(.tmp) —
     * a report there was replaced by a trace (exit 0); a checkpoint there, or resumed from there, gone */
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --trace %s/t.json --report %s/t.json.tmp", dir, dir);
    expect_refused("stage1", args, "is one of the files --trace", "give --report another file name");
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --trace %s/t.json --report %s/t.json.rank0.json",
             dir, dir);
    expect_refused("stage1", args, "is one of the files --trace", "the trace would replace the report");
    snprintf(cmd, sizeof cmd, "cp %s %s/t.json.tmp && cp %s %s/u.json.rank1.json.tmp", ck, dir, ck, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 8 --epochs 1 --resume %s/t.json.tmp --trace "
             "%s/t.json", dir, dir);
    expect_refused("stage1", args, "is one of the files --trace", "give --trace another file name");
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --trace %s/t.json", dir);
    expect_refused("stage1", args, "its .tmp file", "is a checkpoint");
    snprintf(args, sizeof args, TINY " --train-size 64 --steps 1 --trace %s/u.json", dir);
    expect_refused("stage1", args, "the rank file", "is a checkpoint");
    snprintf(cmd, sizeof cmd, "%s/t.json.tmp", dir);
    after = test_slurp(cmd, &n1);
    ck_assert_msg(after && n1 == n0, "%s was changed", cmd);
    free(after);
    /* two runs, one report: the second is refused while the first holds it, and the file parses */
    snprintf(cmd, sizeof cmd, "D=%s; %s/stage1 " TINY " --train-size 2048 --epochs 3 --report $D/shared.jsonl > $D/r1.log "
             "2>&1 & run=$!; while ! [ -s $D/shared.jsonl ] && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "%s/stage1 " TINY " --train-size 64 --steps 1 --report $D/shared.jsonl 2>&1; echo \"second exit $?\"; "
             LIMIT "%s/stage3 " TINY " --train-size 64 --steps 1 --nproc-per-node 2 --standalone --report "
             "$D/shared.jsonl 2>&1; echo \"stage3 exit $?\"; wait $run; echo \"first exit $?\"", dir, test_root(),
             test_root(), test_root());
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "second exit 2") && strstr(out, "is being written by another run") &&
                  strstr(out, "stage3 exit 2") && strstr(out, "first exit 0"), "%s", out);
    ck_assert_msg(!strstr(out, "launching"), "stage 3 started its workers:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/shared.jsonl", dir);
    char *rep = test_slurp(cmd, NULL);
    ck_assert_msg(rep && strstr(rep, "\"type\":\"summary\"") && !strstr(rep, "}{"), "the report was mixed:\n%s", rep);
    free(rep);
    free(dir);
}
END_TEST

/* Another user's report left in a shared directory (/tmp, two students with one command line): the
 * run that may not write it was told to "check that its directory exists and is writable", which it
 * did and was; it is told whose the file is. The file is one's own without write permission; root
 * writes any file, so as root the run drops that power first (setpriv: as another user, the binary
 * may sit where that user cannot reach it, as under /root). Stage 3's launcher says so before starting
 * any worker. */
START_TEST(another_users_report_file_is_named) {
    char *dir = test_tmpdir(), path[600], cmd[2048], *out;
    const char *as = test_unwritable_file(dir, "r.jsonl", path, sizeof path, "resume: another user's --report file");
    if (!as) {
        free(dir);
        return;
    }
    for (int stage = 1; stage <= 3; stage += 2) {
        snprintf(cmd, sizeof cmd, "%s" LIMIT "%s/stage%d " TINY " --train-size 64 --steps 1 --report %s%s", as,
                 test_root(), stage, path, stage == 3 ? " --nproc-per-node 2 --standalone" : "");
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, "Permission denied — the file is there and this user may not write it") &&
                      strstr(out, "give --report a file of your own") && !strstr(out, "check that its directory") &&
                      !strstr(out, "launching"), "stage %d: exit %d:\n%s", stage, rc, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* A fresh run into another run's --save directory used to replace its epochNNN.ckpt one by one:
 * refused at start (stage 3: in the launcher, before any worker), naming the checkpoint to --resume;
 * resuming one of them there continues writing into it. */
START_TEST(save_into_another_runs_checkpoints_is_refused) {
    char *dir = test_tmpdir(), args[2048], ck[700], *out;
    const char *t = TINY " --train-size 32 --batch-size 16";
    snprintf(args, sizeof args, "%s --epochs 2 --save %s/d", t, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/d/epoch002.ckpt", dir);
    long n0, n1;
    char *before = test_slurp(ck, &n0);
    snprintf(args, sizeof args, "%s --epochs 2 --seed 7 --save %s/d", t, dir);
    char want[800];
    snprintf(want, sizeof want, "continue that run with --resume %s", ck);
    expect_refused("stage1", args, "already holds 2 checkpoints of an earlier run", want);
    snprintf(args, sizeof args, "%s --epochs 2 --seed 7 --nproc-per-node 2 --master-port %d --save %s/d", t,
             test_free_port(), dir);
    ck_assert_int_eq(run("stage3", args, &out), 2);
    ck_assert_msg(strstr(out, "already holds 2 checkpoints") && !strstr(out, "launching"), "%s", out);
    free(out);
    char *after = test_slurp(ck, &n1);
    ck_assert_msg(n0 == n1 && !memcmp(before, after, (size_t)n0), "%s was overwritten", ck);
    free(before), free(after);
    /* continuing it there: the normal resume flow */
    snprintf(args, sizeof args, "%s --epochs 3 --resume %s --save %s/d", t, ck, dir);
    ok_saying("stage1", args, "resumed from", "epoch003.ckpt");
    /* from a checkpoint elsewhere into it: refused too */
    snprintf(args, sizeof args, "%s --epochs 2 --steps 1 --save %s/e", t, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --epochs 2 --resume %s/e/step00000001.ckpt --save %s/d", t, dir, dir);
    expect_refused("stage1", args, "is not one of them", "give --save another directory");
    /* from an earlier checkpoint of it (d holds epochs 1-3 now): the run would write epoch002 and
     * epoch003 again — refused, naming the first, which stays as it was */
    snprintf(ck, sizeof ck, "%s/d/epoch002.ckpt", dir);
    snprintf(args, sizeof args, "%s --epochs 3 --resume %s/d/epoch001.ckpt --save %s/d", t, dir, dir);
    keeps_file(ck, 1, "stage1", args, "a later checkpoint than --resume", "epoch002.ckpt, a later");
    /* what the run writes, not every later name: --steps 3 stops inside epoch 2 (2 steps an epoch),
     * so only step00000003.ckpt is written and epoch002/003 stay as they are */
    snprintf(args, sizeof args, "%s --epochs 3 --steps 3 --resume %s/d/epoch001.ckpt --save %s/d", t, dir, dir);
    keeps_file(ck, 0, "stage1", args, "resumed from", "step00000003.ckpt");
    /* a later step checkpoint the run would pass is at risk too: a stop on a signal saves at a step
     * of its own. f holds epoch001 and step00000003 (--steps 3 stopped inside epoch 2); resuming
     * epoch001 into f passes step 3 — refused, the file kept; from step00000003 itself, nothing later */
    snprintf(args, sizeof args, "%s --epochs 3 --steps 3 --save %s/f", t, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/f/step00000003.ckpt", dir);
    snprintf(args, sizeof args, "%s --epochs 3 --resume %s/f/epoch001.ckpt --save %s/f", t, dir, dir);
    keeps_file(ck, 1, "stage1", args, "step00000003.ckpt, a later checkpoint", "a stop on a signal");
    snprintf(args, sizeof args, "%s --epochs 3 --resume %s/f/step00000003.ckpt --save %s/f", t, dir, dir);
    keeps_file(ck, 0, "stage1", args, "resumed from", "epoch003.ckpt");
    /* --steps already reached (epoch001 is step 2): the resume's own message, in stage 3 too, where
     * the position is checked after the overwrite check */
    snprintf(args, sizeof args, "%s --epochs 3 --steps 2 --nproc-per-node 1 --master-port %d --resume %s/d/epoch001.ckpt "
             "--save %s/d", t, test_free_port(), dir, dir);
    expect_refused("stage3", args, "is already at step 2", "raise --steps");
    /* order comes from the positions, not the files' times: a copied directory whose epoch001 looks
     * newest still continues from epoch003 */
    snprintf(args, sizeof args, "cp -r %s/d %s/copy && touch %s/copy/epoch001.ckpt", dir, dir, dir);
    ck_assert_int_eq(system(args), 0);
    snprintf(args, sizeof args, "%s --epochs 4 --resume %s/copy/epoch003.ckpt --save %s/copy", t, dir, dir);
    ok_saying("stage1", args, "resumed from", "epoch004.ckpt");
    free(dir);
}
END_TEST

/* Wait until the file at path says what (up to secs seconds, times the build's slowness). */
static int wait_for_text(const char *path, const char *what, double secs) {
    for (double t0 = time_now(); time_now() - t0 < secs * test_time_scale(); usleep(20000)) {
        char *text = test_slurp(path, NULL);
        int found = text && strstr(text, what);
        free(text);
        if (found) return 1;
    }
    return 0;
}

/* Refused (exit 2) before training, saying want1 and want2. */
static void refused_untrained(const char *stage, const char *args, const char *want1, const char *want2) {
    char *out;
    int rc = run(stage, args, &out);
    ck_assert_msg(rc == 2 && strstr(out, want1) && strstr(out, want2) && !strstr(out, "epoch 1/") &&
                      !strstr(out, "saved checkpoint"), "%s %s: exit %d, want '%s' and '%s' before any epoch:\n%s",
                  stage, args, rc, want1, want2, out);
    free(out);
}

/* Two runs saving into one --save directory at once wrote the same epochNNN.ckpt names over each
 * other, and both exited 0: the check of what the directory holds ran only at start-up. The run that
 * saves holds the directory's lock for its whole life: a second one stops before training, naming the
 * holder — fresh, before or after the holder's first save; stage 3's launcher, or its rank 0 resuming
 * there — and the holder's checkpoints stay its own. Killed (no clean-up), the holder blocks no one:
 * its checkpoints resume there, with --keep-last, beside the lock file it left. */
START_TEST(two_runs_saving_into_one_directory) {
    char *dir = test_tmpdir(), args[2048], log[700], cmd[2400], holder[96];
    snprintf(log, sizeof log, "%s/a.log", dir);
    snprintf(cmd, sizeof cmd, "exec %s/stage1 " TINY " --train-size 512 --batch-size 32 --epochs 1000 --save %s/s",
             test_root(), dir); /* 16 steps an epoch, for as long as the test needs it */
    pid_t a = fork();
    ck_assert_int_ge(a, 0);
    if (a == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* it never outlives the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(holder, sizeof holder, "stage1 (pid %d on host ", (int)a); /* sh exec'd it: the same pid */
    const char *fix = "give each run its own --save directory, or wait for that run to finish";
    ck_assert_msg(wait_for_text(log, "stage1 | ", 60), "the first run did not start"); /* past its flags' checks */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 32 --epochs 1 --seed 7 --save %s/s", dir);
    refused_untrained("stage1", args, holder, fix);
    ck_assert_msg(wait_for_text(log, "saved checkpoint", 60), "the first run saved nothing");
    refused_untrained("stage1", args, holder, fix); /* its lock, not "an earlier run" */
    snprintf(args, sizeof args, TINY " --train-size 64 --batch-size 32 --epochs 1 --seed 7 --nproc-per-node 2 --save %s/s",
             dir);
    refused_untrained("stage3", args, holder, "is in use by another run"); /* by the launcher */
    snprintf(args, sizeof args, TINY " --train-size 512 --batch-size 32 --epochs 1000 --nproc-per-node 2 "
             "--resume %s/s/epoch001.ckpt --save %s/s", dir, dir); /* rank 0 locks: the launcher passes it */
    refused_untrained("stage3", args, holder, "job failed: rank 0 (local rank 0");
    ck_assert_int_eq(kill(a, SIGKILL), 0);
    ck_assert_int_eq(waitpid(a, NULL, 0), a);
    /* what the directory holds is the first run's (--seed 0 at header offset 104), the lock file unlisted */
    char *newest = NULL, path[800];
    int epochs = 0;
    snprintf(path, sizeof path, "%s/s", dir);
    int n = checkpoint_list(path, &newest);
    ck_assert_msg(n >= 1 && newest && sscanf(strrchr(newest, '/'), "/epoch%d.ckpt", &epochs) == 1 && epochs == n,
                  "%d checkpoints, newest %s", n, newest);
    for (int e = 1; e <= n; e++) {
        snprintf(path, sizeof path, "%s/s/epoch%03d.ckpt", dir, e);
        long len;
        char *ck = test_slurp(path, &len);
        int64_t seed = -1;
        ck_assert_msg(ck && len > 112, "%s", path);
        memcpy(&seed, ck + 104, 8);
        ck_assert_msg(seed == 0, "%s was written by the run with --seed %lld", path, (long long)seed);
        free(ck);
    }
    /* it died holding the lock: resuming there goes on, and --keep-last 1 keeps the newest it wrote */
    int64_t stop = 16 * (int64_t)epochs + 17;
    snprintf(args, sizeof args, TINY " --train-size 512 --batch-size 32 --epochs 1000 --steps %lld --resume %s --save "
             "%s/s --keep-last 1", (long long)stop, newest, dir);
    run_ok("stage1", args);
    snprintf(path, sizeof path, "%s/s/epoch%03d.ckpt", dir, epochs + 1);
    ck_assert_msg(access(path, F_OK) != 0, "--keep-last 1 left %s", path);
    snprintf(path, sizeof path, "%s/s/step%08lld.ckpt", dir, (long long)stop);
    ck_assert_msg(access(path, F_OK) == 0, "%s missing", path);
    free(newest), free(dir);
}
END_TEST

/* The last name a run that stops after `step` writes (16 steps an epoch): epochNNN at an epoch's end. */
static void final_checkpoint(char *buf, size_t len, const char *dir, long step) {
    if (step % 16 == 0) snprintf(buf, len, "%.700s/epoch%03ld.ckpt", dir, step / 16);
    else snprintf(buf, len, "%.700s/step%08ld.ckpt", dir, step);
}

/* The shell around a run ($run, logging to $D/$R.log) that a test signals: the wait until the run has
 * saved once (so it is training), then the signal; and the end — its exit status, or a SIGKILL after
 * 60 s (a signal that stopped nothing) — as "exit N". */
#define SIGNAL_STARTED "while ! grep -qs 'saved checkpoint' $D/$R.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
static const char *signal_ended(void) {
    static char ended[256];
    snprintf(ended, sizeof ended, "i=0; while kill -0 $run 2>/dev/null && [ $i -lt %d ]; do sleep 0.1; i=$((i+1)); "
             "done; kill -9 $run 2>/dev/null; wait $run; echo \"exit $?\"; ", (int)(600 * test_time_scale()));
    return ended;
}

/* With --save, Ctrl-C or a scheduler's SIGTERM stops the run at a step boundary (stop.h) instead of
 * losing what it trained since its last checkpoint: rank 0 saves that step, the run exits 128 + the
 * signal (so `./stage1 … && next` does not go on) and names the checkpoint to resume. Resumed, it ends
 * bit for bit where a run that was never stopped ends. A second signal stops it at once, unsaved. In a
 * job the ranks agree on the step first: a Ctrl-C to the launcher's process group (what a terminal
 * sends) reaches the launcher alone, which passes it on once — had the workers got the terminal's
 * too, the launcher's would have been their second — and a SIGTERM to one worker stops every rank. */
START_TEST(a_signal_stops_at_a_step_and_saves_it) {
    char *dir = test_tmpdir(), cmd[4096], args[2048], path[800], fresh[800], *out;
    const char *s1 = TINY " --train-size 512 --batch-size 32 --epochs 1000"; /* 16 steps an epoch */
    const char *started = SIGNAL_STARTED, *ended = signal_ended();
    snprintf(cmd, sizeof cmd, "D=%s; R=a; env --default-signal=INT %s/stage1 %s --save $D/a > $D/a.log 2>&1 & run=$!; %s"
             "kill -INT $run; %s cat $D/a.log", dir, test_root(), s1, started, ended);
    test_run(cmd, &out);
    long step = 0;
    const char *at = strstr(out, "stopped early by SIGINT after step ");
    ck_assert_msg(at && sscanf(at, "stopped early by SIGINT after step %ld of", &step) == 1 && step > 16,
                  "no clean stop:\n%s", out);
    snprintf(path, sizeof path, "%s/a", dir);
    final_checkpoint(fresh, sizeof fresh, path, step);
    snprintf(path, sizeof path, "continue with --resume %.700s", fresh);
    ck_assert_msg(strstr(out, "exit 130") && strstr(out, "SIGINT — stopping after this step") && strstr(out, path) &&
                  strstr(out, "summary:"), "%s", out);
    ck_assert_msg(access(fresh, F_OK) == 0, "%s was not saved:\n%s", fresh, out);
    free(out);
    /* resumed for 5 more steps, it ends where a run of those steps that was never stopped ends */
    snprintf(args, sizeof args, "%s --steps %ld --resume %s --save %s/a", s1, step + 5, fresh, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --steps %ld --save %s/b", s1, step + 5, dir);
    run_ok("stage1", args);
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/a", dir), snprintf(b, sizeof b, "%s/b", dir);
    final_checkpoint(path, sizeof path, a, step + 5);
    final_checkpoint(fresh, sizeof fresh, b, step + 5);
    snprintf(cmd, sizeof cmd, "cmp %s %s", path, fresh);
    ck_assert_msg(test_run(cmd, &out) == 0, "stopped and resumed differs from never stopped: %s", out);
    free(out);

    /* a second signal: at once, unsaved (both arrive together while the run is stopped) */
    snprintf(cmd, sizeof cmd, "D=%s; R=c; env --default-signal=INT %s/stage1 %s --save $D/c > $D/c.log 2>&1 & run=$!; %s"
             "kill -STOP $run; kill -INT $run; kill -TERM $run; kill -CONT $run; %s cat $D/c.log", dir, test_root(), s1,
             started, ended);
    test_run(cmd, &out);
    ck_assert_msg((strstr(out, "exit 130") || strstr(out, "exit 143")) && !strstr(out, "stopped early") &&
                  !strstr(out, "summary:"), "two signals did not stop it at once:\n%s", out);
    free(out);

    /* one that arrives while an epoch's checkpoint is being written (STAGE3_SAVE_DELAY_MS holds the write
     * open; stage 3 as one process decides alone): the run stops at that checkpoint, not a step later */
    snprintf(cmd, sizeof cmd, "D=%s; R=sv; STAGE3_SAVE_DELAY_MS=%d %s/stage3 %s --nproc-per-node 1 --master-port %d "
             "--save $D/sv > $D/sv.log 2>&1 & run=$!; "
             "while ! grep -qs '^epoch 1/' $D/sv.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; sleep 0.3; "
             "kill -TERM $run; %s cat $D/sv.log", dir, (int)(1500 * test_time_scale()), test_root(), s1,
             test_free_port(), ended);
    test_run(cmd, &out);
    snprintf(path, sizeof path, "stopped early by SIGTERM after step 16 of 16000: continue with --resume %s/sv/epoch001.ckpt",
             dir);
    ck_assert_msg(strstr(out, path) && strstr(out, "exit 143") && !strstr(out, "step00000017"),
                  "a signal during the save must stop the run at that checkpoint:\n%s", out);
    free(out);

    /* a job: the terminal's Ctrl-C to the launcher's process group (setsid makes it a group's leader) */
    const char *s3 = TINY " --train-size 512 --batch-size 16 --epochs 1000 --nproc-per-node 2 --log-every 4";
    /* …and a SIGTERM to the launcher while rank 0 writes epoch 1's checkpoint: the ranks vote once more
     * after the save, and stop at it — not at the next step where they compare notes (step 20) */
    snprintf(cmd, sizeof cmd, "D=%s; R=sj; STAGE3_SAVE_DELAY_MS=%d %s/stage3 %s --master-port %d --save $D/sj > $D/sj.log "
             "2>&1 & run=$!; "
             "while ! grep -qs '^epoch 1/' $D/sj.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; sleep 0.3; "
             "kill -TERM $run; %s cat $D/sj.log", dir, (int)(1500 * test_time_scale()), test_root(), s3,
             test_free_port(), ended);
    test_run(cmd, &out);
    /* (rank 1 may have voted before the signal reached it: it waits in the sum while rank 0 saves) */
    snprintf(path, sizeof path, "ranks) after step 16 of 16000: continue with --resume %s/sj/epoch001.ckpt", dir);
    ck_assert_msg(strstr(out, path) && strstr(out, "stopped early by SIGTERM (received by ") && strstr(out, "exit 143") &&
                      !strstr(out, "step00000020"),
                  "a signal during a job's save must stop it at that checkpoint:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "D=%s; R=d; env --default-signal=INT setsid %s/stage3 %s --master-port %d --save $D/d > $D/d.log 2>&1 & "
             "run=$!; %s kill -INT -$run; %s cat $D/d.log", dir, test_root(), s3, test_free_port(), started, ended);
    test_run(cmd, &out);
    at = strstr(out, "stopped early by SIGINT (received by 2 of 2 ranks) after step ");
    ck_assert_msg(at && sscanf(at, "stopped early by SIGINT (received by 2 of 2 ranks) after step %ld", &step) == 1 &&
                  step % 4 == 0 && strstr(out, "exit 130") &&
                  strstr(out, "stage3: interrupted by SIGINT: every worker stopped after the same step") &&
                  strstr(out, "the 2 ranks stop after the next step where they compare notes"), "%s", out);
    snprintf(path, sizeof path, "%s/d", dir);
    final_checkpoint(fresh, sizeof fresh, path, step);
    ck_assert_msg(access(fresh, F_OK) == 0, "%s was not saved:\n%s", fresh, out);
    free(out);
    snprintf(args, sizeof args, "%s --steps %ld --resume %s --save %s/d", s3, step + 2, fresh, dir);
    run_ok("stage3", args);

    /* SIGTERM to one worker only (as a scheduler might): every rank stops at the same step */
    snprintf(cmd, sizeof cmd, "D=%s; R=e; %s/stage3 %s --master-port %d --save $D/e > $D/e.log 2>&1 & run=$!; %s"
             "for w in $(cat /proc/$run/task/$run/children); do :; done; kill -TERM $w; %s cat $D/e.log", dir, test_root(), s3,
             test_free_port(), started, ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "stopped early by SIGTERM (received by 1 of 2 ranks) after step ") &&
                  strstr(out, "exit 143") && strstr(out, "every worker stopped early for a SIGTERM") &&
                  !strstr(out, "job failed"), "%s", out);
    free(out);

    /* SIGQUIT (Ctrl-\\) to the launcher, which torchrun's agent also handles: passed on as a SIGTERM,
     * every rank stops at the same step and rank 0 saves it (a script's `cmd &` ignores SIGQUIT, as
     * SIGINT: env restores it) */
    snprintf(cmd, sizeof cmd, "D=%s; R=q; env --default-signal=QUIT %s/stage3 %s --master-port %d --save $D/q > $D/q.log "
             "2>&1 & run=$!; %s"
             "kill -QUIT $run; %s cat $D/q.log", dir, test_root(), s3, test_free_port(), started, ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "stopped early by SIGTERM (received by 2 of 2 ranks) after step ") &&
                  strstr(out, "exit 131") && strstr(out, "interrupted by SIGQUIT: every worker stopped after the same step") &&
                  !strstr(out, "job failed"), "%s", out);
    free(out);

    /* the same SIGTERM twice from one process, the second after the launcher passed the first on (GNU
     * timeout sends its signal to the launcher, then to the launcher's process group): one request —
     * every rank stops at the same step and rank 0 saves it; the second copy used to stop the job at
     * once, unsaved */
    snprintf(cmd, sizeof cmd, "D=%s; R=t; %s/stage3 %s --master-port %d --save $D/t > $D/t.log 2>&1 & run=$!; %s"
             "kill -TERM $run; while ! grep -qs 'SIGTERM —' $D/t.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "kill -TERM $run; %s cat $D/t.log", dir, test_root(), s3, test_free_port(), started, ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "stopped early by SIGTERM (received by 2 of 2 ranks) after step ") &&
                      strstr(out, "exit 143") &&
                      strstr(out, "interrupted by SIGTERM: every worker stopped after the same step") &&
                      !strstr(out, "job failed"),
                  "one SIGTERM sent twice did not stop the job cleanly:\n%s", out);
    free(out);

    /* at the run's last step there is nothing to stop: the run finishes, exit 0 */
    snprintf(cmd, sizeof cmd, "D=%s; R=f; env --default-signal=INT %s/stage1 " TINY " --train-size 512 --batch-size 32 "
             "--steps 20 --log-every 1 --save $D/f > $D/f.log 2>&1 & run=$!; "
             "while ! grep -qs 'step     19 ' $D/f.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "kill -INT $run; %s cat $D/f.log", dir, test_root(), ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "exit 0") && strstr(out, "summary: 20 steps") && !strstr(out, "stopped early"), "%s", out);
    free(out);

    /* a failure of its own while the job is on its way to a clean stop is reported as the failure */
    snprintf(cmd, sizeof cmd, "D=%s; R=g; STAGE3_FAIL_AT=1:60 env --default-signal=INT setsid %s/stage3 " TINY
             " --train-size 4096 --batch-size 16 --epochs 1000 --nproc-per-node 2 --log-every 1000 --master-port %d "
             "--save $D/g > $D/g.log 2>&1 & run=$!; "
             "while ! grep -qs 'buckets rebuilt' $D/g.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "kill -INT -$run; %s cat $D/g.log", dir, test_root(), test_free_port(), ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "SIGINT — the 2 ranks stop after") && strstr(out, "exit 3") &&
                  strstr(out, "job failed: rank 1 (local rank 1") && strstr(out, "exited with code 3 at step 60") &&
                  !strstr(out, "interrupted by"), "%s", out);
    free(out);

    /* a scheduler's SIGTERM to every process of the job (Slurm's time limit): each worker gets it twice,
     * from the scheduler and passed on by the launcher, and still stops cleanly, saved */
    snprintf(cmd, sizeof cmd, "D=%s; R=h; %s/stage3 %s --master-port %d --save $D/h > $D/h.log 2>&1 & run=$!; %s"
             "kill -TERM $(cat /proc/$run/task/$run/children) $run; %s cat $D/h.log", dir, test_root(), s3,
             test_free_port(), started, ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "stopped early by SIGTERM (received by 2 of 2 ranks) after step ") &&
                  strstr(out, "exit 143") && strstr(out, "interrupted by SIGTERM: every worker stopped after the same step"),
                  "%s", out);
    free(out);

    /* a worker killed outright (the OOM killer) while the job stops: the job's failure, not an interruption */
    snprintf(cmd, sizeof cmd, "D=%s; R=i; env --default-signal=INT setsid %s/stage3 " TINY
             " --train-size 4096 --batch-size 16 --epochs 1000 --nproc-per-node 2 --log-every 1000 --master-port %d "
             "--save $D/i > $D/i.log 2>&1 & run=$!; "
             "while ! grep -qs 'buckets rebuilt' $D/i.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "kill -INT -$run; while ! grep -qs 'SIGINT — ' $D/i.log && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "for w in $(cat /proc/$run/task/$run/children); do :; done; kill -KILL $w; %s cat $D/i.log",
             dir, test_root(), test_free_port(), ended);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "exit 137") && strstr(out, "job failed: rank 1 (local rank 1") &&
                  strstr(out, "was killed by signal 9 (SIGKILL)") && !strstr(out, "interrupted by"), "%s", out);
    free(out), free(dir);
}
END_TEST

/* Two signals of different kinds in one vote — a Ctrl-C reaching one rank, a scheduler's SIGTERM another,
 * before the ranks next compare notes (the epoch's end: --log-every 1000): the job stops for the SIGTERM
 * (exit 143), which outranks a Ctrl-C (stop_take), whichever rank got which. A stop for the SIGINT
 * (130) would tell a requeueing scheduler that a person interrupted the job. */
START_TEST(a_sigterm_outranks_a_sigint_in_one_vote) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    /* 128 steps an epoch: after the first (its buckets rebuilt) the next vote is seconds away */
    const char *s3 = TINY " --train-size 4096 --batch-size 16 --epochs 1000 --nproc-per-node 2 --log-every 1000";
    snprintf(cmd, sizeof cmd, "D=%s; R=a; env --default-signal=INT %s/stage3 %s --master-port %d --save $D/a > $D/a.log "
             "2>&1 & run=$!; while ! grep -qs 'buckets rebuilt' $D/a.log && kill -0 $run 2>/dev/null; do sleep 0.01; "
             "done; set -- $(cat /proc/$run/task/$run/children); kill -INT $1; kill -TERM $2; %s cat $D/a.log", dir,
             test_root(), s3, test_free_port(), signal_ended());
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "stopped early by SIGTERM (received by 2 of 2 ranks) after step ") &&
                      strstr(out, "exit 143") && strstr(out, "every worker stopped early for a SIGTERM") &&
                      !strstr(out, "job failed"),
                  "a SIGINT and a SIGTERM in one vote did not stop the job for the SIGTERM:\n%s", out);
    free(out), free(dir);
}
END_TEST

/* `./stage1 --save … | tee log`, then Ctrl-C: a terminal sends SIGINT to its whole foreground process
 * group, tee included, which dies of it — and the run's next line met a closed pipe: it died of
 * SIGPIPE, unsaved, just after promising to save the step. Now it carries on without stdout (cli.c),
 * saves, and its last lines — where to resume — come on stderr. In a job the launcher and tee take the
 * Ctrl-C, the ranks the launcher's copy (the last to learn of the stop may meet the closed pipe first). */
START_TEST(a_stop_saves_though_tee_took_the_ctrl_c) {
    char *dir = test_tmpdir(), cmd[4096], path[600], want[600], *out;
    const char *flags[2] = {TINY " --train-size 512 --batch-size 32 --epochs 1000 --log-every 1",
                            TINY " --train-size 512 --batch-size 16 --epochs 1000 --nproc-per-node 2 --log-every 1 "
                                 "--standalone"};
    const char *ended = signal_ended();
    for (int k = 0; k < 2; k++) {
        const int stage = k ? 3 : 1;
        /* the pipeline a terminal would run as its foreground job; the stage's own pid into tN.pid */
        snprintf(path, sizeof path, "%s/t%d.sh", dir, stage);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "sh -c 'echo $$ > %s/t%d.pid; exec \"$0\" \"$@\"' %s/stage%d %s --save %s/t%d 2> %s/t%d.err | tee %s/t%d.log "
                   "> /dev/null\n", dir, stage, test_root(), stage, flags[k], dir, stage, dir, stage, dir, stage);
        fclose(f);
        /* setsid: a process group of its own, which the kill below signals whole, as a terminal does */
        snprintf(cmd, sizeof cmd, "D=%s; R=t%d; env --default-signal=INT setsid sh $D/$R.sh & run=$!; " SIGNAL_STARTED
                 "kill -INT -$run; wait $run; run=$(cat $D/$R.pid); %s cat $D/$R.err", dir, stage, ended);
        test_run(cmd, &out);
        snprintf(want, sizeof want, "continue with --resume %s/t%d/step", dir, stage);
        ck_assert_msg(strstr(out, "SIGINT — ") && strstr(out, "went away with the signal") &&
                          strstr(out, "stopped early by SIGINT") && strstr(out, want) &&
                          !strstr(out, "stopped — the program reading"),
                      "stage%d | tee, Ctrl-C to both: the stop did not save its step:\n%s", stage, out);
        if (k)
            ck_assert_msg(strstr(out, "(received by 2 of 2 ranks)") &&
                              strstr(out, "interrupted by SIGINT: every worker stopped after the same step"),
                          "stage3 | tee: not every rank stopped cleanly:\n%s", out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Every stage's process ends with the code its clean stop promises: 128 + the signal (130 for a
 * SIGINT), not 0, so that `./stageN … && next` does not go on. Stages 1 and 3 are checked above;
 * here stage 2 (one process) and stages 4 and 5 (a launcher and one worker, whose exit code the
 * launcher reads to tell a clean stop from a finished run). */
START_TEST(every_stage_exits_128_plus_the_signal_it_stopped_for) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    const char *stages[] = {"stage2", "stage4 --nproc-per-node 1", "stage5 --nproc-per-node 1"};
    for (int i = 0; i < 3; i++) {
        char port[32] = "";
        if (i) snprintf(port, sizeof port, " --master-port %d", test_free_port());
        snprintf(cmd, sizeof cmd, "D=%s; R=s%d; env --default-signal=INT %s/%s " TINY " --train-size 512 --batch-size 32 "
                 "--epochs 1000%s --save $D/$R > $D/$R.log 2>&1 & run=$!; "
                 SIGNAL_STARTED "kill -INT $run; %s cat $D/$R.log", dir, i, test_root(), stages[i], port,
                 signal_ended());
        test_run(cmd, &out);
        ck_assert_msg(strstr(out, "stopped early by SIGINT") && strstr(out, "exit 130"), "%s:\n%s", stages[i], out);
        free(out);
    }
    free(dir);
}
END_TEST

/* The GradScaler's state rides in the checkpoint (format version 5), as scaler.state_dict() does in
 * PyTorch's recipe: an fp16 run that backed off (a forced overflow at step 2: scale 32768) and was
 * stopped continues at that scale, and ends bit-identical to the uninterrupted run (before, it began
 * again at 65536). Another --growth-interval is refused; a checkpoint without a state (stage 4) and a
 * run without a scaler (bf16) each say what happens to the scale. */
static const char *scale_line(const char *out) {
    const char *s = strstr(out, "GradScaler scale ");
    ck_assert_msg(s, "no scale in:\n%s", out);
    return s;
}

/* Stop an fp16 run after 4 of 8 steps (a forced overflow at step 2: scale 32768, 2 finite steps
 * since) and resume it: the resumed run picks up that state, ends at the uninterrupted run's scale,
 * and — bit for bit — its losses and final checkpoint. dev: the --device flags (and any others). */
static void scaler_resume_is_exact(const char *dir, const char *dev) {
    char args[2048], *out, *whole, t[512];
    snprintf(t, sizeof t, "%s --model tiny --test-size 32 --progress off --deterministic --nproc-per-node 1 "
             "--train-size 128 --batch-size 16 --epochs 1 --log-every 1 --test-inf-step 2 --growth-interval 100", dev);
    snprintf(args, sizeof args, "%s --steps 8 --save %s/w --report %s/whole.jsonl", t, dir, dir);
    ck_assert_int_eq(run("stage5", args, &whole), 0);
    ck_assert_msg(strstr(whole, "GradScaler scale 32768, 1 of 8"), "%s", whole);
    snprintf(args, sizeof args, "%s --steps 4 --save %s/p", t, dir);
    run_ok("stage5", args);
    snprintf(args, sizeof args, "%s --steps 8 --resume %s/p/step00000004.ckpt --save %s/r --report %s/resumed.jsonl",
             t, dir, dir, dir);
    ck_assert_int_eq(run("stage5", args, &out), 0);
    ck_assert_msg(strstr(out, "GradScaler resumed from the checkpoint: scale 32768, 2 finite steps"), "%s", out);
    const char *a = scale_line(whole), *b = scale_line(out);
    ck_assert_msg(!strncmp(a, b, strcspn(a, ",")), "final scale differs:\n%s\n%s", a, b);
    free(out), free(whole);
    expect_continued_exactly(dir, 4, 8);
    char pa[700], pb[700];
    long la, lb;
    snprintf(pa, sizeof pa, "%s/w/epoch001.ckpt", dir);
    snprintf(pb, sizeof pb, "%s/r/epoch001.ckpt", dir);
    char *ca = test_slurp(pa, &la), *cb = test_slurp(pb, &lb);
    ck_assert_msg(ca && cb && la == lb && !memcmp(ca, cb, (size_t)la), "resumed run's final checkpoint differs");
    free(ca), free(cb);
}

START_TEST(fp16_resume_continues_the_scaler) {
    char *dir = test_tmpdir(), args[2048], *adam = test_tmpdir();
    scaler_resume_is_exact(dir, "--device cpu");
    /* with Adam, whose step count (its bias corrections' t) skips the skipped step, on the device */
    scaler_resume_is_exact(adam, "--device cpu --optimizer adam --lr 0.001");
    free(adam);
    /* the state means something only under the settings it grew under */
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 "
             "--growth-interval 50 --resume %s/p/step00000004.ckpt", dir);
    expect_refused("stage5", args, "--growth-interval 100, this run has --growth-interval 50",
                   "resume with --growth-interval 100");
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 "
             "--growth-interval 100 --growth-factor 4 --resume %s/p/step00000004.ckpt", dir);
    expect_refused("stage5", args, "--growth-factor 2, this run has --growth-factor 4",
                   "resume with --growth-factor 2");
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 "
             "--growth-interval 100 --backoff-factor 0.25 --resume %s/p/step00000004.ckpt", dir);
    expect_refused("stage5", args, "--backoff-factor 0.5, this run has --backoff-factor 0.25",
                   "resume with --backoff-factor 0.5");
    /* a run without a scaler leaves the state alone, and says so */
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 --steps 5 "
             "--amp bf16 --resume %s/p/step00000004.ckpt", dir);
    ok_saying("stage5", args, "holds a GradScaler state (scale 32768), which this run does not use", NULL);
    /* stage 3 has no scaler: its checkpoints do not carry the state, and it says so */
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 --steps 5 "
             "--resume %s/p/step00000004.ckpt --save %s/s3", dir, dir);
    ok_saying("stage3", args, "holds a GradScaler state (scale 32768), which stage3 has no use for", NULL);
    /* a resume past --test-inf-step injects nothing, and says so; the skip count is this run's */
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 --steps 6 "
             "--growth-interval 100 --test-inf-step 2 --resume %s/p/step00000004.ckpt", dir);
    ok_saying("stage5", args, "--test-inf-step 2 is at or before step 4, where this run resumes", "0 of 2 optimizer steps since the resume skipped");
    /* a scale backed off to 0 (every step overflowing) is saved, and resumed with a warning */
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 4 --epochs 2 --steps 30 "
             "--init-scale 3e-39 --test-inf-step 1 --save %s/z", dir);
    ok_saying("stage5", args, "GradScaler scale 0, 30 of 30", NULL);
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 4 --epochs 2 --steps 32 "
             "--init-scale 3e-39 --resume %s/z/step00000030.ckpt", dir);
    ok_saying("stage5", args, "resumed from the checkpoint: scale 0", "every step will be skipped");
    /* stage 4 saves none: fp16 starts at --init-scale, as a new GradScaler would */
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 --steps 2 "
             "--accum-steps 1 --save %s/s4", dir);
    run_ok("stage4", args);
    snprintf(args, sizeof args, TINY " --nproc-per-node 1 --train-size 128 --batch-size 16 --epochs 1 --steps 3 "
             "--resume %s/s4/step00000002.ckpt", dir);
    ok_saying("stage5", args, "holds no GradScaler state (saved by a run without one): the scale starts at "
                              "--init-scale 65536", NULL);
    free(dir);
}
END_TEST

/* The same on the GPU (fp16 convolutions in cuDNN, the scaler's state in device memory, the step
 * replayed as CUDA graphs), deterministic algorithms: bit for bit too. */
START_TEST(fp16_resume_continues_the_scaler_on_gpu) {
    if (!test_have_gpu("resume: stage 5 fp16 on the GPU continues the GradScaler bit for bit")) return;
    char *dir = test_tmpdir(), *adam = test_tmpdir();
    scaler_resume_is_exact(dir, "--device cuda");
    scaler_resume_is_exact(adam, "--device cuda --optimizer adam --lr 0.001");
    free(dir), free(adam);
}
END_TEST

/* Adam's state — both moments and its step count — rides in the checkpoint (format version 5; it
 * used to be refused: "--optimizer adam cannot be saved or resumed yet"): 4 + 6 steps equal 10, bit
 * for bit; a checkpoint of one optimizer is refused to the other, naming the flag. */
START_TEST(adam_resume_is_exact) {
    char *dir = test_tmpdir(), args[2048], ck[700];
    const char *t = TINY " --train-size 96 --batch-size 8 --epochs 1 --log-every 1 --optimizer adam --lr 0.001";
    snprintf(args, sizeof args, "%s --steps 10 --report %s/whole.jsonl", t, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --steps 4 --save %s/a", t, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/step00000004.ckpt", dir);
    snprintf(args, sizeof args, "%s --steps 10 --resume %s --report %s/resumed.jsonl", t, ck, dir);
    run_ok("stage1", args);
    expect_continued_exactly(dir, 4, 10);
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --resume %s", ck);
    expect_refused("stage1", args, "trained with --optimizer adam, but this run uses --optimizer sgd",
                   "pass --optimizer adam");
    snprintf(args, sizeof args, TINY " --train-size 96 --batch-size 8 --epochs 1 --steps 2 --save %s/s", dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --resume %s/s/step00000002.ckpt", t, dir);
    expect_refused("stage1", args, "trained with --optimizer sgd", "pass --optimizer sgd");
    free(dir);
}
END_TEST

/* --evaluate (PyTorch examples' --evaluate): the checkpoint's model on the test set, nothing trained
 * and nothing written. It finds what the training run's own evaluation found at that epoch's end —
 * the same loss bit for bit with the same batches, the same count of correct answers with any batch
 * size or number of ranks —, whatever optimizer, world size or stage trained it; and it refuses a
 * flag that only training reads, a missing --resume, and a test set that is not the checkpoint's. */
START_TEST(evaluate_tests_the_checkpoint_and_trains_nothing) {
    char *dir = test_tmpdir(), *cifar = make_cifar(), args[2048], ck[700], rep[700];
    const char *t = TINY " --train-size 80 --batch-size 8";
    snprintf(args, sizeof args, "%s --epochs 1 --save %s/a --report %s/train.jsonl", t, dir, dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/epoch001.ckpt", dir);
    snprintf(rep, sizeof rep, "%s/train.jsonl", dir);
    double acc = test_report_field(rep, "epoch", "test_acc"), loss = test_report_field(rep, "epoch", "test_loss");
    ck_assert_msg(acc > 0 && loss > 0, "no test result in %s", rep);
    struct { const char *stage, *flags; double loss_tol; } same[] = {
        {"stage1", "--batch-size 8", 0},      /* the training run's batches: its very numbers */
        {"stage1", "--batch-size 5", 1e-5},   /* other batches: each sample's loss is the same */
        {"stage2", "--batch-size 8", 1e-5},   /* GPU0's replica evaluates */
        {"stage3", "--nproc-per-node 2", 1e-5}, /* each rank its shard, the sums all-reduced */
        {"stage5", "--amp off --nproc-per-node 2", 1e-5},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        snprintf(rep, sizeof rep, "%s/ev%zu.jsonl", dir, i);
        snprintf(args, sizeof args, TINY " %s --evaluate --resume %s --report %s", same[i].flags, ck, rep);
        ok_saying(same[i].stage, args, "evaluated ", "training nothing");
        double a = test_report_field(rep, "evaluate", "test_acc"), l = test_report_field(rep, "evaluate", "test_loss");
        ck_assert_msg(a == acc && fabs(l - loss) <= same[i].loss_tol * loss, "%s %s: acc %.9g loss %.9g, trained "
                      "run's %.9g %.9g", same[i].stage, same[i].flags, a, l, acc, loss);
        ck_assert_msg(test_report_field(rep, "evaluate", "step") == 10, "%s: step", same[i].stage);
        ck_assert_msg(isnan(test_report_field(rep, "summary", "steps")), "%s: a training summary", same[i].stage);
    }
    snprintf(rep, sizeof rep, "%s/amp.jsonl", dir); /* autocast: a forward in fp16, and no GradScaler */
    snprintf(args, sizeof args, TINY " --evaluate --resume %s --report %s", ck, rep);
    ok_saying("stage5", args, "amp: fp16 autocast (evaluation: no gradients, so no GradScaler)", "evaluated ");
    ck_assert_msg(test_report_field(rep, "amp", "grad_scaler") == 0 && isnan(test_report_field(rep, "amp", "scale")),
                  "stage 5's amp record speaks of a GradScaler in an evaluation");
    /* nothing was written: only the training run's checkpoint is in its directory */
    char *newest = NULL;
    snprintf(rep, sizeof rep, "%s/a", dir);
    ck_assert_int_eq(checkpoint_list(rep, &newest), 1);
    free(newest);
    /* whatever optimizer trained it: an Adam checkpoint without --optimizer adam */
    snprintf(args, sizeof args, "%s --epochs 1 --optimizer adam --lr 0.001 --save %s/adam", t, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, TINY " --evaluate --resume %s/adam/epoch001.ckpt", dir);
    ok_saying("stage1", args, "evaluated ", "the model after epoch 1 (step 10)");
    /* refused: what evaluation cannot use or would ignore */
    snprintf(args, sizeof args, TINY " --evaluate");
    expect_refused("stage1", args, "--evaluate tests a checkpoint's model", "--resume FILE");
    const char *refused[][2] = {{"stage1", "--lr 0.01"}, {"stage1", "--save x"}, {"stage1", "--epochs 2"},
                                {"stage2", "--gil-op-us 3"}, {"stage3", "--bucket-mb 1"},
                                {"stage4", "--accum-steps 2"}, {"stage5", "--grad-comm fp16"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "drop %.*s", (int)strcspn(refused[i][1], " "), refused[i][1]);
        snprintf(args, sizeof args, TINY " --evaluate --resume %s %s", ck, refused[i][1]);
        expect_refused(refused[i][0], args, "applies only to training, and --evaluate trains nothing", flag);
    }
    snprintf(args, sizeof args, TINY " --evaluate --resume %s --seed 3", ck);
    expect_refused("stage1", args, "the synthetic test set is drawn from the seed", "pass --seed 0");
    snprintf(args, sizeof args, TINY " --evaluate --resume %s --data %s", ck, cifar);
    expect_refused("stage1", args, "was trained on synthetic data, and this run would test it on CIFAR-10",
                   "drop --data");
    snprintf(args, sizeof args, TINY " --evaluate --resume %s --gpus 2", ck); /* stage 2 tests on GPU0's replica */
    expect_refused("stage2", args, "--gpus applies only to training", "drop --gpus");
    /* CIFAR-10: the test file is all it reads */
    snprintf(args, sizeof args, "%s --epochs 1 --data %s --save %s/c", t, cifar, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "mkdir %s/testonly && ln -s %s/test_batch.bin %s/testonly/", dir, cifar, dir);
    ck_assert_int_eq(system(args), 0);
    snprintf(args, sizeof args, TINY " --evaluate --resume %s/c/epoch001.ckpt --data %s/testonly", dir, dir);
    ok_saying("stage1", args, "evaluated ", "images of cifar10:test");
    /* the test set is neither shuffled nor augmented (random crops and flips are keyed by the seed):
     * under another --seed, the same images and the same loss */
    double seeded[2];
    for (int k = 0; k < 2; k++) {
        snprintf(rep, sizeof rep, "%s/seed%d.jsonl", dir, k);
        snprintf(args, sizeof args, TINY " --evaluate --resume %s/c/epoch001.ckpt --data %s --seed %d --report %s", dir,
                 cifar, 5 * k, rep);
        ok_saying("stage1", args, "evaluated ", "images of cifar10:test");
        seeded[k] = test_report_field(rep, "evaluate", "test_loss");
    }
    ck_assert_msg(seeded[0] > 0 && seeded[0] == seeded[1], "--seed 0 and 5 test other images: loss %.9g vs %.9g",
                  seeded[0], seeded[1]);
    free(cifar), free(dir);
}
END_TEST

/* --evaluate builds the checkpoint's model (its --model and --norm, unless the flags name them: then
 * they must agree), and takes one trained with --unused-param's extra head into any stage's model —
 * the head is last and no layer uses it, as checkpoint_to_torch.py drops it too. */
START_TEST(evaluate_takes_the_checkpoints_model) {
    char *dir = test_tmpdir(), args[2048], rep[700];
    const char *cpu = "--device cpu --test-size 32 --progress off --deterministic --batch-size 8";
    snprintf(args, sizeof args, "%s --model tiny --norm none --train-size 80 --epochs 1 --save %s/n", cpu, dir);
    run_ok("stage1", args);
    snprintf(args, sizeof args, "%s --evaluate --resume %s/n/epoch001.ckpt", cpu, dir);
    ok_saying("stage1", args, "tiny (norm none)", "evaluated ");
    snprintf(args, sizeof args, "%s --model resnet18 --evaluate --resume %s/n/epoch001.ckpt", cpu, dir);
    expect_refused("stage1", args, "pass --model tiny to evaluate it", "drop --model");
    snprintf(args, sizeof args, "%s --model tiny --norm bn --evaluate --resume %s/n/epoch001.ckpt", cpu, dir);
    expect_refused("stage1", args, "pass --norm none to evaluate it", "drop --norm");
    /* the extra head: trained in stage 3, tested everywhere with the training run's numbers */
    snprintf(args, sizeof args, "%s --model tiny --train-size 80 --epochs 1 --unused-param --find-unused-parameters "
             "--save %s/u --report %s/u.jsonl", cpu, dir, dir);
    run_ok("stage3", args);
    snprintf(rep, sizeof rep, "%s/u.jsonl", dir);
    double acc = test_report_field(rep, "epoch", "test_acc"), loss = test_report_field(rep, "epoch", "test_loss");
    const char *stages[][2] = {{"stage1", ""}, {"stage2", ""}, {"stage3", ""}, {"stage3", "--unused-param"}};
    for (int i = 0; i < 4; i++) {
        snprintf(rep, sizeof rep, "%s/ev%d.jsonl", dir, i);
        snprintf(args, sizeof args, "%s %s --evaluate --resume %s/u/epoch001.ckpt --report %s", cpu, stages[i][1],
                 dir, rep);
        ok_saying(stages[i][0], args, "evaluated ", NULL);
        double a = test_report_field(rep, "evaluate", "test_acc"), l = test_report_field(rep, "evaluate", "test_loss");
        ck_assert_msg(a == acc && fabs(l - loss) <= 1e-5 * loss, "%s %s: acc %.9g loss %.9g, trained run's %.9g %.9g",
                      stages[i][0], stages[i][1], a, l, acc, loss);
    }
    free(dir);
}
END_TEST

/* Writes `bytes` into dir/name with the 8 bytes at `at` replaced by `value` and the checksum recomputed
 * (an edit no checksum catches), and expects checkpoint_to_torch.py to refuse it saying `want`. */
static void converter_refuses_edit(const char *dir, char *bytes, long len, long at, const void *value, const char *name,
                                   const char *want) {
    char bad[720], cmd[4096], *out;
    memcpy(bytes + at, value, 8);
    snprintf(bad, sizeof bad, "%s/%s", dir, name);
    write_resealed(bad, (unsigned char *)bytes, len);
    snprintf(cmd, sizeof cmd, "python3 %s/tests/torch/checkpoint_to_torch.py %s 2>&1", test_root(), bad);
    ck_assert_int_eq(test_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
    free(out);
}

/* tests/torch/checkpoint_to_torch.py reads a checkpoint with Python's standard library alone (so CI
 * checks it): the header it prints is the one checkpoint_load reads, and a damaged or cut file is
 * refused. Where torch is installed (the device machine), the weights go into models.py's twin of
 * the model, and its eval-mode logits, in float64, are this model's — the checkpoint is a PyTorch
 * state_dict, as the article's rank 0 saves one. */
START_TEST(a_checkpoint_is_a_pytorch_model) {
    static int have_python = -1, have_torch = -1;
    if (have_python < 0) have_python = system("python3 -c 'import struct, array' >/dev/null 2>&1") == 0;
    if (!have_python) {
        printf("SKIP: resume: checkpoint_to_torch.py — python3 is missing\n");
        return;
    }
    char *dir = test_tmpdir(), args[2048], ck[700], cmd[4096], *out;
    snprintf(args, sizeof args, TINY " --train-size 80 --batch-size 8 --epochs 1 --steps 7 --save %s/a", dir);
    run_ok("stage1", args);
    snprintf(ck, sizeof ck, "%s/a/step00000007.ckpt", dir);
    Device cpu = {0};
    device_init(&cpu, DEV_CPU, 0, 0);
    enum { N = 6 };
    Model *m = model_create(&cpu, "tiny", 1, N, 0);
    CheckpointMeta expect = {0}, got;
    snprintf(expect.arch, sizeof expect.arch, "tiny");
    snprintf(expect.norm, sizeof expect.norm, "bn");
    expect.n_params = m->n_param_floats, expect.n_buffers = m->n_buffer_floats, expect.shape_hash = m->shape_hash;
    size_t pb = (size_t)m->n_param_floats * sizeof(float);
    float *p = malloc(pb), *mom = malloc(pb), *buf = malloc((size_t)m->n_buffer_floats * sizeof(float));
    checkpoint_load(ck, &expect, &got, p, buf, mom, NULL);
    char want[300];
    snprintf(want, sizeof want, "format 9, checksum ok | tiny (norm bn), %lld parameters, %lld buffer values | step 7, "
             "after batch 7 of epoch 1 | trained by 1 rank(s), batch 8, sgd, synthetic data, seed 0",
             (long long)m->n_param_floats, (long long)m->n_buffer_floats);
    snprintf(cmd, sizeof cmd, "python3 %s/tests/torch/checkpoint_to_torch.py %s 2>&1", test_root(), ck);
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
    free(out);
    /* damaged: one flipped byte in the weights; cut: the last 100 bytes gone */
    long len;
    char *bytes = test_slurp(ck, &len), bad[720];
    const char *what[2] = {"checksum mismatch", "is truncated"};
    for (int k = 0; k < 2; k++) {
        snprintf(bad, sizeof bad, "%s/bad%d.ckpt", dir, k);
        FILE *f = fopen(bad, "wb");
        if (k == 0) bytes[1000] ^= 1;
        fwrite(bytes, 1, (size_t)(k == 0 ? len : len - 100), f);
        fclose(f);
        if (k == 0) bytes[1000] ^= 1;
        snprintf(cmd, sizeof cmd, "python3 %s/tests/torch/checkpoint_to_torch.py %s 2>&1", test_root(), bad);
        ck_assert_int_eq(test_run(cmd, &out), 1);
        ck_assert_msg(strstr(out, what[k]), "want '%s' in:\n%s", what[k], out);
        free(out);
    }
    /* hand-made: a world size of 0, its checksum recomputed — refused as checkpoint_load refuses it */
    int64_t zero = 0, one = 1;
    double momentum = 1.5;
    converter_refuses_edit(dir, bytes, len, 120, &zero, "world0.ckpt", "is corrupt: impossible world_size 0 in its header");
    memcpy(bytes + 120, &one, 8);
    /* …and a momentum no --momentum gives (format 8's hyperparameters, after the warm-up) */
    double mom_ok; /* the run's, put back after */
    memcpy(&mom_ok, bytes + 272, 8);
    converter_refuses_edit(dir, bytes, len, 272, &momentum, "momentum.ckpt",
                           "is corrupt: impossible momentum 1.5 in its header");
    memcpy(bytes + 272, &mom_ok, 8);
    /* a NaN weight, then a NaN running statistic (a double NaN's high half is a float NaN), checksum
     * recomputed: refused as --evaluate refuses it, where it converted to a model of NaN outputs */
    uint32_t hsize;
    memcpy(&hsize, bytes + 12, 4);
    const double nan_ = NAN;
    char *keep = malloc((size_t)len);
    memcpy(keep, bytes, (size_t)len);
    converter_refuses_edit(dir, bytes, len, hsize + 40, &nan_, "nan_param.ckpt",
                           "cannot be used: the parameters are not finite (NaN or inf) — the run that saved it had diverged");
    memcpy(bytes, keep, (size_t)len);
    converter_refuses_edit(dir, bytes, len, hsize + 4 * (long)m->n_param_floats, &nan_, "nan_buffer.ckpt",
                           "cannot be used: the batch-norm running statistics are not finite");
    free(keep);
    free(bytes);
    snprintf(bad, sizeof bad, "%s/fifo", dir); /* a FIFO would block a plain read forever */
    ck_assert_int_eq(mkfifo(bad, 0600), 0);
    snprintf(cmd, sizeof cmd, "timeout 20 python3 %s/tests/torch/checkpoint_to_torch.py %s 2>&1", test_root(), bad);
    ck_assert_int_eq(test_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "is not a regular file"), "%s", out);
    free(out);
    /* outputs named wrong: refused before any work, torch or not — torch.save over the checkpoint itself
     * destroyed it, and a missing folder or --logits IN failed with a traceback after the conversion */
    const char *outs[][2] = {{"--out %s", "is the checkpoint itself"},
                             {"--logits %s/nope.f32 x.f32", "is not a file"},
                             {"--out %s/no/model.pt", "mkdir -p"},
                             {"--out %s/a", "is a directory"},
                             {"--out %s/a/step00000007.ckpt", "is the checkpoint itself"},
                             {"--out %s/a/../a/step00000007.ckpt", "is the checkpoint itself"},
                             {"--logits %s/a/step00000007.ckpt %s", "is a checkpoint written by --save"},
                             /* a folder's name (abspath drops the '/') and an empty value (an unset $VAR): they
                              * passed, and torch.save failed after the conversion, or '--out ""' converted nothing
                              * and exited 0 */
                             {"--out %s/models/", "ends in '/', a directory's name"},
                             {"--out %s/a/step00000007.ckpt/", "is a file, not a directory"},
                             {"--out ''", "--out got an empty value"},
                             {"--logits %s/a/step00000007.ckpt ''", "--logits OUT got an empty value"}};
    char other[720];
    snprintf(other, sizeof other, "%s/other.ckpt", dir); /* another checkpoint: as precious */
    snprintf(cmd, sizeof cmd, "cp %s %s", ck, other);
    ck_assert_int_eq(system(cmd), 0);
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        char flags[800];
        snprintf(flags, sizeof flags, outs[i][0], i ? dir : ck, other);
        snprintf(cmd, sizeof cmd, "python3 %s/tests/torch/checkpoint_to_torch.py %s %s 2>&1", test_root(), ck, flags);
        ck_assert_int_eq(test_run(cmd, &out), 2);
        ck_assert_msg(strstr(out, outs[i][1]) && !strstr(out, "Traceback"), "%s: want '%s' in:\n%s", flags,
                      outs[i][1], out);
        free(out);
    }
    checkpoint_load(ck, &expect, &got, p, buf, mom, NULL); /* still whole */
    if (have_torch < 0) have_torch = system("python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (!have_torch) {
        printf("SKIP: resume: the checkpoint as a PyTorch model (its logits against models.py's) — needs torch "
               "(python3 -c 'import torch')\n");
    } else {
        /* this model's eval-mode logits on N inputs, then torch's from the converted checkpoint */
        model_write_oihw(m, p, m->param_flat);
        device_copy_h2d(&cpu, m->buffer_flat, buf, (size_t)m->n_buffer_floats * sizeof(float));
        float *x = malloc(N * 3 * 32 * 32 * sizeof(float)), theirs[N * 10];
        test_fill_uniform(x, N * 3 * 32 * 32, 7, -2.0f, 2.0f);
        model_forward(m, N, x, 0);
        const float *ours = model_logits(m);
        char in[720], lo[720], pt[720];
        snprintf(in, sizeof in, "%s/x.f32", dir), snprintf(lo, sizeof lo, "%s/logits.f32", dir);
        snprintf(pt, sizeof pt, "%s/model.pt", dir);
        FILE *f = fopen(in, "wb");
        ck_assert_int_eq(fwrite(x, sizeof(float), N * 3 * 32 * 32, f), N * 3 * 32 * 32);
        fclose(f);
        snprintf(cmd, sizeof cmd, "python3 %s/tests/torch/checkpoint_to_torch.py %s --out %s --logits %s %s 2>&1",
                 test_root(), ck, pt, in, lo);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 0 && strstr(out, "saved "), "exit %d:\n%s", rc, out);
        free(out);
        f = fopen(lo, "rb");
        ck_assert_msg(f && fread(theirs, sizeof(float), N * 10, f) == N * 10, "%s: not %d logits", lo, N * 10);
        fclose(f);
        double err = test_rel_err(ours, theirs, N * 10);
        ck_assert_msg(err < 1e-5, "logits differ from torch's: relative error %.3g", err);
        struct stat st;
        ck_assert_msg(stat(pt, &st) == 0 && st.st_size > (off_t)pb, "%s: no state_dict saved", pt);
        free(x);
    }
    free(p), free(mom), free(buf);
    model_destroy(m);
    device_destroy(&cpu);
    free(dir);
}
END_TEST

Suite *suite_resume(void) {
    Suite *s = suite_create("resume");
    TCase *tc = tcase_create("resume");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, resume_under_other_flags_is_refused_or_exact);
    tcase_add_test(tc, a_resumed_run_continues_its_report);
    tcase_add_test(tc, another_split_of_the_same_samples_continues);
    tcase_add_test(tc, resume_at_an_epoch_end_regroups);
    tcase_add_test(tc, warmup_follows_torch_and_resumes_exactly);
    tcase_add_test(tc, resume_under_other_sampler_flags_is_refused_or_exact);
    tcase_add_test(tc, version2_checkpoint_resumes_with_a_note);
    tcase_add_test(tc, a_checkpoint_whose_step_and_position_disagree_is_refused);
    tcase_add_test(tc, resume_under_other_optimizer_flags_says_so);
    tcase_add_test(tc, a_checkpoint_holding_nan_is_refused_at_once);
    tcase_add_test(tc, fifos_full_disks_and_bad_save_dirs_fail_at_once);
    tcase_add_test(tc, resume_on_other_data_is_refused);
    tcase_add_test(tc, resume_on_other_images_of_the_same_size_is_refused);
    tcase_add_test(tc, report_or_trace_on_the_checkpoint_is_refused);
    tcase_add_test(tc, another_users_report_file_is_named);
    tcase_add_test(tc, save_into_another_runs_checkpoints_is_refused);
    tcase_add_test(tc, two_runs_saving_into_one_directory);
    tcase_add_test(tc, a_signal_stops_at_a_step_and_saves_it);
    tcase_add_test(tc, a_sigterm_outranks_a_sigint_in_one_vote);
    tcase_add_test(tc, a_stop_saves_though_tee_took_the_ctrl_c);
    tcase_add_test(tc, every_stage_exits_128_plus_the_signal_it_stopped_for);
    tcase_add_test(tc, resume_in_the_wrong_stage_names_the_right_one);
    tcase_add_test(tc, a_refused_resume_is_reported_once_per_job);
    tcase_add_test(tc, fp16_resume_continues_the_scaler);
    tcase_add_test(tc, fp16_resume_continues_the_scaler_on_gpu);
    tcase_add_test(tc, adam_resume_is_exact);
    tcase_add_test(tc, evaluate_tests_the_checkpoint_and_trains_nothing);
    tcase_add_test(tc, evaluate_takes_the_checkpoints_model);
    tcase_add_test(tc, a_checkpoint_is_a_pytorch_model);
    suite_add_tcase(s, tc);
    TCase *cut = tcase_create("resumed_report"); /* its own case: CK_RUN_CASE=resumed_report */
    tcase_set_timeout(cut, 300);
    tcase_add_test(cut, a_report_past_its_checkpoint_is_cut_back_on_resume);
    tcase_add_test(cut, a_report_continues_from_another_directory_or_a_moved_one);
    tcase_add_test(cut, a_refused_resume_leaves_no_record_in_the_report);
    tcase_add_test(cut, a_resume_killed_before_saving_is_superseded_by_the_next);
    suite_add_tcase(s, cut);
    TCase *keep = tcase_create("regrouped_save_dir"); /* its own case: CK_RUN_CASE=regrouped_save_dir */
    tcase_set_timeout(keep, 300);
    tcase_add_test(keep, keep_last_leaves_the_line_a_regrouped_resume_came_from);
    tcase_add_test(keep, a_regrouped_resume_names_an_earlier_step_file_so);
    tcase_add_test(keep, an_adam_regrouped_resume_saves_a_checkpoint_that_resumes);
    suite_add_tcase(s, keep);
    return s;
}
