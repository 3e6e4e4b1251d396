/* test_trace.c — --trace on the CPU backend: stages 1, 2 (two devices) and 3 (two workers) write a
 * Chrome trace-event file that parses, holds the spans each stage must show, nests per thread and
 * covers exactly the --trace-steps window (tests/trace_check.py checks the file); the SVG renderer
 * draws it; tests/step_skew.py reads every worker's steps from it; bad --trace-steps values and
 * unwritable paths are refused with a clear error; an interrupted run leaves the trace already at
 * its path intact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests.h"
#include "trace.h"

#define SMALL "--device cpu --model tiny --train-size 256 --test-size 32 --batch-size 16 --epochs 1 --progress off"

static int have_python(void) {
    static int have = -1;
    if (have < 0) {
        have = system("python3 -c 'import json' >/dev/null 2>&1") == 0;
        if (!have) printf("SKIP trace: python3 is missing (tests/trace_check.py validates the trace files)\n");
    }
    return have;
}

/* Run a stage with --trace into dir/t.json, then the checker; fail with both outputs. pids: the
 * processes (ranks); workers: the compute lanes that train side by side (ranks, or stage 2's replicas). */
static void trace_and_check(const char *stage, const char *args, const char *window, int pids, int workers,
                            const char *expect) {
    char *dir = test_tmpdir(), cmd[4096], *out, *chk;
    snprintf(cmd, sizeof cmd, "%s/%s " SMALL " %s --trace %s/t.json --trace-steps %s", test_root(), stage, args, dir,
             window);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s failed (%d):\n%s", stage, rc, out);
    ck_assert_msg(strstr(out, "trace: "), "%s printed no trace line:\n%s", stage, out);
    ck_assert_msg(!strstr(out, "dropped"), "%s: spans dropped, or a note about none:\n%s", stage, out);
    /* the line's span count is the file's (merged: every rank's) */
    int said = -1, spans = 0;
    ck_assert(sscanf(strstr(out, "trace: "), "trace: %d spans", &said) == 1);
    char file[600];
    snprintf(file, sizeof file, "%s/t.json", dir);
    char *json = test_slurp(file, NULL);
    ck_assert_msg(json, "%s not written", file);
    for (const char *p = json; (p = strstr(p, "\"ph\":\"X\"")); p++) spans++;
    ck_assert_msg(said == spans, "%s says %d spans, %s holds %d", stage, said, file, spans);
    free(json);
    snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py %s/t.json --steps %s --pids %d --expect %s",
             test_root(), dir, window, pids, expect);
    rc = test_run(cmd, &chk);
    ck_assert_msg(rc == 0, "%s's trace is wrong:\n%s\n(run output:\n%s)", stage, chk, out);
    /* the renderer draws it */
    snprintf(cmd, sizeof cmd, "python3 %s/tests/timeline.py %s/t.json %s/t.svg", test_root(), dir, dir);
    free(chk);
    rc = test_run(cmd, &chk);
    ck_assert_msg(rc == 0, "timeline.py failed:\n%s", chk);
    char path[512];
    snprintf(path, sizeof path, "%s/t.svg", dir);
    long len;
    char *svg = test_slurp(path, &len);
    ck_assert(svg && strstr(svg, "<svg") && strstr(svg, "</svg>") && strstr(svg, "forward"));
    /* step_skew.py: every worker's forward+backward, step by step (one worker alone is refused) */
    int a, b;
    ck_assert(sscanf(window, "%d:%d", &a, &b) == 2);
    snprintf(cmd, sizeof cmd, "python3 %s/tests/step_skew.py %s/t.json", test_root(), dir);
    free(chk);
    rc = test_run(cmd, &chk);
    char want[64];
    snprintf(want, sizeof want, "%d workers (ranks, or stage 2's replicas), %d steps", workers, b - a);
    if (workers > 1)
        ck_assert_msg(rc == 0 && strstr(chk, want) && strstr(chk, "waits for the others") && strstr(chk, "jitter costs"),
                      "step_skew.py on %s's trace (exit %d):\n%s", stage, rc, chk);
    else
        ck_assert_msg(rc != 0 && strstr(chk, "one worker only (one rank, or stage 2 with one device)"), "step_skew.py took one worker (exit %d):\n%s", rc, chk);
    free(svg), free(chk), free(out), free(dir);
}

START_TEST(stage1_trace) {
    if (!have_python()) return;
    trace_and_check("stage1", "--steps 7 --workers 2", "2:5", 1, 1,
                    "step input 'load batch' forward backward optimizer");
}
END_TEST

/* A window from the run's first step: step 0's span, and every span of batch 0, carry their n. */
START_TEST(window_from_step_0) {
    if (!have_python()) return;
    trace_and_check("stage1", "--steps 3 --workers 1", "0:2", 1, 1, "step input 'load batch' forward backward optimizer");
}
END_TEST

/* DataParallel: the phases on the main thread, each replica thread's forward with its GIL turns and
 * its planning (new threads every step: a plan-cache miss per convolution), backward on the
 * autograd threads, peer copies on device 0. */
START_TEST(stage2_trace) {
    if (!have_python()) return;
    trace_and_check("stage2", "--gpus 2 --steps 4", "1:3", 1, 2,
                    "scatter replicate gather reduce 'replica forward' 'replica backward' 'GIL held' planning "
                    "'peer copy' forward backward optimizer");
}
END_TEST

/* DDP: one process track per rank, merged; the buckets' all-reduces on the communication thread; with
 * --clip-grad-norm, its span on each compute stream. */
START_TEST(stage3_trace) {
    if (!have_python()) return;
    char args[256];
    snprintf(args, sizeof args, "--nproc-per-node 2 --steps 4 --bucket-mb 0.03 --clip-grad-norm 1 --master-port %d",
             test_free_port());
    trace_and_check("stage3", args, "1:3", 2, 2, "forward backward 'clip grad norm' optimizer all-reduce 'bucket launch'");
}
END_TEST

/* --steps A with --trace-steps A:B over ranks: the window opens as the run ends, and the trace holds no
 * span, as the run says — the final evaluation's all-reduces and broadcasts, after the last step, went
 * into it ("the trace holds no spans", then "16 spans from 2 ranks merged"). */
