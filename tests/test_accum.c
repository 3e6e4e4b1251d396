/* test_accum.c — stage 4: gradient accumulation under DDP, end to end on the CPU (GPU variants when
 * GPUs are visible).
 *
 * What it promises, and how each test checks it:
 * - K micro-batches of B on R ranks ≡ one device at batch R·K·B (BN-free, --deterministic): the
 *   per-optimizer-step losses and the final parameters, against ./stage1, to 1e-5. The R ranks'
 *   k-th groups together hold exactly stage 1's k-th batch (the same argument as test_ddp.c's
 *   sharded_batches_union_is_global_batch, with K·B in place of B). A trailing partial group of J
 *   whole micro-batches is scaled by 1/K, as the PyTorch idiom does, so its update is J/K of stage
 *   1's last one: with plain SGD (momentum 0, no weight decay) the final parameters must be
 *   p_prev + (J/K)·(p_stage1 − p_prev), p_prev being stage 1's parameters before its last step.
 * - --sync-each-micro-step (no no_sync) gives the same parameters with exactly K× the all-reduce
 *   calls and bytes.
 * - --accum-steps 1 is stage 3, bit for bit (losses and checkpoint bytes).
 * - The buffer broadcasts and gradient all-reduces per optimizer step are PyTorch's
 *   (tests/fixtures/ddp_nosync.txt, made by tests/torch/ddp_nosync_fixture.py).
 * - A resume at an optimizer-step boundary continues bit-identically; a resume with another K is
 *   refused. Bad --accum-steps values are refused with one line; K beyond an epoch works. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"

#include "tests.h"

#define LIMIT "timeout -k 5 300 "
#define TINY "--device cpu --model tiny --deterministic --progress off --log-every 1 --workers 1"

/* ---- accumulation ≡ one device at the K× batch ----------------------------------------------- */

/* R ranks × K micro-batches of B against stage 1 at batch R·K·B, one epoch of `groups` optimizer
 * steps whose last holds J ≤ K micro-batches (J = K: no partial group). */
