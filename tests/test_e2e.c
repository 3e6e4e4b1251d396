/* test_e2e.c — ./stage1 end to end on the CPU backend: it learns, it resumes bit for bit, it
 * refuses bad input with a clear message, runs out of memory with one, and its JSON report has what
 * scripts rely on; every stage (and step_skew.py) prints a count of one in the singular. */
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "device.h"
#include "cli.h"
#include "data.h"
#include "model.h"
#include "optim.h"
#include "trainer.h"

#include "tests.h"

/* A small, quick run: tiny model, 512 synthetic images, batch 32 → 16 steps per epoch. */
#define SMALL "--device cpu --model tiny --train-size 512 --test-size 256 --batch-size 32 --progress off"

static int run_stage(const char *stage, const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/%s %s", test_root(), stage, args);
    return test_run(cmd, out);
}

START_TEST(stage1_cpu_learns) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, SMALL " --epochs 4 --lr 0.05 --log-every 1 --report %s", path);
    int rc = run_stage("stage1", args, &out);
    ck_assert_msg(rc == 0, "stage1 failed (%d):\n%s", rc, out);
    double loss[64];
    int n = test_read_losses(path, loss, 64);
    ck_assert_int_eq(n, 64);
    double first = (loss[0] + loss[1] + loss[2] + loss[3]) / 4;
    double last = (loss[n - 1] + loss[n - 2] + loss[n - 3] + loss[n - 4]) / 4;
    ck_assert_msg(last < 0.8 * first, "loss did not fall: first %.4f last %.4f", first, last);
    /* the summary line carries what scripts need */
    long len;
    char *rep = test_slurp(path, &len);
    char *sum = strstr(rep, "\"type\":\"summary\"");
    ck_assert(sum);
    const char *keys[] = {"stage", "device", "world_size", "model", "norm", "batch_size", "steps",
                          "epochs", "final_train_loss", "test_acc", "ms_per_iter_median",
                          "img_per_s", "peak_mem_bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char k[64];
        snprintf(k, sizeof k, "\"%s\":", keys[i]);
        ck_assert_msg(strstr(sum, k), "summary lacks %s", keys[i]);
    }
    ck_assert(strstr(out, "summary:"));
    free(rep), free(out), free(dir);
}
END_TEST

/* Stop at step 5 (inside epoch 1), resume, and finish at step 20 (inside epoch 2): the final
 * checkpoint and the logged losses must equal those of one uninterrupted run, bit for bit. */
START_TEST(stage1_resume_is_bit_identical) {
    char *dir = test_tmpdir(), args[2048], *out;
    const char *common = SMALL " --epochs 2 --deterministic --log-every 1 --workers 2";
    snprintf(args, sizeof args, "%s --steps 20 --save %s/a --report %s/a.jsonl", common, dir, dir);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "%s --steps 5 --save %s/b --report %s/b.jsonl", common, dir, dir);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "%s --steps 20 --resume %s/b/step00000005.ckpt --save %s/c --report %s/c.jsonl",
             common, dir, dir, dir);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
    /* the resumed epoch's train loss averages batches 6 on: its line and its record say so */
    ck_assert_msg(strstr(out, "resumed from") && strstr(out, "epoch 1/2 from batch 6  train loss") &&
                  strstr(out, "epoch 2/2  train loss"), "%s", out);
    free(out);
    char pr[512];
    snprintf(pr, sizeof pr, "%s/c.jsonl", dir);
    char *rec = test_slurp(pr, NULL);
    ck_assert_msg(rec && strstr(rec, "\"type\":\"epoch\",\"epoch\":1,\"first_batch\":6,") &&
                  strstr(rec, "\"type\":\"epoch\",\"epoch\":2,\"first_batch\":1,"), "%s", rec);
    free(rec);
    char pa[512], pc[512];
    const char *files[] = {"step00000020.ckpt", "epoch001.ckpt"};
    for (int i = 0; i < 2; i++) {
        snprintf(pa, sizeof pa, "%s/a/%s", dir, files[i]);
        snprintf(pc, sizeof pc, "%s/c/%s", dir, files[i]);
        long la, lc;
        char *a = test_slurp(pa, &la), *c = test_slurp(pc, &lc);
        ck_assert_msg(a && c, "missing %s or %s", pa, pc);
        ck_assert_int_eq(la, lc);
        ck_assert_msg(!memcmp(a, c, (size_t)la), "%s differs between resumed and straight runs", files[i]);
        free(a), free(c);
    }
    double la[32], lc[32];
    snprintf(pa, sizeof pa, "%s/a.jsonl", dir);
    snprintf(pc, sizeof pc, "%s/c.jsonl", dir);
    ck_assert_int_eq(test_read_losses(pa, la, 32), 20);
    ck_assert_int_eq(test_read_losses(pc, lc, 32), 15);
    for (int i = 0; i < 15; i++) ck_assert_msg(la[5 + i] == lc[i], "step %d: %.9g vs %.9g", 6 + i, la[5 + i], lc[i]);
    free(dir);
}
END_TEST

/* Two runs with the same flags give identical losses (--deterministic), whatever the worker count. */
START_TEST(stage1_deterministic_across_workers) {
    char *dir = test_tmpdir(), args[1024], *out;
    for (int w = 0; w < 2; w++) {
        snprintf(args, sizeof args, SMALL " --steps 6 --deterministic --log-every 1 --workers %d --report %s/w%d.jsonl",
                 w ? 3 : 0, dir, w);
        ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
        free(out);
    }
    double a[8], b[8];
    char p[512];
    snprintf(p, sizeof p, "%s/w0.jsonl", dir);
    ck_assert_int_eq(test_read_losses(p, a, 8), 6);
    snprintf(p, sizeof p, "%s/w1.jsonl", dir);
    ck_assert_int_eq(test_read_losses(p, b, 8), 6);
    for (int i = 0; i < 6; i++) ck_assert(a[i] == b[i]);
    free(dir);
}
END_TEST

/* Where the run is, as the report and the console say it: 3 steps per epoch, 3 epochs, stopped by --steps 7 inside
 * the third. Each step record names the epoch it trained in and the learning rate it used (the
 * schedule's value before the step counts), and the run's last step is logged although --log-every
 * skips it; epochs 1 and 2 end whole, the third is partial; the summary counts 7 steps and 2 whole
 * epochs; the checkpoints are the two epoch ends and the stop, of which --keep-last 2 leaves the last
 * two. */