START_TEST(window_opening_at_the_end_holds_nothing) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 %s/stage3 " SMALL " --workers 0 --nproc-per-node 2 --steps 2 "
             "--master-port %d --trace %s/t.json --trace-steps 2:4 && python3 -c \"import json,sys; "
             "d=json.load(open('%s/t.json')); sys.exit(any(e['ph']=='X' for e in d['traceEvents']))\"",
             test_root(), test_free_port(), dir, dir);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "the trace holds no spans") && strstr(out, "trace: 0 spans from 2 ranks"),
                  "exit %d:\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* Stage 4 accumulates K = 4 micro-batches per optimizer step, and its ranks wait for each other once a
 * step: step_skew.py counts the window's 3 optimizer steps, each its 4 forwards and backwards together
 * (it paired every forward with its backward and printed "12 steps", each rank's wait per micro-batch). */
START_TEST(stage4_step_skew_counts_optimizer_steps) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 %s/stage4 " SMALL " --train-size 1024 --workers 0 --nproc-per-node 2 --steps 6 "
             "--master-port %d --trace %s/t.json --trace-steps 2:5 > /dev/null && python3 %s/tests/step_skew.py %s/t.json",
             test_root(), test_free_port(), dir, test_root(), dir);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "2 workers (ranks, or stage 2's replicas), 3 steps;") &&
                  strstr(out, "waits for the others"), "exit %d:\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* Stage 2 on 4 devices, 9 images of batch 2 (8 a step): step 1 is an epoch's last, 1 image, a chunk
 * for device 0 alone; step 2 is the next epoch's first, all four. step_skew.py took each lane's spans
 * in order and cut them to the shortest lane, so device 0's step 1 (one image, alone) was paired with
 * the others' step 2, and their "waits" were made up. Each device span now records its optimizer step
 * (args.step) and step_skew.py compares the steps every worker ran: device 0's figure is its step 2
 * (its last forward's start to its last backward's end), and the step it ran alone is left out. The
 * same key groups an epoch's short last group of micro-batches (stage 4) as the one step it is. */
START_TEST(step_skew_pairs_devices_by_step) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "(D=%s; R=%s; timeout -k 5 120 $R/stage2 --device cpu --model tiny --progress off --gpus 4 "
             "--train-size 9 --test-size 1 --batch-size 2 --epochs 2 --trace $D/t.json --trace-steps 1:3 > /dev/null "
             "&& python3 $R/tests/step_skew.py $D/t.json && python3 -c \"import json; "
             "d = json.load(open('$D/t.json'))['traceEvents']; "
             "t = lambda n: sorted(e['ts'] + (e['dur'] if n == 'backward' else 0) for e in d "
             "if e.get('ph') == 'X' and e['name'] == n and e['tid'] == 1000); "
             "print('device 0 step 2: %%.3f' %% ((t('backward')[-1] - t('forward')[-1]) / 1e3))\")",
             dir, test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "4 workers (ranks, or stage 2's replicas), 1 step;") &&
                      strstr(out, "left out: 1 step in which some worker had nothing to run"), "exit %d:\n%s", rc, out);
    const char *dev0 = strstr(out, "cpu dev0 compute (wall clock): median "), *want = strstr(out, "device 0 step 2: ");
    ck_assert_msg(dev0 && want, "%s", out);
    double got = atof(dev0 + strlen("cpu dev0 compute (wall clock): median ")), expect = atof(want + 17);
    ck_assert_msg(fabs(got - expect) < 0.0015, "device 0: step_skew says %.3f ms, its step 2 took %.3f ms:\n%s", got,
                  expect, out);
    free(out);
    /* Stage 4, K = 4, 6 micro-batches a rank an epoch: optimizer steps of 4 and 2. A window over one
     * of each (steps 1–3) used to read as 8 steps — the spans did not divide by the 3 step spans, so
     * each micro-batch was counted as a step of its own */
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 %s/stage4 --device cpu --model tiny --progress off --workers 0 "
             "--nproc-per-node 2 --train-size 24 --batch-size 2 --accum-steps 4 --test-size 2 --epochs 3 "
             "--master-port %d --trace %s/a.json --trace-steps 1:4 > /dev/null && python3 %s/tests/step_skew.py %s/a.json",
             test_root(), test_free_port(), dir, test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "2 workers (ranks, or stage 2's replicas), 3 steps;"), "exit %d:\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* The window lies beyond the run, or before a resumed one: a valid file with no spans, and a note
 * saying why. */
START_TEST(window_after_the_run) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --steps 2 --trace %s/t.json && python3 -c \"import json,sys; "
             "d=json.load(open('%s/t.json')); sys.exit(any(e['ph']=='X' for e in d['traceEvents']))\"",
             test_root(), dir, dir);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "(%d)\n%s", rc, out);
    ck_assert_msg(strstr(out, "ended before step 5"), "%s", out);
    free(out);
    /* --steps A: the window opens as the run ends, and no step of it ran — said, not silent */
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --steps 1 --trace %s/a.json --trace-steps 1:2", test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "the run ended before step 1, where --trace-steps 1:2 begins"), "(%d)\n%s",
                  rc, out);
    free(out);
    /* or before it: a run resumed at step 5 with --trace-steps 2:5 traces nothing, and says why (it
     * used to say the run "ended before step 2") — and writes nothing: resumed with the command that
     * traced steps 2–4 before the stop, it used to replace that trace with an empty one */
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --workers 0 --steps 5 --save %s/c --trace %s/r.json --trace-steps 2:5",
             test_root(), dir, dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "spans of steps 2–4 in"), "(%d)\n%s", rc, out);
    free(out);
    char path[600];
    snprintf(path, sizeof path, "%s/r.json", dir);
    long before_len = 0, after_len = 0;
    char *before = test_slurp(path, &before_len);
    ck_assert_msg(before && strstr(before, "\"ph\":\"X\""), "%s: %s", path, before);
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --workers 0 --steps 8 --resume %s/c/step00000005.ckpt --trace "
             "%s/r.json --trace-steps 2:5", test_root(), dir, dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "the run started at step 5, after the --trace-steps 2:5 window") &&
                  strstr(out, "writes no trace") && !strstr(out, "ended before"), "(%d)\n%s", rc, out);
    char *json = test_slurp(path, &after_len), tmp[620];
    ck_assert_msg(json && after_len == before_len && !memcmp(json, before, (size_t)before_len),
                  "%s: the earlier run's trace was replaced (%ld bytes, was %ld)", path, after_len, before_len);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ck_assert_msg(access(tmp, F_OK) != 0, "%s was left behind", tmp);
    free(json), free(before), free(out);
    /* the same over ranks: the merged file's line names no steps either (it said "steps -1–-2") */
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 %s/stage3 " SMALL " --steps 2 --nproc-per-node 2 --master-port %d "
             "--trace %s/m.json --trace-steps 100:200", test_root(), test_free_port(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "the run ended before step 100, where --trace-steps 100:200 begins") &&
                  strstr(out, "trace: 0 spans from 2 ranks merged into") && !strstr(out, "of steps -1"),
                  "(%d)\n%s", rc, out);
    free(out);
    /* a run that ends inside the window: the line names the steps the trace holds, not the window's */
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --workers 0 --steps 4 --trace %s/i.json --trace-steps 2:10",
             test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "spans of steps 2–3 in") &&
                  strstr(out, "the run ended after 4 steps, inside --trace-steps 2:10"), "(%d)\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