static void check_equivalence(int world, int K, int B, int groups, int J, const char *opt, const char *what) {
    char *dir = test_tmpdir(), cmd[4096], common[1024], pa[600], pb[600];
    int n = world * B * ((groups - 1) * K + J), big = world * K * B;
    snprintf(common, sizeof common, TINY " --norm none --train-size %d --test-size 67 --epochs 1 --lr 0.05 %s", n, opt);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --batch-size %d --save %s/one --report %s/one.jsonl", test_root(),
             common, big, dir, dir);
    test_run_ok(cmd, what, NULL);
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage4 %s --nproc-per-node %d --batch-size %d --accum-steps %d --master-port %d --save %s/acc "
                   "--report %s/acc.jsonl",
             test_root(), common, world, B, K, test_free_port(), dir, dir);
    test_run_ok(cmd, what, NULL);
    double a[64], b[64];
    snprintf(pa, sizeof pa, "%s/one.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/acc.jsonl", dir);
    ck_assert_int_eq(test_read_losses(pa, a, 64), groups);
    ck_assert_int_eq(test_read_losses(pb, b, 64), groups); /* one logged loss per optimizer step */
    for (int i = 0; i < groups; i++)
        ck_assert_msg(fabs(a[i] - b[i]) <= 1e-5 * fabs(a[i]), "%s: step %d loss %.9g (stage 1) vs %.9g (stage 4)", what,
                      i + 1, a[i], b[i]);
    ck_assert_int_eq((int)test_report_field(pb, "summary", "optimizer_steps"), groups);
    ck_assert_int_eq((int)test_report_field(pb, "summary", "micro_steps"), (groups - 1) * K + J);
    /* the epoch's training loss: every micro-batch's loss counts whole (it is divided by K for the
     * gradient only), so it is stage 1's mean over the same samples, a partial last group included */
    double ta = test_report_field(pa, "epoch", "train_loss"), tb = test_report_field(pb, "epoch", "train_loss");
    ck_assert_msg(fabs(ta - tb) <= 1e-5 * fabs(ta), "%s: epoch train loss %.9g (stage 1) vs %.9g", what, ta, tb);
    int64_t np = test_n_params("tiny");
    snprintf(pa, sizeof pa, "%s/one/epoch001.ckpt", dir);
    snprintf(pb, sizeof pb, "%s/acc/epoch001.ckpt", dir);
    float *one = test_load_params(pa, "tiny", 0), *acc = test_load_params(pb, "tiny", 0);
    if (J == K) {
        double err = test_rel_err(acc, one, np);
        ck_assert_msg(err <= 1e-5, "%s: final parameters differ by %.3g (relative)", what, err);
        /* and the evaluation: every rank its shard of the 67 test images (padding not counted) */
        snprintf(pa, sizeof pa, "%s/one.jsonl", dir);
        snprintf(pb, sizeof pb, "%s/acc.jsonl", dir);
        double la = test_report_field(pa, "epoch", "test_loss"), lb = test_report_field(pb, "epoch", "test_loss");
        double ca = test_report_field(pa, "epoch", "test_acc"), cb = test_report_field(pb, "epoch", "test_acc");
        ck_assert_msg(fabs(la - lb) <= 1e-5 * fabs(la), "%s: test loss %.9g (stage 1) vs %.9g", what, la, lb);
        ck_assert_msg(fabs(ca - cb) <= 1.01 / 67, "%s: test accuracy %.6f (stage 1) vs %.6f", what, ca, cb);
    } else {
        /* stage 1's parameters before its last step */
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --batch-size %d --steps %d --save %s/prev", test_root(), common,
                 big, groups - 1, dir);
        test_run_ok(cmd, what, NULL);
        snprintf(pa, sizeof pa, "%s/prev/step%08d.ckpt", dir, groups - 1);
        float *prev = test_load_params(pa, "tiny", 0), *expect = malloc((size_t)np * sizeof(float));
        for (int64_t i = 0; i < np; i++) expect[i] = prev[i] + (float)J / (float)K * (one[i] - prev[i]);
        double err = test_rel_err(acc, expect, np), moved = test_rel_err(one, prev, np);
        ck_assert_msg(moved > 1e-4, "%s: stage 1's last step did not move the parameters (%.3g)", what, moved);
        ck_assert_msg(err <= 1e-5, "%s: after the partial group (%d of %d micro-batches) the parameters are %.3g "
                      "(relative) from p_prev + %d/%d·(p_stage1 − p_prev)", what, J, K, err, J, K);
        free(prev), free(expect);
    }
    free(one), free(acc), free(dir);
}

#define PLAIN_SGD "--momentum 0 --weight-decay 0"

START_TEST(accum_one_worker_matches_one_device) {
    check_equivalence(1, 1, 8, 3, 1, "", "1 worker, K=1");
    check_equivalence(1, 2, 8, 3, 1, PLAIN_SGD, "1 worker, K=2, partial group of 1");
    check_equivalence(1, 3, 8, 3, 2, PLAIN_SGD, "1 worker, K=3, partial group of 2");
}
END_TEST

START_TEST(accum_two_workers_match_one_device) {
    check_equivalence(2, 1, 8, 3, 1, "", "2 workers, K=1");
    check_equivalence(2, 2, 8, 3, 1, PLAIN_SGD, "2 workers, K=2, partial group of 1");
    check_equivalence(2, 3, 8, 3, 2, PLAIN_SGD, "2 workers, K=3, partial group of 2");
    check_equivalence(2, 3, 8, 2, 3, "", "2 workers, K=3, momentum and weight decay, whole groups");
}
END_TEST

/* ---- forgetting no_sync --------------------------------------------------------------------------- */