START_TEST(stage1_report_says_where_the_run_is) {
    char *dir = test_tmpdir(), args[2048], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --model tiny --train-size 96 --test-size 32 --batch-size 32 --workers 0 "
             "--epochs 3 --steps 7 --log-every 2 --lr 0.1 --schedule cosine --save %s/c --keep-last 2 "
             "--report %s", dir, path);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
    double v[16];
    const double steps[] = {2, 4, 6, 7}, epochs[] = {1, 2, 2, 3};
    ck_assert_int_eq(test_report_series(path, "step", "step", v, 16), 4);
    for (int i = 0; i < 4; i++) ck_assert_msg(v[i] == steps[i], "step record %d: step %g, expected %g", i, v[i], steps[i]);
    ck_assert_int_eq(test_report_series(path, "step", "epoch", v, 16), 4);
    for (int i = 0; i < 4; i++) ck_assert_msg(v[i] == epochs[i], "step %g: epoch %g, expected %g", steps[i], v[i], epochs[i]);
    ck_assert_int_eq(test_report_series(path, "step", "lr", v, 16), 4);
    double torch_lr[16]; /* CosineAnnealingLR(T_max = the schedule's 3 × 3 steps): tests/fixtures/schedule.txt */
    ck_assert_int_eq(test_torch_schedule("cosine", 9, 0.1, torch_lr, 16), 10);
    for (int i = 0; i < 4; i++) { /* the lr of the step, set at its start: PyTorch's lr for that step */
        double want = torch_lr[(int)steps[i] - 1];
        ck_assert_msg(fabs(v[i] - want) <= 1e-8 * want, "step %g: lr %.9g, expected %.9g", steps[i], v[i], want);
    }
    const double ends[] = {3, 6, 7};
    ck_assert_int_eq(test_report_series(path, "epoch", "epoch", v, 16), 3);
    for (int i = 0; i < 3; i++) ck_assert_msg(v[i] == i + 1, "epoch record %d says epoch %g", i, v[i]);
    ck_assert_int_eq(test_report_series(path, "epoch", "step", v, 16), 3);
    for (int i = 0; i < 3; i++) ck_assert_msg(v[i] == ends[i], "epoch %d ends at step %g, expected %g", i + 1, v[i], ends[i]);
    /* --progress auto (the default) into a pipe: no bar, a line per logged step instead */
    ck_assert_msg(!strchr(out, '\r') && strstr(out, "\n  step      4  epoch 2  batch     1/3  loss ") &&
                  strstr(out, "\n  step      7  epoch 3  batch     1/3  loss "), "%s", out);
    ck_assert_msg(strstr(out, "\nepoch 1/3 ") && strstr(out, "\nepoch 2/3 ") && strstr(out, "\npartial epoch 3/3 ") &&
                  !strstr(out, "partial epoch 1/3") && !strstr(out, "partial epoch 2/3"), "%s", out);
    ck_assert(test_report_field(path, "summary", "steps") == 7);
    ck_assert(test_report_field(path, "summary", "epochs") == 2);
    ck_assert_int_eq(test_report_series(path, "checkpoint", "step", v, 16), 3);
    for (int i = 0; i < 3; i++) ck_assert_msg(v[i] == ends[i], "checkpoint %d at step %g, expected %g", i, v[i], ends[i]);
    const char *names[] = {"epoch001.ckpt", "epoch002.ckpt", "step00000007.ckpt"};
    for (int i = 0; i < 3; i++) {
        char ck[600];
        snprintf(ck, sizeof ck, "%s/c/%s", dir, names[i]);
        ck_assert_msg(strstr(out, ck), "no checkpoint %s written:\n%s", ck, out);
        ck_assert_msg((access(ck, F_OK) == 0) == (i > 0), "--keep-last 2: %s %s", ck, i ? "removed" : "kept");
    }
    free(out), free(dir);
}
END_TEST

/* GPU-only flags on the CPU backend are accepted (a GPU command runs unchanged on a laptop) but named,
 * and the run is exactly the run without them: the same losses, bit for bit in the report. */
START_TEST(stage1_cpu_names_gpu_only_flags) {
    char *dir = test_tmpdir(), args[2048], a[512], b[512], *out;
    snprintf(a, sizeof a, "%s/a.jsonl", dir), snprintf(b, sizeof b, "%s/b.jsonl", dir);
    snprintf(args, sizeof args, SMALL " --epochs 1 --steps 4 --log-every 1 --no-tf32 --pin-memory --layout nchw "
             "--cudnn-benchmark --no-cuda-graph --report %s", a);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "note: --cudnn-benchmark, --no-tf32, --no-cuda-graph, --layout, --pin-memory change "
                              "only GPU runs") && strstr(out, "what it would be without them"), "%s", out);
    free(out);
    snprintf(args, sizeof args, SMALL " --epochs 1 --steps 4 --log-every 1 --report %s", b);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
    ck_assert_msg(!strstr(out, "change only GPU runs") && !strstr(out, "changes only GPU runs"), "%s", out);
    double la[8], lb[8];
    ck_assert_int_eq(test_read_losses(a, la, 8), 4);
    ck_assert_int_eq(test_read_losses(b, lb, 8), 4);
    for (int i = 0; i < 4; i++) ck_assert_msg(la[i] == lb[i], "step %d: %.9g vs %.9g", i + 1, la[i], lb[i]);
    free(out), free(dir);
}
END_TEST

/* The first WARMUP_STEPS (5) steps are not timed, nor is an epoch's last (what follows it is the
 * evaluation): a one-epoch run of 6 steps has no step time (null, never 0 or a negative figure), one of
 * 7 steps has one, and the images per second follow from it. */