START_TEST(bad_trace_flags_refused) {
    const char *bad[] = {"5", "8:5", "3:3", "a:b", "-1:3", "1:", ":4", "0:5000", "0:1001", /* 1000 steps at most */
                         " 1:2", "1: 2", "+1:2", /* digits only (strtoll alone took these) */
                         "99999999999999999999:1", "9223372036854775806:9223372036854775807"}; /* out of range */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --steps 1 --trace /tmp/never.json --trace-steps '%s'",
                 test_root(), bad[i]);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2, "--trace-steps %s: exit %d, expected 2:\n%s", bad[i], rc, out);
        ck_assert_msg(strstr(out, "--trace-steps") && strstr(out, "error"), "%s", out);
        ck_assert_msg(!strstr(out, "summary:"), "--trace-steps %s: the run started:\n%s", bad[i], out);
        ck_assert_msg(strlen(bad[i]) < 20 || strstr(out, "out of range"), "--trace-steps %s:\n%s", bad[i], out);
        free(out);
    }
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --steps 1 --trace /nonexistent-dir/t.json", test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "--trace '/nonexistent-dir/t.json'"), "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

/* A FIFO used to hang --trace forever (opening it waits for a reader); a directory was found by stages
 * 3–5 only after training, at the merge. Both are refused before anything starts, in stage 3 before the
 * workers are launched; a merge that fails all the same (the name became a directory during the run)
 * says why, and where the ranks' timelines are. */
START_TEST(unwritable_trace_files_fail_at_once) {
    char *dir = test_tmpdir(), cmd[4096], path[600], *out;
    snprintf(path, sizeof path, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage1 " SMALL " --steps 8 --trace %s", test_root(), path);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "is a FIFO: give it a regular file"), "exit %d:\n%s", rc, out);
    free(out);
    const char *stages[] = {"stage3", "stage4", "stage5"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/%s " SMALL " --steps 2 --nproc-per-node 2 --master-port %d "
                 "--trace %s", test_root(), stages[i], test_free_port(), dir);
        rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, "is a directory (give a file name") && !strstr(out, "launching") &&
                      !strstr(out, "epoch 1"), "%s: exit %d:\n%s", stages[i], rc, out);
        free(out);
    }
    /* a directory written with a trailing slash: the suggested name has one slash, not "dir//t.json" */
    snprintf(cmd, sizeof cmd, "%s/stage1 " SMALL " --steps 1 --trace %s/", test_root(), dir);
    rc = test_run(cmd, &out);
    char want[600];
    snprintf(want, sizeof want, "e.g. %s/trace.json)", dir);
    ck_assert_msg(rc == 2 && strstr(out, want), "exit %d, expected '%s':\n%s", rc, want, out);
    free(out);
    /* a whole epoch, so the name can be made a directory while it trains: minutes under a sanitizer */
    snprintf(cmd, sizeof cmd, "D=%s; (timeout -k 5 %d %s/stage3 " SMALL " --train-size 2048 --batch-size 8 "
             "--nproc-per-node 2 --master-port %d --trace $D/t.json --trace-steps 1:3 > $D/run.out 2>&1; "
             "echo \"exit $?\" >> $D/run.out) & run=$!; "
             "while ! [ -e $D/t.json.tmp -a -e $D/t.json.rank1.json.tmp ] && kill -0 $run 2>/dev/null; do sleep 0.01; "
             "done; mkdir $D/t.json; wait; cat $D/run.out", dir, (int)(100 * test_time_scale()), test_root(),
             test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "cannot write the merged file (Is a directory)") && strstr(out, "t.json.rank1.json") &&
                  strstr(out, "complete in ") && strstr(out, "exit 2"), "%s", out);
    free(out), free(dir);
}
END_TEST

/* A directory that takes no file (no write permission, a read-only mount, /proc or /sys): refused with the
 * other flag checks, naming the fix — it was found only when the trace's .tmp was opened, after the run
 * header, and in stages 3–5 by every worker after the launch (--report by rank 0, likewise). /proc refuses
 * new files even to root. */