START_TEST(sync_each_micro_step_same_params_k_times_the_calls) {
    const char *stages[] = {"stage4", "stage5 --amp off"}; /* stage 5 has its own loop, and the flag too */
    for (int st = 0; st < 2; st++) {
        char *dir = test_tmpdir(), cmd[2048], path[600];
        const int K = 3, B = 4, R = 2, steps = 8;
        const char *mode[2] = {"", "--sync-each-micro-step"};
        double calls[2], bytes[2], micro[2], opt[2];
        for (int i = 0; i < 2; i++) {
            snprintf(cmd, sizeof cmd,
                     LIMIT "%s/%s " TINY " --norm none --train-size %d --test-size 16 --epochs 1 --lr 0.05 "
                           "--nproc-per-node %d --batch-size %d --accum-steps %d %s --master-port %d --save %s/r%d "
                           "--report %s/r%d.jsonl",
                     test_root(), stages[st], R * K * B * steps, R, B, K, mode[i], test_free_port(), dir, i, dir, i);
            char *out;
            test_run_ok(cmd, mode[i], &out);
            ck_assert_msg(strstr(out, "effective batch 24"), "the header names the effective batch K × B × R:\n%s",
                          out);
            /* The buckets are rebuilt after the first synchronised backward: step 1's last micro-step,
             * or with every micro-step synchronised its first, while step 1 is still accumulating. */
            const char *rebuilt = i ? "ddp: during step 1, after its first micro-step, buckets rebuilt"
                                    : "ddp: after step 1, buckets rebuilt";
            ck_assert_msg(strstr(out, rebuilt), "%s %s: not '%s':\n%s", stages[st], mode[i], rebuilt, out);
            free(out);
            snprintf(path, sizeof path, "%s/r%d.jsonl", dir, i);
            calls[i] = test_report_field(path, "summary", "allreduce_calls");
            bytes[i] = test_report_field(path, "summary", "allreduce_bytes");
            micro[i] = test_report_field(path, "summary", "micro_steps");
            opt[i] = test_report_field(path, "summary", "optimizer_steps");
            ck_assert_int_eq((int)micro[i], K * steps);
            ck_assert_int_eq((int)opt[i], steps);
            /* images per second count every micro-batch: K × B × R images per optimizer step */
            double ms = test_report_field(path, "summary", "ms_per_iter_median");
            double ips = test_report_field(path, "summary", "img_per_s");
            ck_assert_msg(ms > 0 && fabs(ips - 1e3 * K * B * R / ms) <= 1e-6 * ips, "img/s %.6g at %.6g ms per step",
                          ips, ms);
        }
        ck_assert_int_eq((int)calls[0], steps); /* one bucket (tiny), once per optimizer step */
        ck_assert_msg((int)calls[1] == K * steps, "%s --sync-each-micro-step: %g all-reduces, not %d", stages[st],
                      calls[1], K * steps);
        ck_assert_msg(bytes[1] == K * bytes[0] && bytes[0] == steps * 4.0 * test_n_params("tiny"),
                      "all-reduce bytes %.0f (no_sync) and %.0f (each micro-step)", bytes[0], bytes[1]);
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/r0/epoch001.ckpt", dir);
        snprintf(pb, sizeof pb, "%s/r1/epoch001.ckpt", dir);
        float *a = test_load_params(pa, "tiny", 0), *b = test_load_params(pb, "tiny", 0);
        double err = test_rel_err(b, a, test_n_params("tiny"));
        ck_assert_msg(err <= 1e-5, "--sync-each-micro-step moved the parameters by %.3g (relative)", err);
        free(a), free(b), free(dir);
    }
}
END_TEST

/* ---- K = 1 is stage 3 ------------------------------------------------------------------------------- */