START_TEST(stage1_warmup_and_last_step_untimed) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    for (int steps = 6; steps <= 7; steps++) {
        snprintf(path, sizeof path, "%s/s%d.jsonl", dir, steps);
        snprintf(args, sizeof args, SMALL " --workers 0 --epochs 1 --steps %d --report %s", steps, path);
        ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
        double ms = test_report_field(path, "summary", "ms_per_iter_median");
        double ips = test_report_field(path, "summary", "img_per_s");
        double epoch_ms = test_report_field(path, "epoch", "ms_per_iter_median");
        if (steps == 6)
            ck_assert_msg(isnan(ms) && isnan(ips) && isnan(epoch_ms) && strstr(out, "n/a ms/it"),
                          "6 steps, all warm-up or last: timed %g ms, %g img/s, epoch %g ms\n%s", ms, ips, epoch_ms, out);
        else
            ck_assert_msg(ms > 0 && epoch_ms == ms && fabs(ips - 1e3 * 32 / ms) <= 1e-6 * ips,
                          "7 steps, one timed: %g ms, %g img/s, epoch %g ms\n%s", ms, ips, epoch_ms, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Each optimizer step uses the schedule's lr for that step: under a warm-up from 0.25 × 0.4 the first
 * step's lr is 0.1, so a second step starts from the same parameters as under a constant 0.1 (the
 * same loss, bit for bit), and the third from other ones (0.175 against 0.1). An lr taken one step
 * early or late would show at the second loss already. */
START_TEST(stage1_each_step_uses_its_scheduled_lr) {
    char *dir = test_tmpdir(), args[2048], path[2][700], *out;
    const char *runs[2] = {"--lr 0.4 --warmup-steps 4 --warmup-start-factor 0.25", "--lr 0.1 --schedule const"};
    double loss[2][4];
    for (int i = 0; i < 2; i++) {
        snprintf(path[i], sizeof path[i], "%s/lr%d.jsonl", dir, i);
        snprintf(args, sizeof args, "--device cpu --model tiny --train-size 256 --test-size 32 --batch-size 32 "
                 "--steps 3 --epochs 10 --progress off --log-every 1 %s --report %s", runs[i], path[i]);
        ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s", out);
        free(out);
        ck_assert_int_eq(test_read_losses(path[i], loss[i], 4), 3);
    }
    ck_assert_msg(loss[0][0] == loss[1][0] && loss[0][1] == loss[1][1],
                  "the first step's lr under the warm-up is not 0.1: losses %.9g %.9g vs %.9g %.9g", loss[0][0],
                  loss[0][1], loss[1][0], loss[1][1]);
    ck_assert_msg(loss[0][2] != loss[1][2], "the second step's lr (0.175) trained as 0.1 did: %.9g", loss[0][2]);
    free(dir);
}
END_TEST

/* Its output's reader gone (`| head`, a dropped ssh under `| tee`): SIGPIPE used to end the run
 * without a word. It still dies of SIGPIPE (141, what a launcher or shell expects), after saying why. */
START_TEST(stage1_says_why_a_closed_pipe_stopped_it) {
    char cmd[2048], *out;
    /* stdout into `true`, which exits at once; stderr and the exit status to the captured fd 3 */
    snprintf(cmd, sizeof cmd, "{ { %s/stage1 " SMALL " --epochs 2 --log-every 1 2>&3; echo \"exit $?\" >&3; } | true; } 3>&1",
             test_root());
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "exit 141"), "not ended by SIGPIPE:\n%s", out);
    ck_assert_msg(strstr(out, "stage1: stopped — the program reading its output went away (SIGPIPE") &&
                      strstr(out, "nohup"),
                  "%s", out);
    free(out);
}
END_TEST

typedef struct BadCase {
    const char *args, *expect;
} BadCase;