START_TEST(trace_directory_without_room_is_refused_up_front) {
    for (int stage = 1; stage <= 5; stage++) {
        char cmd[2048], *out;
        snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage%d " SMALL " --steps 1 --trace /proc/t.json%s", test_root(),
                 stage, stage >= 3 ? " --nproc-per-node 2 --standalone" : "");
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, "--trace '/proc/t.json': cannot create a file in directory '/proc'") &&
                      strstr(out, "give --trace a path in a directory you can write") && !strstr(out, "parameters,") &&
                      !strstr(out, "launching"), "stage %d: exit %d:\n%s", stage, rc, out);
        free(out);
    }
    /* --report likewise: stages 3–5's rank 0 found it after the launch */
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage3 " SMALL " --steps 1 --report /proc/r.jsonl --nproc-per-node 2 "
             "--standalone", test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "--report '/proc/r.jsonl': cannot create a file in directory '/proc'") &&
                  !strstr(out, "launching"), "stage 3: exit %d:\n%s", rc, out);
    free(out);
    /* …but a --report file already there is written in place: its directory need not take new files. A
     * directory this user may not write (root drops its power to write any file first, as
     * test_unwritable_file does), holding a report file it may; a new name there is refused. */
    const int root = geteuid() == 0;
    const char *as = root ? "setpriv --bounding-set -dac_override,-dac_read_search " : "";
    if (root && system("setpriv --bounding-set -dac_override,-dac_read_search true > /dev/null 2>&1") != 0) {
        printf("SKIP: trace: a --report file in a read-only directory — running as root, and setpriv is missing or "
               "may not drop root's power to write any file here (CAP_SETPCAP)\n");
        return;
    }
    char *dir = test_tmpdir(), path[700];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    test_write_text(path, "");
    ck_assert_int_eq(chmod(path, 0666), 0);
    ck_assert_int_eq(chmod(dir, 0555), 0);
    for (int stage = 1; stage <= 3; stage += 2) {
        snprintf(cmd, sizeof cmd, "%stimeout -k 5 60 %s/stage%d " SMALL " --steps 1 --report %s%s", as, test_root(),
                 stage, path, stage == 3 ? " --nproc-per-node 2 --standalone" : "");
        rc = test_run(cmd, &out);
        ck_assert_msg(rc == 0 && strstr(out, "summary:"), "stage %d, a report file in place: exit %d:\n%s", stage, rc,
                      out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s%s/stage1 " SMALL " --steps 1 --report %s/new.jsonl", as, test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "cannot create a file in directory"), "a new report: exit %d:\n%s", rc, out);
    free(out);
    ck_assert_int_eq(chmod(dir, 0755), 0); /* for the cleanup */
    free(dir);
}
END_TEST

/* The file is written under FILE.tmp and renamed into place when complete: a run interrupted while
 * tracing (Ctrl-C) leaves the trace an earlier run wrote there as it was (it used to be emptied when
 * the run started). */
START_TEST(interrupted_run_keeps_the_old_trace) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "D=%s; S='%s/stage1 " SMALL "'; $S --steps 7 --trace $D/t.json --trace-steps 2:5 "
             ">/dev/null && cp $D/t.json $D/good.json || exit 9; "
             "timeout -k 5 60 $S --epochs 50 --trace $D/t.json --trace-steps 0:1000 > $D/run.out 2>&1 & run=$!; "
             "while ! grep -qs 'epoch 1/' $D/run.out && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "kill -INT $run; wait $run; echo \"exit $?\"; cat $D/run.out; cmp $D/good.json $D/t.json && echo intact",
             dir, test_root());
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "exit 130") && !strstr(out, "summary:"), "the run was not interrupted:\n%s", out);
    ck_assert_msg(strstr(out, "intact"), "the earlier trace was changed:\n%s", out);
    free(out), free(dir);
}
END_TEST

/* A run that diverges stops with exit 2 before its end — and used to write no trace: the steps that
 * led to the NaN were lost, only an empty FILE.tmp was left, and a FILE from an earlier run stayed at
 * the path as if it were this one's. Now each rank writes what of the window ran (rank 0 merges), so
 * the file parses and holds steps 1..2 of a window 1:100 in a run that stops diverged after step 3. */
START_TEST(diverged_run_writes_its_trace) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out;
    /* no batch norm and --lr 100: the weights grow until the test forward overflows (test loss NaN) */
    const char *wild = "--device cpu --model tiny --norm none --train-size 64 --test-size 32 --epochs 2 --lr 100 "
                       "--steps 3 --progress off";
    for (int ddp = 0; ddp < 2; ddp++) {
        char extra[128] = "--batch-size 16";
        if (ddp) snprintf(extra, sizeof extra, "--batch-size 8 --nproc-per-node 2 --master-port %d", test_free_port());
        snprintf(cmd, sizeof cmd, "(D=%s; echo stale > $D/t.json; timeout -k 5 120 %s/%s %s %s --trace $D/t.json "
                 "--trace-steps 1:100; echo \"exit $?\"; python3 %s/tests/trace_check.py $D/t.json --steps 1:3 "
                 "--pids %d --expect forward backward optimizer; test -e $D/t.json.tmp && echo LEFTOVER)",
                 dir, test_root(), ddp ? "stage3" : "stage1", wild, extra, test_root(), ddp ? 2 : 1);
        test_run(cmd, &out);
        ck_assert_msg(strstr(out, "training diverged in epoch 1 (step 3") && strstr(out, "exit 2"), "%s", out);
        ck_assert_msg(strstr(out, "ok: ") && strstr(out, "steps 1..2") && !strstr(out, "LEFTOVER") &&
                          strstr(out, "the run ended after 3 steps, inside --trace-steps 1:100"), "%s", out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Two runs, one --trace FILE (two students with the same command line): the second is refused while
 * the first holds FILE.tmp, naming the fix — it used to advise "a regular file in an existing,
 * writable directory", which it was — and the first's trace is written whole. The first (timeout's
 * child, which the signals go to: stopping timeout stops nothing) is held stopped while the others
 * run, and traces every step of its run, so its lock outlasts them on any machine — on 16 cores its
 * 3-step window once closed before stage 3 started, and stage 3 traced on. Stage 3's launcher refuses
 * before any worker starts: its workers used to find the lock only after the rendezvous. */
START_TEST(a_trace_another_run_is_writing_is_refused) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "(D=%s; R=%s; timeout -k 5 60 $R/stage1 " SMALL " --train-size 2048 --trace $D/t.json "
             "--trace-steps 1:128 > $D/run.out 2>&1 & run=$!; "
             "while ! [ -e $D/t.json.tmp ] && kill -0 $run 2>/dev/null; do sleep 0.01; done; sleep 0.05; "
             "kid=$(cat /proc/$run/task/$run/children); kill -STOP $kid; "
             "timeout -k 5 60 $R/stage1 " SMALL " --steps 1 --trace $D/t.json; echo \"stage1 exit $?\"; "
             "timeout -k 5 60 $R/stage3 " SMALL " --steps 1 --nproc-per-node 2 --master-port %d --trace $D/t.json; "
             "echo \"stage3 exit $?\"; kill -CONT $kid; wait $run; echo \"first exit $?\"; "
             "[ -s $D/t.json ] && ! [ -e $D/t.json.tmp ] && echo whole)",
             dir, test_root(), test_free_port());
    test_run(cmd, &out);
    char want[800];
    snprintf(want, sizeof want, "another run is writing %s/t.json.tmp (it holds the file's lock) — give this run "
             "another --trace file, or wait for that one to end", dir);
    ck_assert_msg(strstr(out, "stage1 exit 2") && strstr(out, "stage3 exit 2") && strstr(out, want), "%s", out);
    ck_assert_msg(!strstr(out, "launching"), "stage 3 started its workers:\n%s", out);
    ck_assert_msg(!strstr(out, "parameters,"), "stage 1 printed its run header before refusing:\n%s", out);
    ck_assert_msg(strstr(out, "first exit 0") && strstr(out, "whole"), "%s", out);
    free(out), free(dir);
}
END_TEST