START_TEST(accum_one_is_stage3_bit_for_bit) {
    char *dir = test_tmpdir(), cmd[2048], pa[600], pb[600];
    const char *common = TINY " --norm bn --train-size 200 --test-size 50 --epochs 2 --batch-size 16 --nproc-per-node 2";
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 %s --master-port %d --save %s/s3 --report %s/s3.jsonl", test_root(),
             common, test_free_port(), dir, dir);
    test_run_ok(cmd, "stage3", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 %s --accum-steps 1 --master-port %d --save %s/s4 --report %s/s4.jsonl",
             test_root(), common, test_free_port(), dir, dir);
    test_run_ok(cmd, "stage4 --accum-steps 1", NULL);
    double a[64], b[64];
    snprintf(pa, sizeof pa, "%s/s3.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/s4.jsonl", dir);
    int n = test_read_losses(pa, a, 64);
    ck_assert_int_eq(n, 14);
    ck_assert_int_eq(test_read_losses(pb, b, 64), n);
    for (int i = 0; i < n; i++) ck_assert_msg(a[i] == b[i], "step %d: loss %.9g vs %.9g", i + 1, a[i], b[i]);
    snprintf(pa, sizeof pa, "%s/s3/epoch002.ckpt", dir);
    snprintf(pb, sizeof pb, "%s/s4/epoch002.ckpt", dir);
    long la, lb;
    char *ca = test_slurp(pa, &la), *cb = test_slurp(pb, &lb);
    ck_assert_msg(ca && cb && la == lb && !memcmp(ca, cb, (size_t)la),
                  "checkpoints differ: parameters, BN buffers or momentum are not bit-identical");
    free(ca), free(cb), free(dir);
}
END_TEST

/* ---- the collectives, against PyTorch ---------------------------------------------------------- */

/* "1,1,0" → {1, 1, 0}; returns how many. */
static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && *s != ' ' && *s != '\n' && n < max) {
        out[n++] = atoi(s);
        while (*s && *s != ',' && *s != ' ' && *s != '\n') s++;
        if (*s == ',') s++;
    }
    return n;
}

static const char *after(const char *line, const char *key) {
    const char *p = strstr(line, key);
    ck_assert_msg(p, "fixture line without %s: %s", key, line);
    return p + strlen(key);
}

START_TEST(collectives_per_step_match_pytorch) {
    char path[600], line[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/ddp_nosync.txt", test_root());
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "%s missing: regenerate it with python3 tests/torch/ddp_nosync_fixture.py", path);
    char *dir = test_tmpdir();
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || !strstr(line, "mode=")) continue;
        int sync_each = strstr(line, "mode=sync_each") != NULL, K = atoi(after(line, " K="));
        int micro = atoi(after(line, " micro=")), epochs = atoi(after(line, " epochs="));
        int eval_batches = atoi(after(line, " eval_batches="));
        int bc[64], ar[64], ev[8];
        int steps = parse_list(after(line, " broadcasts="), bc, 64);
        ck_assert_int_eq(parse_list(after(line, " allreduces="), ar, 64), steps);
        int evals = parse_list(after(line, " eval_broadcasts="), ev, 8);
        ck_assert_int_eq(evals, epochs);
        /* the fixture's schedule: 2 ranks, `micro` micro-batches of 4 per epoch, eval_batches of 4 */
        char cmd[2048], rep[700];
        snprintf(rep, sizeof rep, "%s/k%d_%d.jsonl", dir, K, sync_each);
        snprintf(cmd, sizeof cmd,
                 LIMIT "%s/stage4 " TINY " --norm bn --nproc-per-node 2 --batch-size 4 --train-size %d --test-size %d "
                       "--epochs %d --accum-steps %d %s --master-port %d --report %s",
                 test_root(), 2 * 4 * micro, 2 * 4 * eval_batches, epochs, K, sync_each ? "--sync-each-micro-step" : "",
                 test_free_port(), rep);
        char *out;
        test_run_ok(cmd, line, &out);
        /* K = 1 has no micro-step for no_sync to skip: the flag changes nothing, and the run says so */
        ck_assert_msg(!strstr(out, "--sync-each-micro-step changes nothing") == !(sync_each && K == 1), "%s", out);
        free(out);
        double got_bc[64], got_ar[64], got_step[64];
        ck_assert_int_eq(test_report_series(rep, "comm", "step", got_step, 64), steps);
        test_report_series(rep, "comm", "broadcasts", got_bc, 64);
        test_report_series(rep, "comm", "collectives", got_ar, 64);
        for (int i = 0; i < steps; i++) {
            ck_assert_int_eq((int)got_step[i], i + 1);
            ck_assert_msg((int)got_bc[i] == bc[i], "%s step %d: %d buffer broadcasts, PyTorch %d", line, i + 1,
                          (int)got_bc[i], bc[i]);
            ck_assert_msg((int)got_ar[i] == ar[i], "%s step %d: %d all-reduces, PyTorch %d", line, i + 1,
                          (int)got_ar[i], ar[i]);
        }
        int ev_total = 0;
        for (int i = 0; i < evals; i++) ev_total += ev[i];
        ck_assert_int_eq((int)test_report_field(rep, "summary", "eval_buffer_broadcasts"), ev_total);
        cases++;
    }
    fclose(f);
    ck_assert_int_eq(cases, 8); /* no_sync and sync_each, K = 1 … 4 */
    free(dir);
}
END_TEST