START_TEST(stage1_bad_input_is_refused_clearly) {
    char *dir = test_tmpdir(), corrupt[512], missing_dir[512];
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.ckpt", dir);
    FILE *f = fopen(corrupt, "wb");
    fputs("DPDDPCKP this is not really a checkpoint", f);
    fclose(f);
    snprintf(missing_dir, sizeof missing_dir, "%s/empty", dir);
    ck_assert(mkdir(missing_dir, 0755) == 0);
    char a1[1024], a2[1024];
    snprintf(a1, sizeof a1, "--device cpu --resume %s", corrupt);
    snprintf(a2, sizeof a2, "--device cpu --data %s", missing_dir);
    BadCase cases[] = {
        {"--batch-size 0", "--batch-size"},
        {"--lr abc", "--lr"},
        {"--model resnet50", "--model"},
        {"--epochs", "--epochs"},
        {"--frobnicate 3", "--frobnicate"},
        {"--device cpu --cpu-threads 0", "--cpu-threads"},
        {"--device cpu --resume /nonexistent/x.ckpt", "x.ckpt"},
        {a1, "corrupt.ckpt"},
        {a2, "data_batch_1.bin"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = run_stage("stage1", cases[i].args, &out);
        ck_assert_msg(rc == 2, "'%s' exited %d, expected 2:\n%s", cases[i].args, rc, out);
        ck_assert_msg(strstr(out, "error:") && strstr(out, cases[i].expect),
                      "'%s': message does not name '%s':\n%s", cases[i].args, cases[i].expect, out);
        free(out);
    }
    if (device_cuda_count() == 0) { /* only meaningful where there is no GPU */
        char *out;
        ck_assert_int_eq(run_stage("stage1", "--device cuda", &out), 2);
        ck_assert(strstr(out, "--device cpu"));
        free(out);
    }
    free(dir);
}
END_TEST

/* The CPU backend's threads (cpu_threads.h) change how fast, never what: one thread, and three from
 * OMP_NUM_THREADS (which PyTorch reads too), write the same checkpoint byte for byte, and the run's
 * first line says how many threads it used. */
START_TEST(stage1_same_bits_on_any_cpu_thread_count) {
    char *dir = test_tmpdir(), cmd[2048], *out[2];
    const char *env[2] = {"", "OMP_NUM_THREADS=3 "}, *flag[2] = {"--cpu-threads 1", ""};
    const char *says[2] = {"stage1 | cpu0, 1 thread |", "stage1 | cpu0, 3 threads |"};
    for (int t = 0; t < 2; t++) {
        snprintf(cmd, sizeof cmd, "%s%s/stage1 " SMALL " --steps 5 %s --save %s/t%d", env[t], test_root(), flag[t],
                 dir, t);
        ck_assert_msg(test_run(cmd, &out[t]) == 0, "%s", out[t]);
        ck_assert_msg(strstr(out[t], says[t]), "expected '%s' in:\n%s", says[t], out[t]);
    }
    long len[2];
    char path[2][600];
    char *ck[2];
    for (int t = 0; t < 2; t++) {
        snprintf(path[t], sizeof path[t], "%s/t%d/step00000005.ckpt", dir, t);
        ck[t] = test_slurp(path[t], &len[t]);
        ck_assert_msg(ck[t] && len[t] > 0, "no checkpoint %s:\n%s", path[t], out[t]);
    }
    ck_assert_msg(len[0] == len[1] && !memcmp(ck[0], ck[1], len[0]),
                  "the checkpoint after 5 steps differs between 1 and 3 CPU threads");
    for (int t = 0; t < 2; t++) free(ck[t]), free(out[t]);
    free(dir);
}
END_TEST

/* An OMP_NUM_THREADS the CPU backend cannot use is not silently dropped: a value that is not a count
 * is ignored with a warning (as OpenMP runtimes do) and the cores decide; one above the pool's limit is
 * capped, with a warning. The run itself goes on. In stages 3–5 a host's first worker warns for all of
 * them (each said the same line). */
START_TEST(stage1_odd_omp_num_threads_warns) {
    struct { const char *env, *warning, *header; } cases[] = {
        {"OMP_NUM_THREADS=abc", "OMP_NUM_THREADS=abc is not a whole number of threads", "stage1 | cpu0, "},
        {"OMP_NUM_THREADS=100000", "the CPU backend uses at most 256 threads", "stage1 | cpu0, 256 threads |"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd, "%s %s/stage1 " SMALL " --steps 1 --epochs 1", cases[i].env, test_root());
        ck_assert_msg(test_run(cmd, &out) == 0, "%s:\n%s", cases[i].env, out);
        ck_assert_msg(strstr(out, cases[i].warning) && strstr(out, cases[i].header), "%s:\n%s", cases[i].env, out);
        free(out);
        snprintf(cmd, sizeof cmd, "%s timeout -k 5 120 %s/stage3 " SMALL " --steps 1 --epochs 1 --nproc-per-node 2 "
                 "--standalone", cases[i].env, test_root());
        ck_assert_msg(test_run(cmd, &out) == 0, "%s:\n%s", cases[i].env, out);
        const char *said = strstr(out, cases[i].warning);
        ck_assert_msg(said && !strstr(said + strlen(cases[i].warning), cases[i].warning), "%s, stage 3:\n%s",
                      cases[i].env, out);
        free(out);
    }
}
END_TEST

/* --memory-fraction (torch.cuda.set_per_process_memory_fraction) caps exactly what the device
 * accounts: a run whose cap is its own peak (uncapped) runs as before; one 512-byte allocation
 * unit less and it stops with the out-of-memory error naming the flag, exit 1. So the cap and the
 * account are the same bytes, and an out-of-memory is a clear error, not a crash. On the CPU
 * backend the total is the host's RAM; on a GPU, its memory, and there a batch too large for the
 * GPU itself must fail the same way. */
static void memory_fraction_case(DeviceKind kind, const char *base) {
    Device d = {0};
    device_init(&d, kind, 0, 0);
    const double total = (double)d.mem_total;
    device_destroy(&d);
    /* The fraction is of the total — never of what is free (torch: total_memory) — asked here of the
     * kernel directly on the CPU backend: sysinfo's totalram (not /proc/meminfo, which a container's
     * lxcfs may rewrite to its own limit). */
    struct sysinfo si;
    if (kind == DEV_CPU && sysinfo(&si) == 0)
        ck_assert_msg(fabs(total - (double)si.totalram * si.mem_unit) < (double)sysconf(_SC_PAGESIZE),
                      "CPU total %.0f bytes, the kernel's %.0f (free %.0f)", total, (double)si.totalram * si.mem_unit,
                      (double)si.freeram * si.mem_unit);
    char *dir = test_tmpdir(), args[2048], rep[512], *out;
    snprintf(rep, sizeof rep, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "%s --steps 3 --epochs 1 --report %s", base, rep);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "%s:\n%s", args, out);
    free(out);
    double peak = 0, again = 0;
    ck_assert_int_eq(test_report_list(rep, "summary", "peak_mem_bytes", &peak, 1), 1);
    ck_assert(peak > 0);
    /* a cap of exactly the peak (the fraction whose product with the total truncates to it, as
     * device.c's memory_cap computes): every byte up to the cap may be used, as under PyTorch's */
    double f = peak / total;
    while ((double)(size_t)(f * total) < peak) f = nextafter(f, 1.0);
    ck_assert_msg((double)(size_t)(f * total) == peak, "no fraction caps at exactly %.0f B", peak);
    snprintf(args, sizeof args, "%s --steps 3 --epochs 1 --report %s --memory-fraction %.17g", base, rep, f);
    ck_assert_msg(run_stage("stage1", args, &out) == 0, "a cap at the run's own peak (%.0f B) refused it:\n%s",
                  peak, out);
    free(out);
    ck_assert_int_eq(test_report_list(rep, "summary", "peak_mem_bytes", &again, 1), 1);
    ck_assert_msg(again == peak, "peak %.0f B under the cap, %.0f B without", again, peak);
    snprintf(args, sizeof args, "%s --steps 3 --epochs 1 --memory-fraction %.17g", base, (peak - 256) / total);
    int rc = run_stage("stage1", args, &out);
    printf("stage1 %s: peak %.0f B; --memory-fraction at it runs, 256 B below it exits %d\n",
           kind == DEV_CPU ? "cpu" : "cuda", peak, rc);
    ck_assert_msg(rc == 1, "a cap below the peak: exit %d, expected 1:\n%s", rc, out);
    ck_assert_msg(strstr(out, "cannot allocate") && strstr(out, "--memory-fraction") &&
                      strstr(out, "hint: out of memory: raise --memory-fraction, or lower --batch-size (now "),
                  "the out-of-memory error does not name its fix:\n%s", out);
    /* The fix is in this run's terms: no smaller model to offer a run of the tiny one. */
    int tiny = strstr(base, "--model tiny") != NULL;
    ck_assert_msg(tiny == !strstr(out, "or use --model tiny"), "the hint %s --model tiny:\n%s",
                  tiny ? "offers the tiny model to a run of it" : "does not offer", out);
    ck_assert_msg(!strncmp(out, "error: ", 7) || strstr(out, "\nerror: "), "not an error: line:\n%s", out);
    free(out);
    /* A cap the parameters themselves do not fit in: no batch size helps, and the hint does not offer one. */
    snprintf(args, sizeof args, "%s --steps 3 --epochs 1 --memory-fraction %.17g", base, 1024.0 / total);
    rc = run_stage("stage1", args, &out);
    ck_assert_msg(rc == 1 && strstr(out, "for parameters") && strstr(out, "the model's own state does not fit") &&
                      !strstr(out, "--batch-size"),
                  "parameters that do not fit: exit %d\n%s", rc, out);
    free(out);
    /* A fraction so small that its cap rounds to 0 bytes is still a cap (torch: every allocation
     * fails), not the "no cap" that a limit of 0 means to the account */
    snprintf(args, sizeof args, "%s --steps 3 --epochs 1 --memory-fraction 1e-30", base);
    rc = run_stage("stage1", args, &out);
    ck_assert_msg(rc == 1 && strstr(out, "raise --memory-fraction"),
                  "--memory-fraction 1e-30 (a cap of 0 bytes): exit %d, expected 1 with the out-of-memory error\n%s",
                  rc, out);
    free(out);
    if (kind == DEV_CUDA) { /* and a real one, where cudaMalloc fails: ResNet-18 at batch 32767 (the largest
                             * its 32-bit indexing allows: model.c) plans 145 GiB of activations alone (the
                             * CPU backend's figure), more than an H200's 141 GB */
        rc = run_stage("stage1", "--device cuda --model resnet18 --batch-size 32767 --train-size 32767 "
                                 "--test-size 256 --steps 1 --epochs 1 --progress off", &out);
        ck_assert_msg(rc == 1 && strstr(out, "cannot allocate") &&
                          strstr(out, "hint: out of memory: lower --batch-size (now 32767), or use --model tiny"),
                      "batch 32767: exit %d, expected 1 with the out-of-memory error:\n%s", rc, out);
        free(out);
    }
    free(dir);
}

typedef struct {
    const char *what;
    int smaller_model;
} OomCase;

static void oom_child(void *arg) {
    const OomCase *c = arg;
    Device d = {0};
    device_init(&d, DEV_CPU, 0, 0);
    device_oom_smaller_model = c->smaller_model;
    snprintf(device_oom_fix, sizeof device_oom_fix, "lower --batch-size (now 64)%s",
             c->smaller_model ? ", or use --model tiny" : "");
    d.mem_limit = d.mem_cur + 4096; /* as --memory-fraction would cap it */
    device_alloc(&d, 8192, c->what);
}