/* Another user's trace file left in a shared directory (/tmp, two students with one command line): the
 * run was told to "give --trace a regular file in an existing, writable directory", which it was; it is
 * told whose the file is, as --report's is. Root drops its power to write any file first (setpriv).
 * Stage 3's launcher says so before starting any worker. */
START_TEST(another_users_trace_file_is_named) {
    char *dir = test_tmpdir(), path[600], cmd[2048], *out;
    const char *as = test_unwritable_file(dir, "t.json", path, sizeof path, "trace: another user's --trace file");
    if (!as) {
        free(dir);
        return;
    }
    for (int stage = 1; stage <= 3; stage += 2) {
        snprintf(cmd, sizeof cmd, "%stimeout -k 5 60 %s/stage%d " SMALL " --steps 1 --trace %s%s", as, test_root(),
                 stage, path, stage == 3 ? " --nproc-per-node 2 --standalone" : "");
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, "the file is there and this user may not write it") &&
                      strstr(out, "give --trace a file of your own") && !strstr(out, "existing, writable directory") &&
                      !strstr(out, "launching"), "stage %d: exit %d:\n%s", stage, rc, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Rank 0 of a two-rank run, its trace window 0:1, merging with rank 1's file (made here, 7 spans dropped):
 * in a child (test_run_captured), the trace's state being the process's. */
static void merge_as_rank0(void *file) {
    trace_configure(file, "0:1", 0, 2, "rank 0", NULL, 0);
    trace_step(0); /* opens the window */
    trace_step(1); /* closes it: rank 0's file written */
    trace_finish();
    trace_merge();
}

/* Spans a rank's full buffer dropped are counted in the merged file too, where trace_check.py looks
 * (otherData.dropped): the merge wrote only "ranks", so a stage 4 trace of 220 long steps with 17220
 * spans dropped on each rank passed that check, failing only later on "step spans [0, …]" with no
 * word of the cause, while step_skew.py said "has 6223 forward and 6222 backward spans". */
START_TEST(merged_trace_counts_dropped_spans) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), path[700], file[700], cmd[2048], *out;
    snprintf(path, sizeof path, "%s/t.json.rank1.json", dir);
    test_write_text(path, "{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,\"tid\":0,"
                          "\"args\":{\"name\":\"rank 1\"}}\n],\"displayTimeUnit\":\"ms\",\"otherData\":"
                          "{\"trace_steps\":\"0:1\",\"dropped\":7}}\n");
    snprintf(file, sizeof file, "%s/t.json", dir);
    int rc = test_run_captured(merge_as_rank0, file, &out);
    ck_assert_msg(rc == 0 && strstr(out, "from 2 ranks merged"), "exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py %s --steps 0:1 --pids 2 2>&1", test_root(), file);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "7 spans were dropped") && !strstr(out, "Traceback"), "exit %d:\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* tests/trace_check.py rejects a broken trace with a FAIL line, never a Python traceback: an event
 * that is no object, a lane name or step number missing, a NaN time, spans dropped by the writer, and
 * a --steps that is not A:B. */
START_TEST(trace_check_rejects_broken_files) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out;
    const char *m = "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"p\"}}";
    const char *t = "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"main\"}}";
    const char *s = "{\"ph\":\"X\",\"name\":\"step\",\"cat\":\"step\",\"pid\":0,\"tid\":1,\"ts\":1,\"dur\":2,"
                    "\"args\":{\"n\":0}}";
    const char *files[][2] = {
        {"good", "%s,%s,%s], \"otherData\":{\"dropped\":0}"},
        {"notobj", "%s,%s,%s,5]"},
        {"noname", "%s,{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":1},%s%.0s]"},
        {"nan", "%s,%s,{\"ph\":\"X\",\"name\":\"x\",\"cat\":\"c\",\"pid\":0,\"tid\":1,\"ts\":NaN,\"dur\":1},%s]"},
        {"nostep", "%s,%s,{\"ph\":\"X\",\"name\":\"step\",\"cat\":\"step\",\"pid\":0,\"tid\":1,\"ts\":1,"
                   "\"dur\":2}%.0s]"},
        {"dropped", "%s,%s,%s], \"otherData\":{\"dropped\":7}"},
    };
    const char *want[] = {"ok: ", "is not an event object", "without pid, tid or args.name", "bad ts/dur",
                          "without its step number", "7 spans were dropped"};
    char *root = realpath(test_root(), NULL);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char body[2048], path[700];
        snprintf(body, sizeof body, files[i][1], m, t, s);
        snprintf(path, sizeof path, "%s/%s.json", dir, files[i][0]);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "{\"traceEvents\":[%s}\n", body);
        fclose(f);
        snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py %s --steps 0:1 2>&1", root, path);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == (i ? 1 : 0) && strstr(out, want[i]) && !strstr(out, "Traceback"),
                      "trace_check %s: exit %d, want %d and '%s':\n%s", files[i][0], rc, i ? 1 : 0, want[i], out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py %s/good.json --steps 5-8 2>&1", root, dir);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "is not A:B") && !strstr(out, "Traceback"), "exit %d:\n%s", rc, out);
    free(out), free(root), free(dir);
}
END_TEST

/* tests/timeline.py on bad input: one line "error: ..." and exit 2, never a Python traceback; a file
 * with some malformed spans, a single 0-duration span or a title with quotes is still drawn. */