/* --broadcast-buffers after-forward moves rank 0's buffer broadcast from before the next forward into
 * the backward of the forward that owes it, and must leave every forward and every evaluation the
 * buffers PyTorch's default gives them. Two CPU ranks with BN over 2 epochs, K = 3 (no_sync forwards,
 * a trailing partial group) and K = 1: every loss, every epoch's test loss and accuracy, and rank 0's
 * final checkpoint are the same bits as the default's; the broadcasts move — one per optimizer
 * step, none in evaluation. The evaluation is where a missed or stale broadcast would show: each
 * rank evaluates its shard with its own running statistics. */
START_TEST(buffers_broadcast_after_forward_same_values) {
    char *dir = test_tmpdir();
    for (int K = 3; K >= 1; K -= 2) {
        char cmd[2048], rep[2][700], ck[2][700];
        const char *mode[2] = {"before-forward", "after-forward"};
        for (int a = 0; a < 2; a++) {
            snprintf(rep[a], sizeof rep[a], "%s/k%d_%s.jsonl", dir, K, mode[a]);
            snprintf(ck[a], sizeof ck[a], "%s/k%d_%s/epoch002.ckpt", dir, K, mode[a]);
            snprintf(cmd, sizeof cmd,
                     LIMIT "%s/stage4 " TINY " --norm bn --train-size 112 --test-size 40 --epochs 2 --batch-size 8 "
                           "--nproc-per-node 2 --accum-steps %d --broadcast-buffers %s --master-port %d --save %s/k%d_%s "
                           "--report %s",
                     test_root(), K, mode[a], test_free_port(), dir, K, mode[a], rep[a]);
            test_run_ok(cmd, mode[a], NULL);
        }
        double la[64], lb[64], ea[4], eb[4];
        int n = test_read_losses(rep[0], la, 64);
        ck_assert_int_eq(n, K == 3 ? 6 : 14); /* 7 micro-batches an epoch: groups of 3, 3, 1 */
        ck_assert_int_eq(test_read_losses(rep[1], lb, 64), n);
        for (int i = 0; i < n; i++) ck_assert_msg(la[i] == lb[i], "K %d step %d: loss %.9g vs %.9g", K, i + 1, la[i], lb[i]);
        const char *keys[2] = {"test_loss", "test_acc"};
        for (int k = 0; k < 2; k++) {
            ck_assert_int_eq(test_report_series(rep[0], "epoch", keys[k], ea, 4), 2);
            ck_assert_int_eq(test_report_series(rep[1], "epoch", keys[k], eb, 4), 2);
            for (int e = 0; e < 2; e++)
                ck_assert_msg(ea[e] == eb[e], "K %d epoch %d: %s %.9g (before-forward) vs %.9g (after-forward)", K, e + 1,
                              keys[k], ea[e], eb[e]);
        }
        long na, nb;
        char *a = test_slurp(ck[0], &na), *b = test_slurp(ck[1], &nb);
        ck_assert_msg(a && b && na == nb && !memcmp(a, b, (size_t)na), "K %d: final checkpoints differ", K);
        free(a), free(b);
        ck_assert_int_eq((int)test_report_field(rep[1], "summary", "buffer_broadcasts"), n);
        ck_assert_int_eq((int)test_report_field(rep[1], "summary", "eval_buffer_broadcasts"), 0);
        ck_assert_int_gt((int)test_report_field(rep[0], "summary", "eval_buffer_broadcasts"), 0);
        /* …and no forward waits for them: each step's record has its broadcast and no broadcast wait
         * (the wait before a forward is the default's alone; after-forward, the end of backward waits) */
        double bc[64], nbc[64];
        ck_assert_int_eq(test_report_series(rep[1], "comm", "bcast_ms", bc, 64), n);
        ck_assert_int_eq(test_report_series(rep[1], "comm", "broadcasts", nbc, 64), n);
        for (int i = 0; i < n; i++)
            ck_assert_msg(nbc[i] == 1 && bc[i] == 0, "K %d step %d after-forward: %g broadcasts, %g ms waited for them",
                          K, i + 1, nbc[i], bc[i]);
    }
    free(dir);
}
END_TEST