/* Out of memory for the model's own state — its parameters, their gradients, the optimizer's
 * buffers — no batch size helps: the hint says so and offers a smaller model only where one exists;
 * for anything else (activations), the batch. memory_fraction_case reaches only "parameters" (the
 * first allocation), and checks its hint without the model part: "gradients" taken for a batch
 * buffer, or the smaller model offered to a tiny run and withheld from ResNet-18, passed it. */
START_TEST(out_of_memory_hint_fits_what_did_not_fit) {
    const OomCase cases[] = {{"parameters", 1}, {"gradients", 1}, {"gradients", 0}, {"optimizer momentum", 1},
                             {"optimizer exp_avg (adam)", 0}, {"activations", 1}, {"activations", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const OomCase *c = &cases[i];
        char *out = NULL, head[96];
        int st = test_run_captured(oom_child, (void *)c, &out);
        snprintf(head, sizeof head, "cannot allocate 0.0 MiB for %s (", c->what);
        const int own = strcmp(c->what, "activations") != 0;
        ck_assert_msg(st == 1 && strstr(out, head) && strstr(out, "hint: out of memory: raise --memory-fraction"),
                      "%s: exit %d\n%s", c->what, st, out);
        ck_assert_msg(own == (strstr(out, "the model's own state does not fit, whatever the batch") != NULL) &&
                          own == !strstr(out, "--batch-size"),
                      "%s: the hint %s the batch size:\n%s", c->what, own ? "offers" : "does not offer", out);
        ck_assert_msg(c->smaller_model == (strstr(out, "use --model tiny") != NULL), "%s: the hint %s --model tiny:\n%s",
                      c->what, c->smaller_model ? "does not offer" : "offers", out);
        free(out);
    }
}
END_TEST

/* Only where the test below runs it: sanitizer builds skip it (an unused-function warning there). */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static void uncapped_oom_child(void *arg) {
    (void)arg;
    Device d = {0};
    device_init(&d, DEV_CPU, 0, 0); /* --memory-fraction not given: 1 */
    device_alloc(&d, (size_t)1 << 62, "activations"); /* past any address space */
}
#endif

/* --memory-fraction 1 (the default) sets no cap (device.h): a request the machine cannot meet is the
 * device's own out-of-memory, whose hint does not tell the user to raise a fraction they never set.
 * The capped runs above all set one below 1, so a default taken for a cap at the whole RAM passed. */
START_TEST(out_of_memory_without_a_fraction_names_none) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("SKIP: e2e: an impossible allocation — the sanitizer's allocator reports it itself\n");
#else
    ck_assert_msg(device_memory_fraction == 1.0, "the default fraction is %g", device_memory_fraction);
    char *out = NULL;
    int st = test_run_captured(uncapped_oom_child, NULL, &out);
    ck_assert_msg(st == 1 && strstr(out, "cannot allocate") && strstr(out, "for activations") &&
                      strstr(out, "hint: out of memory: ") && !strstr(out, "memory-fraction"),
                  "exit %d:\n%s", st, out);
    free(out);
#endif
}
END_TEST

/* The bar shows a loss only once one has been read back (every --log-every steps): before that "–",
 * never a 0.0000 that looks like a result. */
START_TEST(stage1_progress_bar_waits_for_a_loss) {
    char *out = NULL;
    int rc = run_stage("stage1", "--device cpu --model tiny --train-size 512 --test-size 64 --batch-size 32 "
                                 "--steps 3 --epochs 1 --log-every 1000 --progress on", &out);
    ck_assert_msg(rc == 0 && strstr(out, "] 1/16  loss –  ETA") && !strstr(out, "loss 0.0000"), "%s", out);
    free(out);
}
END_TEST

START_TEST(stage1_memory_fraction_caps_the_account) {
    memory_fraction_case(DEV_CPU, SMALL);
    /* Where the stage accumulates, the hint says how to keep the optimizer's batch while the micro-batch
     * shrinks (stage 4 runs 4 micro-batches a step by default). */
    char args[512], *out;
    Device d = {0};
    device_init(&d, DEV_CPU, 0, 0);
    const double total = (double)d.mem_total; /* a cap of 4 MiB: the model's state fits, the step's arena does not */
    device_destroy(&d);
    snprintf(args, sizeof args, SMALL " --steps 1 --epochs 1 --nproc-per-node 1 --master-port %d --memory-fraction %.17g",
             test_free_port(), 4194304.0 / total);
    int rc = run_stage("stage4", args, &out);
    ck_assert_msg(rc == 1 && strstr(out, "lower --batch-size (now 32); raise --accum-steps (now 4) as --batch-size "
                                         "falls to keep the optimizer's batch"),
                  "stage4 out of memory: exit %d, hint without accumulation:\n%s", rc, out);
    free(out);
    if (test_have_gpu("e2e: --memory-fraction on a GPU"))
        memory_fraction_case(DEV_CUDA, "--device cuda --model resnet18 --train-size 1024 --test-size 256 "
                                       "--batch-size 128 --progress off");
}
END_TEST

/* Every float of a checkpoint — parameters, buffers, optimizer state: from the end of its 256-byte
 * header to its 8-byte checksum — is finite. */
static int checkpoint_finite(const char *path) {
    long len;
    char *ck = test_slurp(path, &len);
    ck_assert_msg(ck && len > 264, "%s", path);
    int finite = 1;
    for (long off = 256; off + 4 <= len - 8 && finite; off += 4) {
        float v;
        memcpy(&v, ck + off, 4);
        finite = isfinite(v);
    }
    free(ck);
    return finite;
}

/* A run whose state turns NaN or inf (an --lr far too high) used to train on, print "final train loss
 * -nan" and exit 0, having saved the NaN state and let --keep-last 1 prune the good checkpoint for it.
 * It stops at the end of the epoch it diverged in (exit 2), saying so and naming the last good
 * checkpoint, which stays, alone; one that diverges in its first epoch saves nothing; without --save it
 * stops too; in a job of two ranks rank 0 says why and the launcher names it; a finite state whose
 * forward overflows (a NaN test loss) stops the same way, unless that is fp16's range alone. */