START_TEST(timeline_bad_input) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "cd %s && : > empty.json && printf '{\"traceEvents\":[{\"ph\"' > cut.json && "
             "echo '{}' > obj.json && echo '[]' > list.json && mkdir d.json && "
             "echo '{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"forward\",\"pid\":0,\"tid\":1,\"ts\":5}]}' "
             "> nodur.json && echo '{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"forward\",\"pid\":0,"
             "\"tid\":1,\"ts\":5,\"dur\":0},{\"ph\":\"X\",\"name\":\"bad\",\"ts\":1}]}' > zero.json && "
             "cp zero.json zero && touch o.svg && echo '{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"a\","
             "\"ts\":-1e308,\"dur\":1},{\"ph\":\"X\",\"name\":\"b\",\"ts\":1e308,\"dur\":1e308}]}' > far.json",
             dir);
    ck_assert_int_eq(test_run(cmd, NULL), 0);
    const char *bad[][2] = {
        {"missing.json o.svg", "no such file"},
        {"d.json o.svg", "is a directory"},
        {"empty.json o.svg", "is empty"},
        {"cut.json o.svg", "not complete JSON"},
        {"obj.json o.svg", "traceEvents"},
        {"list.json o.svg", "no spans"},
        {"nodur.json o.svg", "\"dur\""},
        {"zero.json zero.json", "ends in .json"},
        {"zero ./zero", "the trace itself"},
        {"o.svg p.svg", "SVG picture"},
        {"zero.json no/o.svg", "mkdir -p no"},
        {"zero.json o.svg --width 0", "--width 0"},
        {"far.json o.svg", "past any float"}, /* each time finite, their distance not: an OverflowError */
    };
    char *root = realpath(test_root(), NULL); /* the commands run in dir */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && python3 %s/tests/timeline.py %s", dir, root, bad[i][0]);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, "error: ") && strstr(out, bad[i][1]) && !strstr(out, "Traceback"),
                      "timeline.py %s: exit %d, expected 2 and '%s':\n%s", bad[i][0], rc, bad[i][1], out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "cd %s && python3 %s/tests/timeline.py zero.json z.svg --title 'a \"b\" & c' 2>&1 && "
             "grep -c 'a &quot;b&quot; &amp; c' z.svg", dir, root);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "1 malformed") && !strstr(out, "Traceback"), "exit %d:\n%s", rc, out);
    free(root);
    free(out), free(dir);
}
END_TEST

/* tests/step_skew.py on JSON that is no trace (a number, a list of numbers, an event without its
 * name or pid, a time that is a string): one line naming the file and exit 1, never a Python
 * traceback (it printed one for each). */