/* --broadcast-buffers after-forward where there is nothing to broadcast — no buffers (--norm none), or no
 * other rank — changes nothing: said in a note, as --sync-bn says it, not silently accepted. */
START_TEST(buffers_broadcast_after_forward_with_nothing_to_broadcast_noted) {
    const struct { const char *flags, *why; } cases[] = {
        {"--norm none --nproc-per-node 2", "the model has no buffers (--norm none)"},
        {"--norm bn --nproc-per-node 1", "one rank has no one to broadcast to"},
    };
    for (int i = 0; i < 2; i++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd,
                 LIMIT "%s/stage3 " TINY " --train-size 32 --test-size 16 --epochs 1 --batch-size 8 %s "
                       "--broadcast-buffers after-forward --master-port %d",
                 test_root(), cases[i].flags, test_free_port());
        test_run_ok(cmd, cases[i].flags, &out);
        ck_assert_msg(strstr(out, "note: --broadcast-buffers after-forward changes nothing here") &&
                          strstr(out, cases[i].why),
                      "%s: no note that --broadcast-buffers changes nothing:\n%s", cases[i].flags, out);
        free(out);
    }
}
END_TEST

/* ---- resume ----------------------------------------------------------------------------------- */

START_TEST(resume_at_optimizer_step_is_bit_identical) {
    char *dir = test_tmpdir(), cmd[2048], pa[600], pb[600];
    /* 2 ranks × 56 samples, batch 8: 7 micro-batches an epoch, K = 3 → groups of 3, 3, 1 */
    const char *common = TINY " --norm bn --train-size 112 --test-size 32 --epochs 2 --batch-size 8 --nproc-per-node 2 "
                         "--accum-steps 3";
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 %s --master-port %d --save %s/whole --report %s/whole.jsonl", test_root(),
             common, test_free_port(), dir, dir);
    test_run_ok(cmd, "uninterrupted", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 %s --steps 2 --master-port %d --save %s/part", test_root(), common,
             test_free_port(), dir);
    test_run_ok(cmd, "stopped after 2 optimizer steps", NULL);
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage4 %s --resume %s/part/step00000002.ckpt --master-port %d --save %s/resumed --report "
                   "%s/resumed.jsonl",
             test_root(), common, dir, test_free_port(), dir, dir);
    char *out;
    test_run_ok(cmd, "resumed", &out);
    ck_assert_msg(strstr(out, "resumed from") && strstr(out, "batch 6"), "%s", out);
    free(out);
    double a[16], b[16];
    snprintf(pa, sizeof pa, "%s/whole.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/resumed.jsonl", dir);
    ck_assert_int_eq(test_read_losses(pa, a, 16), 6);
    ck_assert_int_eq(test_read_losses(pb, b, 16), 4);
    for (int i = 0; i < 4; i++) ck_assert_msg(a[i + 2] == b[i], "step %d: %.9g vs %.9g", i + 3, a[i + 2], b[i]);
    snprintf(pa, sizeof pa, "%s/whole/epoch002.ckpt", dir);
    snprintf(pb, sizeof pb, "%s/resumed/epoch002.ckpt", dir);
    long la, lb;
    char *ca = test_slurp(pa, &la), *cb = test_slurp(pb, &lb);
    ck_assert_msg(ca && cb && la == lb && !memcmp(ca, cb, (size_t)la), "resumed run's final checkpoint differs");
    free(ca), free(cb);
    /* the same checkpoint with another K: refused, not silently misaligned */
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage4 " TINY " --norm bn --train-size 112 --test-size 32 --epochs 2 --batch-size 8 "
                   "--nproc-per-node 2 --accum-steps 2 --resume %s/part/step00000002.ckpt --master-port %d",
             test_root(), dir, test_free_port());
    ck_assert_int_ne(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "--accum-steps 2") && strstr(out, "resume with the flags it was trained with"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* ---- flags ------------------------------------------------------------------------------------- */

START_TEST(bad_accum_steps_refused) {
    const char *bad[] = {"0", "-1", "abc", "2.5", "99999999999", "100000", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[512], *out;
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 --device cpu --accum-steps '%s'", test_root(), bad[i]);
        ck_assert_int_eq(test_run(cmd, &out), 2);
        ck_assert_msg(strstr(out, "--accum-steps") && !strstr(out, "launching"), "'%s': %s", bad[i], out);
        int lines = 0;
        for (char *p = out; *p; p++) lines += *p == '\n';
        ck_assert_msg(lines == 1, "'%s': one line expected:\n%s", bad[i], out);
        free(out);
    }
    /* stage 3 has no such flag */
    char cmd[512], *out;
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 --accum-steps 2", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    free(out);
}
END_TEST

START_TEST(accum_beyond_an_epoch_steps_once_per_epoch) {
    char *dir = test_tmpdir(), cmd[2048], *out, rep[600];
    snprintf(rep, sizeof rep, "%s/r.jsonl", dir);
    /* 2 ranks × 24 samples, batch 8: 3 micro-batches an epoch, K = 5 */
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage4 " TINY " --norm bn --train-size 48 --test-size 16 --epochs 2 --batch-size 8 "
                   "--nproc-per-node 2 --accum-steps 5 --master-port %d --report %s",
             test_root(), test_free_port(), rep);
    test_run_ok(cmd, "K beyond an epoch", &out);
    ck_assert_msg(strstr(out, "note: --accum-steps 5 is more than the 3 micro-batches of an epoch"), "%s", out);
    /* the header's effective batch is the step's real one: the epoch's 3 micro-batches, not 5 */
    ck_assert_msg(strstr(out, "batch 8 × 3 micro-batches (all of an epoch's: --accum-steps 5 is more) × 2 device(s) "
                              "= effective batch 48 "), "%s", out);
    ck_assert_msg(strstr(out, "ddp: no_sync for all but the last micro-step"), "%s", out);
    free(out);
    /* K = 1 accumulates nothing: no no_sync line */
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage4 " TINY " --train-size 48 --test-size 16 --steps 2 --batch-size 8 --nproc-per-node 2 "
                   "--accum-steps 1 --master-port %d", test_root(), test_free_port());
    test_run_ok(cmd, "K = 1", &out);
    ck_assert_msg(strstr(out, "= effective batch 16 ") && !strstr(out, "no_sync"), "%s", out);
    free(out);
    /* --drop-last leaving a rank nothing: refused, naming the fix — once, by the launcher (every rank
     * printed the same line) */
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 " TINY " --train-size 1 --test-size 16 --nproc-per-node 2 --drop-last "
             "--master-port %d", test_root(), test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    const char *said = strstr(out, "--drop-last with 1 training samples and 2 ranks leaves no sample per rank — drop "
                                   "--drop-last, run at most 1 rank, or train on 2 samples or more (--train-size 2 "
                                   "with the synthetic set)");
    ck_assert_msg(said && !strstr(said + 1, "--drop-last with 1") && !strstr(out, "launching"), "%s", out);
    free(out);
    /* …also where --data's files hold fewer samples than the job has ranks (one record a file here) */
    snprintf(cmd, sizeof cmd, "(cd %s && for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 "
             "test_batch; do head -c 3073 /dev/zero > $f.bin; done) && " LIMIT "%s/stage4 " TINY " --data %s "
             "--nproc-per-node 6 --drop-last --master-port %d", dir, test_root(), dir, test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    said = strstr(out, "--drop-last with 5 training samples and 6 ranks leaves no sample per rank");
    ck_assert_msg(said && !strstr(said + 1, "--drop-last with 5") && !strstr(out, "launching"), "%s", out);
    /* and the fix it names works with --data, where a larger --train-size is refused (the files hold 5):
     * at most 5 ranks */
    ck_assert_msg(strstr(said, "run at most 5 ranks"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 " TINY " --data %s --nproc-per-node 5 --drop-last --steps 1 "
             "--master-port %d", test_root(), dir, test_free_port());
    test_run_ok(cmd, "--drop-last on 5 samples with the 5 ranks the refusal names", NULL);
    ck_assert_int_eq((int)test_report_field(rep, "summary", "optimizer_steps"), 2);
    ck_assert_int_eq((int)test_report_field(rep, "summary", "micro_steps"), 6);
    ck_assert_int_eq((int)test_report_field(rep, "summary", "allreduce_calls"), 2);
    free(dir);
}
END_TEST

/* ---- on GPUs --------------------------------------------------------------------------------- */

START_TEST(accum_gpu_matches_one_gpu) {
    if (!test_have_gpu("stage 4 on GPUs ≡ one GPU at the K× batch")) return;
    /* two workers: NCCL on two GPUs, or --comm host sharing the first one */
    int two = device_cuda_count() >= 2;
    if (!two) setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    char *dir = test_tmpdir(), cmd[4096], pa[600], pb[600];
    const char *common = "--device cuda --model tiny --norm none --deterministic --no-tf32 --progress off --log-every 1 "
                         "--train-size 768 --test-size 64 --epochs 1 --lr 0.05";
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --batch-size 128 --save %s/one --report %s/one.jsonl", test_root(),
             common, dir, dir);
    test_run_ok(cmd, "stage1 on a GPU", NULL);
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage4 %s --nproc-per-node 2 --comm %s --batch-size 32 --accum-steps 2 --master-port %d --save "
                   "%s/acc --report %s/acc.jsonl",
             test_root(), common, two ? "nccl" : "host", test_free_port(), dir, dir);
    test_run_ok(cmd, "stage4 on GPUs", NULL);
    double a[16], b[16];
    snprintf(pa, sizeof pa, "%s/one.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/acc.jsonl", dir);
    ck_assert_int_eq(test_read_losses(pa, a, 16), 6);
    ck_assert_int_eq(test_read_losses(pb, b, 16), 6);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(fabs(a[i] - b[i]) <= 1e-5 * fabs(a[i]), "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
    snprintf(pa, sizeof pa, "%s/one/epoch001.ckpt", dir);
    snprintf(pb, sizeof pb, "%s/acc/epoch001.ckpt", dir);
    float *p1 = test_load_params(pa, "tiny", 0), *p4 = test_load_params(pb, "tiny", 0);
    double err = test_rel_err(p4, p1, test_n_params("tiny"));
    ck_assert_msg(err <= 1e-5, "final parameters differ by %.3g", err);
    free(p1), free(p4), free(dir);
    if (!two) unsetenv("CUDA_VISIBLE_DEVICES");
}
END_TEST

Suite *suite_accum(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink multicast in any worker these tests start */
    Suite *s = suite_create("accum");
    TCase *tc = tcase_create("accum");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, accum_one_worker_matches_one_device);
    tcase_add_test(tc, accum_two_workers_match_one_device);
    tcase_add_test(tc, sync_each_micro_step_same_params_k_times_the_calls);
    tcase_add_test(tc, accum_one_is_stage3_bit_for_bit);
    tcase_add_test(tc, collectives_per_step_match_pytorch);
    tcase_add_test(tc, buffers_broadcast_after_forward_same_values);
    tcase_add_test(tc, buffers_broadcast_after_forward_with_nothing_to_broadcast_noted);
    tcase_add_test(tc, resume_at_optimizer_step_is_bit_identical);
    tcase_add_test(tc, bad_accum_steps_refused);
    tcase_add_test(tc, accum_beyond_an_epoch_steps_once_per_epoch);
    tcase_add_test(tc, accum_gpu_matches_one_gpu);
    suite_add_tcase(s, tc);
    return s;
}