START_TEST(stage1_divergence_stops_and_keeps_the_good_checkpoint) {
    char *dir = test_tmpdir(), args[2048], path[700], want[800], *out;
    const char *wild = "--device cpu --model tiny --train-size 256 --test-size 128 --epochs 3 --momentum 0.999 "
                       "--weight-decay 1 --progress off --deterministic";
    /* --lr 20: epoch 1 ends finite (a train loss of 1e19), epoch 2 does not */
    for (int ddp = 0; ddp < 2; ddp++) {
        snprintf(args, sizeof args, "%s --lr 20 --save %s/%s --keep-last 1 --report %s/%s.jsonl %s", wild, dir,
                 ddp ? "c" : "a", dir, ddp ? "c" : "a",
                 ddp ? "--nproc-per-node 2 --batch-size 16" : "--batch-size 32"); /* 8 steps an epoch */
        if (ddp) snprintf(args + strlen(args), sizeof args - strlen(args), " --master-port %d", test_free_port());
        int rc = run_stage(ddp ? "stage3" : "stage1", args, &out);
        snprintf(path, sizeof path, "%s/%s/epoch001.ckpt", dir, ddp ? "c" : "a");
        snprintf(want, sizeof want, "the last good checkpoint, %s, is kept", path);
        ck_assert_msg(rc == 2 && strstr(out, "training diverged in epoch 2 (step 16") && strstr(out, want) &&
                          strstr(out, "lower --lr (now 20)") && !strstr(out, "summary:"), "exit %d:\n%s", rc, out);
        ck_assert_msg(!ddp || (strstr(out, "job failed: rank 0 (local rank 0") &&
                               strstr(out, "exited with code 2 after step 16, evaluating or at the epoch's checkpoint (first failure)") &&
                               strstr(out, "rank 1: training diverged")), "%s", out);
        free(out);
        /* the report ends with how the run ended: a "diverged" record (rank 0's), not a bare epoch */
        char rep_path[700], last[900];
        snprintf(rep_path, sizeof rep_path, "%s/%s.jsonl", dir, ddp ? "c" : "a");
        char *rep = test_slurp(rep_path, NULL), *nl = rep ? strrchr(rep, '\n') : NULL;
        ck_assert_msg(nl && nl[1] == 0, "%s: no report, or its last line unfinished", rep_path);
        *nl = 0;
        nl = strrchr(rep, '\n');
        snprintf(last, sizeof last, "\"last_checkpoint\":\"%s\"", path);
        const char *head = "{\"type\":\"diverged\",\"epoch\":2,\"step\":16,";
        ck_assert_msg(nl && !strncmp(nl + 1, head, strlen(head)) &&
                          strstr(nl + 1, last) && strstr(nl + 1, "\"error\":\"training diverged in epoch 2") &&
                          !strstr(rep, "\"type\":\"summary\""), "%s: last record:\n%s", rep_path, nl ? nl + 1 : rep);
        free(rep);
        ck_assert_msg(checkpoint_finite(path), "%s holds a NaN or an inf", path);
        snprintf(path, sizeof path, "%s/%s/epoch002.ckpt", dir, ddp ? "c" : "a");
        ck_assert_msg(access(path, F_OK) != 0, "%s was written", path);
    }
    /* the audit's --lr 100: diverged in epoch 1, nothing saved */
    snprintf(args, sizeof args, "%s --batch-size 32 --lr 100 --save %s/b --keep-last 1", wild, dir);
    ck_assert_int_eq(run_stage("stage1", args, &out), 2);
    ck_assert_msg(strstr(out, "training diverged in epoch 1") && strstr(out, "no checkpoint was before it"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/b/epoch001.ckpt", dir);
    ck_assert_msg(access(path, F_OK) != 0, "%s was written", path);
    /* without --save: the same stop, no checkpoint named */
    snprintf(args, sizeof args, "%s --batch-size 32 --lr 20", wild);
    ck_assert_int_eq(run_stage("stage1", args, &out), 2);
    ck_assert_msg(strstr(out, "training diverged in epoch 2") && !strstr(out, "checkpoint"), "%s", out);
    free(out);
    /* a finite state whose forward overflows (weights near 1e34, no batch norm to tame them): the test
     * loss is NaN — the same stop, and no checkpoint of it (it used to be saved with exit 0, and a
     * resume of it then blamed the new --lr) */
    snprintf(args, sizeof args, "--device cpu --model tiny --norm none --train-size 64 --test-size 32 --batch-size 16 "
             "--epochs 2 --lr 100 --steps 3 --progress off --save %s/d", dir);
    ck_assert_int_eq(run_stage("stage1", args, &out), 2);
    ck_assert_msg(strstr(out, "the test loss is no longer finite") && strstr(out, "weights have grown so large"), "%s",
                  out);
    free(out);
    snprintf(path, sizeof path, "%s/d/step00000003.ckpt", dir);
    ck_assert_msg(access(path, F_OK) != 0, "%s was written", path);
    /* …but fp16's range is not the state's: a healthy fp16 run (its training loss finite) whose first
     * test forward overflows, batch norm's running statistics lagging the weights, trains on, saves,
     * and recovers (test loss NaN, then 37.6; the same on any number of CPU threads) */
    snprintf(args, sizeof args, "--device cpu --nproc-per-node 1 --model tiny --train-size 256 --test-size 64 "
             "--batch-size 32 --epochs 4 --steps 16 --lr 3 --amp fp16 --progress off --master-port %d --save %s/e",
             test_free_port(), dir); /* a port of its own: the default one may be another suite's */
    ck_assert_msg(run_stage("stage5", args, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "epoch 2/4") && strstr(out, "note: the test forward overflowed fp16's range") &&
                      strstr(out, "summary:") && !strstr(out, "diverged"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/e/epoch002.ckpt", dir);
    ck_assert_msg(checkpoint_finite(path), "%s is missing or holds a NaN or an inf", path);
    free(dir);
}
END_TEST

/* The other side of fp16's exception above: a finite state whose fp16 forward overflows in training
 * as well (its training loss NaN too) is diverged, not "early on" — every later step is skipped, so
 * it would train nothing more. The weights of two --lr 100 steps (finite in fp32: test loss 3e15)
 * resumed under --amp fp16 overflow at once. Without the training-loss condition the run took the
 * note and went on, exit 0, and saved the state as a good checkpoint. */
START_TEST(stage5_fp16_overflow_in_training_too_is_diverged) {
    char *dir = test_tmpdir(), args[2048], path[700], *out;
    const char *flags = "--device cpu --model tiny --norm none --train-size 64 --test-size 32 --batch-size 16 "
                        "--epochs 2 --lr 100 --progress off";
    snprintf(args, sizeof args, "%s --steps 2 --save %s/a", flags, dir);
    ck_assert_int_eq(run_stage("stage1", args, &out), 0);
    free(out);
    snprintf(args, sizeof args, "%s --nproc-per-node 1 --amp fp16 --master-port %d --resume %s/a/step00000002.ckpt "
             "--save %s/b", flags, test_free_port(), dir, dir);
    int rc = run_stage("stage5", args, &out);
    ck_assert_msg(rc == 2 && strstr(out, "train loss nan") && strstr(out, "test loss nan") &&
                      strstr(out, "training diverged in epoch 1 (step 4, train loss nan): the test loss is no longer "
                                  "finite") &&
                      !strstr(out, "note: the test forward overflowed fp16's range") && !strstr(out, "summary:"),
                  "exit %d:\n%s", rc, out);
    free(out);
    snprintf(path, sizeof path, "%s/b/epoch001.ckpt", dir);
    ck_assert_msg(access(path, F_OK) != 0, "%s was written", path);
    free(dir);
}
END_TEST

/* On CUDA, checkpoints are in PyTorch's order whatever --layout (model.h, "The public order"): a
 * channels-last run and an NCHW run save the same parameters after 5 steps, and a channels-last
 * checkpoint resumed with --layout nchw ends where the channels-last run does. Not bit for bit
 * (cuDNN's NHWC and NCHW kernels sum in other orders; TF32 off, deterministic algorithms: plain
 * fp32), and five SGD steps through batch norm amplify those last-bit differences: on an H200 the
 * two runs ended 3.3e-4 apart (relative to the largest parameter). So within 1e-2: a checkpoint
 * saved or loaded in the storage order (conv weights KRSC) would be off by O(1). */
START_TEST(stage1_cuda_checkpoints_cross_layouts) {
    if (!test_have_gpu("e2e: ./stage1 checkpoints across --layout nhwc / nchw")) return;
    char *dir = test_tmpdir(), args[2048], *out, pa[512], pb[512];
    const char *common = "--device cuda --model tiny --train-size 512 --test-size 256 --batch-size 32 --epochs 1 "
                         "--deterministic --no-tf32 --progress off";
    const char *runs[4][3] = {{"nhwc", "10", "a"}, {"nhwc", "5", "b"}, {"nchw", "5", "c"}, {"nchw", "10", "d"}};
    for (int i = 0; i < 4; i++) {
        int resume = i == 3; /* d continues b's channels-last checkpoint in NCHW */
        snprintf(args, sizeof args, "%s --layout %s --steps %s --save %s/%s%s%s%s", common, runs[i][0], runs[i][1], dir,
                 runs[i][2], resume ? " --resume " : "", resume ? dir : "", resume ? "/b/step00000005.ckpt" : "");
        ck_assert_msg(run_stage("stage1", args, &out) == 0, "stage1 %s:\n%s", args, out);
        ck_assert_msg(!resume || strstr(out, "resumed from"), "%s", out);
        free(out);
    }
    const char *pairs[2][2] = {{"b", "c"}, {"a", "d"}}, *step[2] = {"00000005", "00000010"};
    for (int k = 0; k < 2; k++) {
        snprintf(pa, sizeof pa, "%s/%s/step%s.ckpt", dir, pairs[k][0], step[k]);
        snprintf(pb, sizeof pb, "%s/%s/step%s.ckpt", dir, pairs[k][1], step[k]);
        float *x = test_load_params(pa, "tiny", 1), *y = test_load_params(pb, "tiny", 1);
        double err = test_rel_err(y, x, test_n_params("tiny"));
        printf("stage1 CUDA checkpoints, %s (nhwc) vs %s (nchw%s): parameters differ by %.2e\n", pairs[k][0],
               pairs[k][1], k ? ", resumed from b" : "", err);
        ck_assert_msg(err <= 1e-2, "%s vs %s: parameters differ by %.3g", pa, pb, err);
        free(x), free(y);
    }
    free(dir);
}
END_TEST

/* Each stage's epoch line and record carry the wait its loader measured: with --workers 0 every batch
 * is built in the training thread, which waits for it all that time (PyTorch's data time), so the
 * data wait is above 0 — in every stage, each of which hands its loader's figure to the epoch's end. */
START_TEST(every_stage_reports_its_loaders_data_wait) {
    char *dir = test_tmpdir(), cmd[2048], path[600], *out;
    const char *stages[] = {"stage1", "stage2", "stage3 --nproc-per-node 1", "stage4 --nproc-per-node 1",
                            "stage5 --nproc-per-node 1"};
    for (int i = 0; i < 5; i++) {
        char port[32] = ""; /* the launched stages get a free rendezvous port */
        if (i >= 2) snprintf(port, sizeof port, " --master-port %d", test_free_port());
        snprintf(path, sizeof path, "%s/r%d.jsonl", dir, i);
        snprintf(cmd, sizeof cmd, "timeout 300 %s/%s --device cpu --model tiny --train-size 128 --test-size 32 "
                 "--batch-size 32 --epochs 1 --workers 0 --progress off%s --report %s", test_root(), stages[i], port,
                 path);
        test_run_ok(cmd, stages[i], &out);
        double wait = test_report_field(path, "epoch", "data_wait_s");
        ck_assert_msg(wait > 0, "%s --workers 0: the epoch's data wait is %g s:\n%s", stages[i], wait, out);
        free(out);
    }
    free(dir);
}
END_TEST

typedef struct {
    const char *report;
    int evaluated;
} UnpreparedRun;

/* What a stage's main does around one forward of a batch size it never prepared (3; it prepared 4),
 * then either run_evaluated (--evaluate) or run_finish's summary. */
static void unprepared_run_child(void *arg) {
    const UnpreparedRun *u = arg;
    TrainConfig cfg;
    config_defaults(&cfg);
    cfg.device = "cpu", cfg.model = "tiny", cfg.progress = "off", cfg.report = u->report;
    config_resolve(&cfg, 0, 1);
    Device dev = {0};
    device_init(&dev, DEV_CPU, 0, 0);
    Model *m = model_create(&dev, "tiny", 1, 4, 1);
    model_prepare(m, 4);
    Optimizer opt;
    optim_init(&opt, &dev, m->n_param_floats, 0.1, 0.9, 0);
    Device *devs[1] = {&dev};
    Run run;
    run_begin(&run, &cfg, "stage1", devs, 1, 1, 0, NULL, NULL, m, &opt, 1, "synthetic");
    static float x[3 * IMG_PIXELS];
    test_fill_uniform(x, 3 * IMG_PIXELS, 5, -1, 1);
    model_forward(m, 3, x, 0);
    if (u->evaluated) run_evaluated(&run, 0.5, 1.0);
    run_finish(&run);
}

/* The other side of every_stage_prepares_its_short_batches, which wants 0 everywhere: a forward of a size
 * never prepared shows in the report that ends the run — the "summary" record, or "evaluate" under
 * --evaluate — and in the console note that names the fix. No stage misses a size (that test), so this
 * drives the trainer as a stage's main does; a record that always wrote 0 passed every run. */
START_TEST(unprepared_forwards_reach_the_report) {
    char *dir = test_tmpdir(), path[600];
    for (int evaluated = 0; evaluated < 2; evaluated++) {
        snprintf(path, sizeof path, "%s/r%d.jsonl", dir, evaluated);
        UnpreparedRun u = {path, evaluated};
        char *out = NULL;
        int st = test_run_captured(unprepared_run_child, &u, &out);
        const char *type = evaluated ? "evaluate" : "summary";
        ck_assert_msg(st == 0, "exit %d:\n%s", st, out);
        ck_assert_msg(test_report_field(path, type, "unprepared_forwards") == 1, "%s: the record has %g", type,
                      test_report_field(path, type, "unprepared_forwards"));
        ck_assert_msg(strstr(out, "note: 1 forward pass ran a batch size never prepared (the last: 3)") &&
                          strstr(out, "call model_prepare at setup for every batch size"),
                      "%s: no note naming the fix:\n%s", type, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Every stage plans its convolutions at setup for each batch size it will run — the short last batch
 * of training (of a rank's shard; of DataParallel's chunks) and of evaluation included — so no step
 * plans inside its timing (model.h: model_prepare). 144 training and 44 test images leave short
 * batches everywhere, no two of one size: 16 of 144 (one process, batch 32), 8 + 8 of DataParallel's
 * 64 (one per replica, both counted), 8 of a rank's 72, and 12 or 22 of the test set. On the CPU a
 * missed size costs nothing, so the count is what shows it; with a GPU visible, stages 1 and 5 run
 * there too. */
START_TEST(every_stage_prepares_its_short_batches) {
    char *dir = test_tmpdir(), cmd[2048], path[600], *out;
    const struct { const char *stage, *dev; } runs[] = {
        {"stage1", "cpu"}, {"stage2", "cpu"}, {"stage3 --nproc-per-node 2", "cpu"},
        {"stage4 --nproc-per-node 2", "cpu"}, {"stage5 --nproc-per-node 2", "cpu"},
        {"stage1", "cuda"}, {"stage5 --nproc-per-node 1", "cuda"}};
    const int n_runs = test_have_gpu("every stage prepares its short batches, on a GPU") ? 7 : 5;
    for (int i = 0; i < n_runs; i++) {
        char port[32] = "";
        if (strstr(runs[i].stage, "nproc")) snprintf(port, sizeof port, " --master-port %d", test_free_port());
        snprintf(path, sizeof path, "%s/r%d.jsonl", dir, i);
        snprintf(cmd, sizeof cmd, "timeout 300 %s/%s --device %s --model tiny --train-size 144 --test-size 44 "
                 "--batch-size 32 --epochs 1 --progress off%s --report %s", test_root(), runs[i].stage, runs[i].dev,
                 port, path);
        test_run_ok(cmd, runs[i].stage, &out);
        double n = test_report_field(path, "summary", "unprepared_forwards");
        ck_assert_msg(n == 0 && !strstr(out, "never prepared"), "%s on %s: %g forward passes ran a batch size "
                      "model_prepare never planned:\n%s", runs[i].stage, runs[i].dev, n, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* A count of one took a plural: "1 steps/epoch", "1 optimizer steps/epoch (1 micro-batches)", "the run
 * ended after 1 steps", "trace: … of steps 0–0", "over 1 images", "DataParallel phases over 1 steps",
 * step_skew.py's "1 steps". Runs that make each count 1, and no "1 <plural>" in what they print. */
START_TEST(a_count_of_one_is_singular) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    const char *one = "--device cpu --model tiny --test-size 1 --epochs 1 --progress off";
    snprintf(cmd, sizeof cmd, "(D=%s; R=%s; P='--master-port %d'; "
             "$R/stage1 %s --train-size 1 --batch-size 1 --trace $D/a.json --trace-steps 0:5 --save $D/c; "
             "$R/stage1 --device cpu --test-size 1 --progress off --evaluate --resume $D/c/epoch001.ckpt; "
             "$R/stage4 %s --nproc-per-node 1 --train-size 1 --batch-size 1 --accum-steps 2 $P; "
             "$R/stage2 %s --gpus 2 --train-size 12 --batch-size 1; "
             "$R/stage3 %s --nproc-per-node 2 --train-size 16 --batch-size 1 --steps 4 --trace $D/b.json "
             "--trace-steps 1:2 $P && python3 $R/tests/step_skew.py $D/b.json; "
             "$R/stage3 %s --nproc-per-node 2 --train-size 2 --batch-size 1 --unused-param --find-unused-parameters $P)",
             dir, test_root(), test_free_port(), one, one, one, one, one);
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "1 epoch, 1 step/epoch |") && strstr(out, "of step 0 in") &&
                      strstr(out, "the run ended after 1 step, inside") && strstr(out, "test set synthetic") &&
                      strstr(out, "1 image |") && strstr(out, "over 1 image of") &&
                      strstr(out, "1 optimizer step/epoch (1 micro-batch)") &&
                      strstr(out, "more than the 1 micro-batch of an epoch: one optimizer step per epoch, over it") &&
                      strstr(out, "DataParallel phases over 1 step (") && strstr(out, "of step 1 from 2 ranks") &&
                      strstr(out, "2 workers (ranks, or stage 2's replicas), 1 step;") &&
                      strstr(out, "| 1 used-parameter map all-reduce ("), "%.3000s", out);
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "(^|[^0-9.,])1 (optimizer |used-parameter map )?(steps|images|micro-batches|workers|"
                                  "batches|all-reduces)([^a-z]|$)",
                             REG_EXTENDED | REG_NEWLINE), 0);
    regmatch_t m;
    int hit = regexec(&re, out, 1, &m, 0) == 0;
    ck_assert_msg(!hit, "a plural after 1: '%.60s'", hit ? out + m.rm_so : "");
    regfree(&re);
    free(out), free(dir);
}
END_TEST

Suite *suite_e2e(void) {
    Suite *s = suite_create("e2e");
    TCase *tc = tcase_create("stage1");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, stage1_cpu_learns);
    tcase_add_test(tc, stage1_resume_is_bit_identical);
    tcase_add_test(tc, stage1_deterministic_across_workers);
    tcase_add_test(tc, stage1_same_bits_on_any_cpu_thread_count);
    tcase_add_test(tc, stage1_odd_omp_num_threads_warns);
    tcase_add_test(tc, stage1_report_says_where_the_run_is);
    tcase_add_test(tc, stage1_cpu_names_gpu_only_flags);
    tcase_add_test(tc, stage1_warmup_and_last_step_untimed);
    tcase_add_test(tc, stage1_bad_input_is_refused_clearly);
    tcase_add_test(tc, stage1_each_step_uses_its_scheduled_lr);
    tcase_add_test(tc, stage1_says_why_a_closed_pipe_stopped_it);
    tcase_add_test(tc, stage1_memory_fraction_caps_the_account);
    tcase_add_test(tc, out_of_memory_hint_fits_what_did_not_fit);
    tcase_add_test(tc, out_of_memory_without_a_fraction_names_none);
    tcase_add_test(tc, every_stage_reports_its_loaders_data_wait);
    tcase_add_test(tc, every_stage_prepares_its_short_batches);
    tcase_add_test(tc, unprepared_forwards_reach_the_report);
    tcase_add_test(tc, stage1_progress_bar_waits_for_a_loss);
    tcase_add_test(tc, stage1_divergence_stops_and_keeps_the_good_checkpoint);
    tcase_add_test(tc, stage5_fp16_overflow_in_training_too_is_diverged);
    tcase_add_test(tc, stage1_cuda_checkpoints_cross_layouts);
    suite_add_tcase(s, tc);
    tc = tcase_create("plural");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, a_count_of_one_is_singular);
    suite_add_tcase(s, tc);
    return s;
}