START_TEST(step_skew_bad_input) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out;
    const char *bad[][2] = {
        {"num", "5"},
        {"ints", "[1, 2]"},
        {"events5", "{\"traceEvents\": 5}"},
        {"noname", "[{\"ph\": \"X\"}]"},
        {"nopid", "[{\"ph\": \"M\", \"name\": \"thread_name\"}]"},
        {"strts", "[{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"compute\"}},"
                  "{\"ph\":\"X\",\"name\":\"forward\",\"pid\":0,\"tid\":1,\"ts\":\"a\",\"dur\":1},"
                  "{\"ph\":\"X\",\"name\":\"backward\",\"pid\":0,\"tid\":1,\"ts\":\"b\",\"dur\":1}]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s.json", dir, bad[i][0]);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "%s\n", bad[i][1]);
        fclose(f);
        snprintf(cmd, sizeof cmd, "python3 %s/tests/step_skew.py %s 2>&1", test_root(), path);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 1 && strstr(out, path) && strstr(out, "not the trace events --trace writes") &&
                      !strstr(out, "Traceback"), "step_skew.py %s: exit %d:\n%s", bad[i][0], rc, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Two ranks' traces, each with one field made another type by hand (what trace_check.py, timeline.py
 * and step_skew.py may be given), written into dir as NAME.json: good (as the writer writes it), lane5
 * (the loop and compute lanes named 5), proclist (a process named [1]), pidlist (a span's pid [0]),
 * sortx (a sort index "x"), mname (a metadata event named [1]), nan and big (a forward's ts NaN, or 10^400),
 * dropped (otherData.dropped 7, the rest whole), dropx (otherData.dropped "x"), and huge (a 5000-digit integer, which Python 3.11's json refuses). */
static void write_typed_traces(const char *dir) {
    char path[700], cmd[1024];
    snprintf(path, sizeof path, "%s/gen.py", dir);
    test_write_text(path,
        "import json\n"
        "def M(n, pid, tid, a): return {'ph': 'M', 'name': n, 'pid': pid, 'tid': tid, 'args': a}\n"
        "def X(n, pid, tid, ts, dur, a):\n"
        "    return {'ph': 'X', 'name': n, 'cat': n, 'pid': pid, 'tid': tid, 'ts': ts, 'dur': dur, 'args': a}\n"
        "def base():\n"
        "    ev = []\n"
        "    for r in (0, 1):\n"
        "        ev += [M('process_name', r, 0, {'name': 'rank %d' % r}), M('thread_name', r, 1, {'name': 'main'}),\n"
        "               M('thread_name', r, 1000, {'name': 'cpu dev%d compute' % r}), X('step', r, 1, 0, 100, {'n': 0}),\n"
        "               X('forward', r, 1000, 1, 10, {'step': 0}), X('backward', r, 1000, 11, 10, {'step': 0})]\n"
        "    return {'traceEvents': ev, 'otherData': {'dropped': 0}}\n"
        "cases = {'good': lambda e, o: None,\n"
        "         'lane5': lambda e, o: (e[1]['args'].update(name=5), e[2]['args'].update(name=5)),\n"
        "         'proclist': lambda e, o: e[0]['args'].update(name=[1]),\n"
        "         'pidlist': lambda e, o: e[4].update(pid=[0]),\n"
        "         'sortx': lambda e, o: e.append(M('thread_sort_index', 0, 1, {'sort_index': 'x'})),\n"
        "         'mname': lambda e, o: e.append({'ph': 'M', 'name': [1], 'pid': 0, 'tid': 1, 'args': {}}),\n"
        "         'nan': lambda e, o: e[4].update(ts=float('nan')),\n"
        "         'big': lambda e, o: e[4].update(ts=10 ** 400),\n"
        "         'dropped': lambda e, o: o.update(dropped=7),\n"
        "         'dropx': lambda e, o: o.update(dropped='x')}\n"
        "for name, change in cases.items():\n"
        "    d = base()\n"
        "    change(d['traceEvents'], d['otherData'])\n"
        "    open(name + '.json', 'w').write(json.dumps(d))\n"
        "open('huge.json', 'w').write('{\"traceEvents\": [' + '1' * 5000 + ']}')\n");
    snprintf(cmd, sizeof cmd, "cd %s && python3 gen.py", dir);
    ck_assert_int_eq(test_run(cmd, NULL), 0);
}

/* The trace tools on a hand-edited trace whose fields have other types than the writer's: one line that
 * names the field, and the exit status of a bad file, never a Python traceback — trace_check.py stopped
 * at name.startswith on a lane named 5, at an unhashable pid, at a 400-digit ts (OverflowError, as
 * timeline.py and step_skew.py did), step_skew.py at statistics.pstdev on a NaN ts; a process named [1]
 * or a sort index "x" passed, and a 5000-digit integer was called a file "cut short: rerun it". */
START_TEST(trace_tools_name_a_field_of_the_wrong_type) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out, *root = realpath(test_root(), NULL); /* run in dir */
    write_typed_traces(dir);
    const char *check = "trace_check.py %s.json --steps 0:1 --pids 2", *skew = "step_skew.py %s.json",
               *draw = "timeline.py %s.json o.svg";
    const struct { const char *file, *tool; int rc; const char *want; } cases[] = {
        {"good", check, 0, "ok: "},
        {"good", skew, 0, "2 workers"},
        {"good", draw, 0, "timeline: "},
        {"lane5", check, 1, "FAIL: thread_name event whose args.name is 5, not text"},
        {"lane5", skew, 1, "lane pid 0 tid 1 is named 5, not text"},
        {"proclist", check, 1, "FAIL: process_name event whose args.name is [1], not text"},
        {"pidlist", check, 1, "FAIL: a span whose pid or tid is not an integer"},
        {"pidlist", skew, 1, "not the trace events --trace writes"},
        {"pidlist", draw, 0, "1 malformed event(s) skipped"},
        {"sortx", check, 1, "FAIL: thread_sort_index event whose args.sort_index is 'x', not an integer"},
        {"mname", check, 1, "FAIL: metadata event whose name is [1], not text"},
        {"nan", check, 1, "FAIL: bad ts/dur"},
        {"nan", skew, 1, "a forward span's ts nan or dur 10 is not a finite number"},
        {"big", check, 1, "FAIL: bad ts/dur"},
        {"big", skew, 1, "is not a finite number"},
        {"big", draw, 0, "1 malformed event(s) skipped (the first: \"ts\" or \"dur\" is not a finite number)"},
        {"dropx", check, 1, "FAIL: otherData.dropped is 'x', not a count of spans"},
        {"dropx", draw, 0, "warning: dropx.json: otherData.dropped is 'x', not a count of spans"},
        /* Python 3.11's json refuses it (older ones read a number: "not an event object" and the like) */
        {"huge", check, 1, ""},
        {"huge", skew, 1, ""},
        {"huge", draw, 2, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[200];
        snprintf(args, sizeof args, cases[i].tool, cases[i].file);
        snprintf(cmd, sizeof cmd, "cd %s && python3 %s/tests/%s 2>&1", dir, root, args);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == cases[i].rc && strstr(out, cases[i].want) && !strstr(out, "Traceback") &&
                      !strstr(out, "cut short"), "%s: exit %d, want %d and '%s':\n%s", args, rc, cases[i].rc,
                      cases[i].want, out);
        free(out);
    }
    free(root), free(dir);
}
END_TEST

/* A trace whose writer dropped spans (its buffer full: otherData.dropped) is drawn by timeline.py and read
 * by step_skew.py with a warning that says so, in trace_check.py's words — timeline.py drew the gaps with
 * no word of why, and step_skew.py gave figures from the spans left. */
START_TEST(timeline_and_step_skew_warn_of_dropped_spans) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[2048], *out, *root = realpath(test_root(), NULL); /* run in dir */
    write_typed_traces(dir);
    const char *tools[][2] = {{"timeline.py dropped.json o.svg", "timeline: "}, {"step_skew.py dropped.json", "2 workers"},
                              {"trace_check.py dropped.json --steps 0:1 --pids 2", "FAIL: "}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && python3 %s/tests/%s 2>&1", dir, root, tools[i][0]);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == (i == 2) && strstr(out, tools[i][1]) &&
                      strstr(out, "7 spans were dropped (the writer's buffer was full): trace fewer steps") &&
                      (i == 2 || strstr(out, "warning: ")) && !strstr(out, "Traceback"), "%s: exit %d:\n%s", tools[i][0], rc,
                      out);
        free(out);
    }
    free(root), free(dir);
}
END_TEST

/* step_skew.py and trace_check.py on a trace that is missing, empty (a FILE.tmp a crashed run left) or
 * cut short: one line that names the fix — rerun the run that wrote it, or give the file --trace wrote —
 * and exit 1, never a traceback. They said only "not a readable --trace file (Expecting value: …)" and
 * "is not valid JSON: [Errno 2] No such file …", which named neither. */
START_TEST(step_skew_and_trace_check_name_the_fix_for_a_cut_trace) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[2048], *out, path[600], *root = realpath(test_root(), NULL); /* run in dir */
    snprintf(path, sizeof path, "%s/empty.json", dir);
    test_write_text(path, "");
    snprintf(path, sizeof path, "%s/cut.json", dir);
    test_write_text(path, "{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"ti");
    const char *files[][2] = {{"missing.json", "give the file a stage's --trace FILE wrote"},
                              {"empty.json", "rerun it"},
                              {"cut.json", "rerun it"}};
    const char *tools[] = {"step_skew.py %s", "trace_check.py %s --steps 5:8"};
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            char args[700];
            snprintf(args, sizeof args, tools[t], files[i][0]);
            snprintf(cmd, sizeof cmd, "cd %s && python3 %s/tests/%s 2>&1", dir, root, args);
            int rc = test_run(cmd, &out);
            ck_assert_msg(rc == 1 && strstr(out, files[i][0]) && strstr(out, files[i][1]) && !strstr(out, "Traceback"),
                          "%s: exit %d, want 1 and '%s':\n%s", args, rc, files[i][1], out);
            free(out);
        }
    free(root), free(dir);
}
END_TEST

/* A stage 3-5 trace FILE holds every rank, and FILE.rankN.json beside it rank N's part: step_skew.py
 * given both (a glob of the trace folder) counted each rank twice — "4 workers" for a run of two, exit 0 — and
 * so did one file given twice. Both are refused, naming the file to give; FILE alone pairs its ranks. */
START_TEST(step_skew_counts_each_rank_once) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out, path[600], *root = realpath(test_root(), NULL); /* run in dir */
    char trace[4096] = "{\"traceEvents\":[", span[256];
    for (int pid = 0; pid < 2; pid++) {
        snprintf(span, sizeof span, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1000,"
                 "\"args\":{\"name\":\"cpu dev%d compute (wall clock)\"}},", pid, pid);
        strcat(trace, span);
        for (int step = 5; step < 7; step++)
            for (int bw = 0; bw < 2; bw++) {
                snprintf(span, sizeof span, "{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,"
                         "\"tid\":1000,\"ts\":%d,\"dur\":%d,\"args\":{\"step\":%d}},", bw ? "backward" : "forward",
                         bw ? "backward" : "forward", pid, 1000 * step + 10 * bw, 10 + pid, step);
                strcat(trace, span);
            }
    }
    trace[strlen(trace) - 1] = 0; /* the last comma */
    strcat(trace, "]}\n");
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, i ? "%s/t.json.rank0.json" : "%s/t.json", dir);
        test_write_text(path, trace);
    }
    const char *cases[][3] = {{"t.json", "0", "2 workers"},
                              {"t.json t.json.rank0.json", "1", "t.json.rank0.json is rank 0's part of t.json"},
                              {"t.json ./t.json", "1", "./t.json is given twice"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && python3 %s/tests/step_skew.py %s 2>&1", dir, root, cases[i][0]);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == atoi(cases[i][1]) && strstr(out, cases[i][2]) && !strstr(out, "Traceback"),
                      "step_skew.py %s: exit %d, want %s and '%s':\n%s", cases[i][0], rc, cases[i][1], cases[i][2], out);
        free(out);
    }
    free(root), free(dir);
}
END_TEST

/* step_skew.py on a trace whose --trace-steps window the run never reached: it says so and names the
 * fix — it asked "was it made with --trace?", which it was. */
START_TEST(step_skew_empty_window_says_why) {
    if (!have_python()) return;
    char *dir = test_tmpdir(), cmd[2048], *out, *root = realpath(test_root(), NULL); /* run in dir */
    snprintf(cmd, sizeof cmd, "cd %s && echo '{\"traceEvents\":[{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,"
             "\"tid\":0,\"args\":{\"name\":\"rank 0 (stage3)\"}}],\"otherData\":{\"trace_steps\":\"100:200\","
             "\"ranks\":2}}' > t.json && python3 %s/tests/step_skew.py t.json", dir, root);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "the run ended before its --trace-steps 100:200 window") &&
                  !strstr(out, "was it made with --trace"), "exit %d:\n%s", rc, out);
    free(out), free(root), free(dir);
}
END_TEST

/* On a GPU: device spans from CUDA events (the batch copies on the copy stream, forward / backward /
 * optimizer on the compute stream) aligned with the host's; stage 2 on two (possibly logical) GPUs. */
START_TEST(gpu_trace) {
    if (!test_have_gpu("trace: CUDA event spans of stages 1 and 2") || !have_python()) return;
    char *dir = test_tmpdir(), cmd[4096], *out;
    const char *gpu = "--device cuda --model tiny --train-size 2048 --test-size 128 --batch-size 64 --epochs 1 "
                      "--steps 10 --progress off";
    snprintf(cmd, sizeof cmd, "%s/stage1 %s --trace %s/g1.json && python3 %s/tests/trace_check.py %s/g1.json "
             "--steps 5:8 --expect step input 'H2D copy' forward backward optimizer && "
             "%s/stage2 %s --gpus 2 --trace %s/g2.json && python3 %s/tests/trace_check.py %s/g2.json --steps 5:8 "
             "--expect 'H2D copy' scatter replicate gather reduce 'peer copy' 'replica forward' 'GIL held' forward "
             "backward optimizer",
             test_root(), gpu, dir, test_root(), dir, test_root(), gpu, dir, test_root(), dir);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "(%d)\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

Suite *suite_trace(void) {
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stage1_trace);
    tcase_add_test(tc, window_from_step_0);
    tcase_add_test(tc, stage2_trace);
    tcase_add_test(tc, stage3_trace);
    tcase_add_test(tc, stage4_step_skew_counts_optimizer_steps);
    tcase_add_test(tc, step_skew_pairs_devices_by_step);
    tcase_add_test(tc, window_opening_at_the_end_holds_nothing);
    tcase_add_test(tc, window_after_the_run);
    tcase_add_test(tc, bad_trace_flags_refused);
    tcase_add_test(tc, unwritable_trace_files_fail_at_once);
    tcase_add_test(tc, trace_directory_without_room_is_refused_up_front);
    tcase_add_test(tc, interrupted_run_keeps_the_old_trace);
    tcase_add_test(tc, diverged_run_writes_its_trace);
    tcase_add_test(tc, a_trace_another_run_is_writing_is_refused);
    tcase_add_test(tc, another_users_trace_file_is_named);
    tcase_add_test(tc, timeline_bad_input);
    tcase_add_test(tc, step_skew_bad_input);
    tcase_add_test(tc, step_skew_and_trace_check_name_the_fix_for_a_cut_trace);
    tcase_add_test(tc, step_skew_counts_each_rank_once);
    tcase_add_test(tc, step_skew_empty_window_says_why);
    tcase_add_test(tc, trace_check_rejects_broken_files);
    tcase_add_test(tc, trace_tools_name_a_field_of_the_wrong_type);
    tcase_add_test(tc, timeline_and_step_skew_warn_of_dropped_spans);
    tcase_add_test(tc, merged_trace_counts_dropped_spans);
    tcase_add_test(tc, gpu_trace);
    suite_add_tcase(s, tc);
    return s;
}
