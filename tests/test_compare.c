/* test_compare.c — `make compare` (tests/compare.sh + tests/compare_table.py) and what CPU runs say
 * about their own timings.
 *
 * What it promises, and how each test checks it:
 * - `make compare QUICK=1` gives every stage of this checkout its row(s) — the default run and the
 *   lesson variants — with figures that parse and agree with the runs' own reports (images/s =
 *   1000 × devices × batch × K / ms), writes compare.md and a well-formed compare.svg, and on the
 *   CPU backend states what CPU timings can and cannot show next to the table.
 * - A stage missing from the checkout gets no row (a fake checkout of stages 1 and 3 only).
 * - Stages 2–5 on the CPU backend print that statement once per job (rank 0 only), stage 1 never.
 * - A run too short to time any step reports "n/a" on the console and null in JSON, not 0.
 * - tests/bench_stage3.sh's table (tests/bench_stage3_table.py) does its two-GPU arithmetic right on
 *   made-up results of a two-GPU run: scaling, goals, and the second GPU's cost per rank.
 * - tests/bench_stage3_variants.sh (2 GPUs) runs every row and reads every figure, on the CPU; the two
 *   halves tests/gpu_session.sh splits it into (variants1, variants2) name every row between them.
 * - tests/train_parity.sh (make parity: GPU + torch) trains on the written synthetic files and prints
 *   its table, on the CPU; a precision it does not know is refused. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests.h"

#define LIMIT "timeout -k 5 120 "
#define CPU_NOTE "note: CPU backend"

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The rows tests/compare.sh runs for stage s (its run names). */
static const char *const ROWS[6][4] = {
    {NULL}, {"stage1", NULL}, {"stage1_eager", "stage2", "stage2_pool"}, {"stage3", "stage3_nooverlap", NULL},
    {"stage4", "stage4_sync", NULL}, {"stage5_fp16", "stage5_bf16", NULL}};

/* Which stages this checkout has: a directory stages/stageN_name per stage N. */
static void stages_present(int have[6]) {
    char path[1024];
    snprintf(path, sizeof path, "%s/stages", test_root());
    DIR *d = opendir(path);
    ck_assert_msg(d, "no %s", path);
    memset(have, 0, 6 * sizeof(int));
    struct dirent *e;
    int s;
    while ((e = readdir(d)))
        if (sscanf(e->d_name, "stage%d_", &s) == 1 && s >= 1 && s <= 5) have[s] = 1;
    closedir(d);
}

/* A field of the {"type":"summary"} record of a report: NAN if missing, or null. */
static double summary_field(const char *rep, const char *key) {
    const char *s = strstr(rep, "\"type\":\"summary\"");
    if (!s) return NAN;
    char k[80];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    if (!p) return NAN;
    p += strlen(k);
    if (*p == '[') p++;
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

/* A cell of a Markdown table row as a number; the whole cell must parse (a "×" suffix allowed). */
static double cell_num(const char *cell) {
    char *end;
    double v = strtod(cell, &end);
    while (*end == ' ') end++;
    if (end == cell || (*end && strncmp(end, "×", strlen("×")))) return NAN;
    return v;
}

/* Split "| a | b | c |" into trimmed cells (in place); returns how many. */
static int split_row(char *line, char **cells, int max) {
    int n = 0;
    char *p = strchr(line, '|');
    while (p && n < max) {
        char *q = strchr(p + 1, '|');
        if (!q) break;
        *q = 0;
        char *c = p + 1;
        while (*c == ' ') c++;
        for (char *e = q - 1; e >= c && *e == ' '; e--) *e = 0;
        cells[n++] = c;
        p = q;
    }
    return n;
}

START_TEST(compare_quick_has_every_stage) {
    char *dir = test_tmpdir(), cmd[2048], path[1024], *out;
    int have[6];
    stages_present(have);
    ck_assert_msg(have[1], "no stage 1 in this checkout");
    snprintf(cmd, sizeof cmd, LIMIT "env QUICK=1 TORCH=0 COMPARE_OUT=%s bash %s/tests/compare.sh", dir, test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "make compare QUICK=1 failed (%d):\n%s", rc, out);
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    char *meta = test_slurp(path, NULL);
    ck_assert_msg(meta, "no %s", path);
    int cpu = strstr(meta, "device=cpu\n") != NULL;
    snprintf(path, sizeof path, "%s/compare.md", dir);
    char *md = test_slurp(path, NULL);
    ck_assert_msg(md, "no %s:\n%s", path, out);
    if (cpu) { /* the statement of what CPU timings show, next to the table, printed and written */
        ck_assert_msg(strstr(out, CPU_NOTE) && strstr(md, CPU_NOTE), "CPU compare without its note:\n%s", out);
        ck_assert_msg(strstr(out, CPU_NOTE) < strstr(out, "images/s"), "the note must precede the table:\n%s", out);
    }

    /* every row of every stage present: its report parses and agrees with the table. Stage 2's rows
     * are over stage 1 run as stage 2 runs (stage1_eager: NCHW, no CUDA graphs), which is over stage 1. */
    double base_ips = NAN, eager_ips = NAN;
    for (int s = 1; s <= 5; s++) {
        for (int k = 0; ROWS[s][k]; k++) {
            snprintf(path, sizeof path, "%s/%s.jsonl", dir, ROWS[s][k]);
            char *rep = test_slurp(path, NULL);
            if (!have[s]) {
                ck_assert_msg(!rep, "stage %d is not in this checkout, yet %s exists", s, path);
                continue;
            }
            ck_assert_msg(rep, "stage %d present but its row %s did not run:\n%s", s, ROWS[s][k], out);
            double ms = summary_field(rep, "ms_per_iter_median"), ips = summary_field(rep, "img_per_s");
            double world = summary_field(rep, "world_size"), batch = summary_field(rep, "batch_size");
            double K = summary_field(rep, "accum_steps"), mem = summary_field(rep, "peak_mem_bytes");
            ck_assert_msg(ms > 0 && ips > 0 && mem > 0, "%s: ms %g img/s %g mem %g", ROWS[s][k], ms, ips, mem);
            ck_assert_msg(fabs(ips - 1e3 * world * batch * K / ms) <= 1e-6 * ips, "%s: img/s %g ≠ %g×%g×%g / %g ms",
                          ROWS[s][k], ips, world, batch, K, ms);
            int eager = !strcmp(ROWS[s][k], "stage1_eager");
            ck_assert_msg(s == 1 || eager || world == 2, "%s: %g devices, compare runs 2", ROWS[s][k], world);
            if (s == 1) base_ips = ips;
            if (eager) eager_ips = ips;
            double ref_ips = s == 2 && !eager ? eager_ips : base_ips;
            /* its Markdown row: ms, images/s and the speed-up parse, and match the report */
            snprintf(path, sizeof path, "%s/plan.tsv", dir);
            char *plan = test_slurp(path, NULL), label[200] = "";
            ck_assert(plan);
            ck_assert_msg(!eager || strstr(plan, "--layout nchw --no-cuda-graph"), "stage1_eager runs stage 1 as "
                          "stage 2 runs the model (NCHW, no CUDA graphs):\n%s", plan);
            for (char *l = strtok(plan, "\n"); l; l = strtok(NULL, "\n")) {
                size_t nl = strlen(ROWS[s][k]);
                if (!strncmp(l, ROWS[s][k], nl) && l[nl] == '\t') sscanf(strchr(strchr(l, '\t') + 1, '\t') + 1, "%199[^\t]", label);
            }
            ck_assert_msg(label[0], "%s not in plan.tsv", ROWS[s][k]);
            char *row = NULL, needle[256];
            snprintf(needle, sizeof needle, "| %s", label);
            for (char *p = md; (p = strstr(p, needle)); p++)
                if (p[strlen(needle)] == ' ' || p[strlen(needle)] == '|') { row = p; break; }
            ck_assert_msg(row, "no row '%s' in compare.md:\n%s", label, md);
            char line[1024], *cells[16];
            snprintf(line, sizeof line, "%.*s", (int)strcspn(row, "\n"), row);
            int nc = split_row(line, cells, 16);
            ck_assert_msg(nc >= 6, "row '%s' has %d cells", label, nc);
            double tms = cell_num(cells[1]), tips = cell_num(cells[2]), up = cell_num(cells[3]);
            double tmem = cell_num(cells[4]);
            ck_assert_msg(fabs(tms - ms) <= 0.006 && fabs(tips - ips) <= 0.51, "row '%s': %s %s vs %g ms %g img/s",
                          label, cells[1], cells[2], ms, ips);
            ck_assert_msg(fabs(up - ips / ref_ips) <= 0.006, "row '%s': speed-up %s vs %g", label, cells[3],
                          ips / ref_ips);
            ck_assert_msg(!strstr(cells[3], "(of NCHW eager)") == (s != 2 || eager), "row '%s': reference '%s'",
                          label, cells[3]);
            if (s == 2) ck_assert_msg(base_ips > 0 && eager_ips > 0, "stage 2's rows ran before their references");
            ck_assert_msg(tmem > 0, "row '%s': memory '%s'", label, cells[4]);
            if (s >= 2 && !eager) ck_assert_msg(cell_num(cells[5]) > 0, "row '%s': device 1 memory '%s'", label, cells[5]);
            free(rep), free(plan);
        }
    }
    /* the chart: exists, is XML, is SVG, has a bar per row */
    snprintf(path, sizeof path, "%s/compare.svg", dir);
    char *svg = test_slurp(path, NULL);
    ck_assert_msg(svg && strstr(svg, "<svg") && strstr(svg, "</svg>"), "no SVG at %s", path);
    ck_assert_msg(count_of(svg, "<rect") >= 2, "an SVG without bars");
    /* the chart carries the table's warning: CPU times are no scaling result */
    ck_assert_msg(!strstr(md, "note: CPU backend") || strstr(svg, "note: CPU backend"),
                  "compare.md says what CPU times cannot show, compare.svg does not");
    free(out);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys, xml.dom.minidom as m; d = m.parse(sys.argv[1]); "
             "assert d.documentElement.tagName == \"svg\"' %s",
             path);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "compare.svg is not well-formed XML:\n%s", out);
    free(out), free(svg), free(md), free(meta), free(dir);
}
END_TEST

/* A row that failed keeps its line in the chart, saying so as the table does: the chart used to draw
 * only the rows that ran, so a chart of stages 1 and 2 alone could not be told from a checkout
 * without stages 3–5. One row that ran, one that exited 2, one whose report has no summary, one whose
 * report ends with a "diverged" record (a run that stopped diverged: said as such). */
START_TEST(compare_chart_names_failed_rows) {
    char *dir = test_tmpdir(), cmd[4096], path[600], *out, *root = realpath(test_root(), NULL); /* run in dir */
    snprintf(cmd, sizeof cmd, "cd %s && printf 'mode=CPU backend, 2 devices\\ndevice=cpu\\n' > meta.txt && "
             "printf 'stage1\\t1\\tstage 1, one device\\t0\\t1\\t./stage1\\n"
             "stage3\\t3\\tstage 3, DDP\\t2\\t1\\t./stage3\\nstage5_fp16\\t5\\tstage 5, fp16\\t0\\t1\\t./stage5\\n"
             "stage4\\t4\\tstage 4, DDP\\t2\\t1\\t./stage4\\n' "
             "> plan.tsv && echo '{\"type\":\"summary\",\"ms_per_iter_median\":20,\"img_per_s\":800,"
             "\"peak_mem_bytes\":[7449600]}' > stage1.jsonl && echo '{\"type\":\"config\"}' > stage5_fp16.jsonl && "
             "echo '{\"type\":\"diverged\",\"epoch\":2,\"step\":16}' > stage4.jsonl && "
             "python3 %s/tests/compare_table.py %s", dir, root, dir);
    free(root);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "failed (exit 2: see stage3.log)") && !strstr(out, "Traceback") &&
                      strstr(out, "failed (diverged at step 16: see stage4.log)"), /* its report's last record */
                  "exit %d:\n%s", rc, out);
    snprintf(path, sizeof path, "%s/compare.svg", dir);
    char *svg = test_slurp(path, NULL);
    ck_assert_msg(svg && strstr(svg, ">stage 1, one device<") && strstr(svg, ">stage 3, DDP<") &&
                  strstr(svg, "failed (exit 2: see stage3.log)") && strstr(svg, ">stage 5, fp16<") &&
                  strstr(svg, "failed (no summary in its report: see stage5_fp16.log)") &&
                  strstr(svg, "failed (diverged at step 16: see stage4.log)"),
                  "the chart leaves out a failed row, or does not say it failed:\n%s", svg ? svg : "(none)");
    free(svg), free(out), free(dir);
}
END_TEST

/* Stage 1 runs first and again last: when the two disagree by more than 10% (a shared machine got busy
 * between them), the table says its ratios carry that doubt — a student read 0.53× off a run whose stage
 * 1 went from 66.6 to 124.6 ms/iter, with nothing to say so. Within 10%: no warning. */
START_TEST(compare_warns_when_stage1_drifts) {
    const double again[2] = {30, 21};
    for (int i = 0; i < 2; i++) {
        char *dir = test_tmpdir(), cmd[4096], path[600], *out, *root = realpath(test_root(), NULL);
        snprintf(cmd, sizeof cmd, "cd %s && printf 'mode=CPU backend\\ndevice=cpu\\n' > meta.txt && "
                 "printf 'stage1\\t1\\tstage 1\\t0\\t1\\t./stage1\\nstage1_again\\t1\\tstage 1, again\\t0\\t1\\t./stage1\\n' "
                 "> plan.tsv && echo '{\"type\":\"summary\",\"ms_per_iter_median\":20,\"img_per_s\":800}' > stage1.jsonl && "
                 "echo '{\"type\":\"summary\",\"ms_per_iter_median\":%g,\"img_per_s\":%g}' > stage1_again.jsonl && "
                 "python3 %s/tests/compare_table.py %s", dir, again[i], 16000 / again[i], root, dir);
        free(root);
        int rc = test_run(cmd, &out);
        const char *warning = "warning: stage 1 took 20.00 ms/iter first and 30.00 at the end (1.50×)";
        ck_assert_msg(rc == 0 && (i == 0) == (strstr(out, warning) != NULL) && (i == 0 || !strstr(out, "warning")),
                      "stage 1 again at %g ms: exit %d:\n%s", again[i], rc, out);
        snprintf(path, sizeof path, "%s/compare.md", dir);
        char *md = test_slurp(path, NULL);
        ck_assert_msg(md && (i == 0) == (strstr(md, warning) != NULL), "%s", md ? md : "(no compare.md)");
        free(md), free(out), free(dir);
    }
}
END_TEST

/* COMPARE_OUT that an earlier compare wrote (its marker inside), now read-only: one line naming the
 * fix, exit 2, before any run, and the earlier results as they were — every row used to "fail" with
 * the old log's tail, after an "rm: cannot remove" per file, and the table ended in a Python traceback.
 * Root drops its power to write any file first (setpriv). */
START_TEST(compare_read_only_results_folder_is_refused) {
    char *dir = test_tmpdir(), cmd[4096], probe[600], out_dir[600], *out;
    const char *as = test_unwritable_file(dir, "probe", probe, sizeof probe, "compare: a read-only COMPARE_OUT");
    if (!as) {
        free(dir);
        return;
    }
    snprintf(out_dir, sizeof out_dir, "%s/cmp", dir);
    snprintf(cmd, sizeof cmd, "mkdir %s && cd %s && echo old > .written-by-compare && echo old > compare.md && "
             "echo old > stage1.log && chmod 555 %s", out_dir, out_dir, out_dir);
    ck_assert_int_eq(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, LIMIT "%senv QUICK=1 COMPARE_OUT=%s bash %s/tests/compare.sh", as, out_dir, test_root());
    int rc = test_run(cmd, &out);
    char want[800];
    snprintf(want, sizeof want, "error: cannot write into COMPARE_OUT=%s", out_dir);
    ck_assert_msg(rc == 2 && strstr(out, want) && strstr(out, "give a new or empty folder") &&
                  !strstr(out, "cannot remove") && !strstr(out, "[1/") && !strstr(out, "Traceback"),
                  "exit %d:\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "cd %s && grep -qx old compare.md && grep -qx old stage1.log && chmod 755 .", out_dir);
    ck_assert_msg(test_run(cmd, NULL) == 0, "the earlier results changed");
    free(out), free(dir);
}
END_TEST

/* compare.sh on a checkout of stages 1 and 5 alone, stage 5 a shell script whose body is `stage5_body`,
 * with `knobs` before the script's other variables; its exit status, and its output in *out. */
static int compare_with_fake_stage5(const char *stage5_body, const char *knobs, char **out) {
    char *dir = test_tmpdir(), cmd[4096];
    char *root = realpath(test_root(), NULL);
    snprintf(cmd, sizeof cmd, "cd %s && mkdir -p stages/stage1_x stages/stage5_x bin && ln -s %s/stage1 bin/stage1 && "
             "printf '#!/bin/sh\\n%s\\n' > bin/stage5 && chmod +x bin/stage5", dir, root, stage5_body);
    ck_assert_int_eq(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, LIMIT "env QUICK=1 %s STAGES_DIR=%s/stages BIN_DIR=%s/bin COMPARE_OUT=%s/out "
             "bash %s/tests/compare.sh", knobs, dir, dir, dir, root);
    int rc = test_run(cmd, out);
    free(root), free(dir);
    return rc;
}

/* A run that exits 0 without a summary in its report is a failed row on the console and in the count,
 * as in the table: it printed an empty result line, and "compare: 1 run(s) failed" for the two such
 * rows (the table's exit counted once). A checkout of stages 1 and 5, stage 5 a script that writes nothing. */
START_TEST(compare_counts_rows_without_a_summary) {
    char *out;
    int rc = compare_with_fake_stage5("exit 0", "", &out);
    ck_assert_msg(rc == 1 && count_of(out, "FAILED (exit 0, but no summary in its report") == 2 &&
                  strstr(out, "compare: 2 run(s) failed") && !strstr(out, "Traceback"), "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

/* A row stopped at compare's time limit says so, and ROW_LIMIT sets the limit: it said only "FAILED
 * (exit 124)". A checkout of stages 1 and 5, stage 5 a script that sleeps past ROW_LIMIT=2. */
START_TEST(compare_names_a_row_stopped_at_its_limit) {
    char cmd[2048], *out;
    int rc = compare_with_fake_stage5("exec sleep 30", "ROW_LIMIT=2", &out);
    ck_assert_msg(rc == 1 && strstr(out, "FAILED (exit 124: stopped at its 2 s limit (ROW_LIMIT=S gives more))") &&
                  strstr(out, "compare: 2 run(s) failed"), "exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "env ROW_LIMIT=0 DRY=1 bash %s/tests/compare.sh", test_root());
    rc = test_run(cmd, &out);
    ck_assert_msg(rc != 0 && strstr(out, "ROW_LIMIT=0 is not a whole number"), "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

/* compare_table.py on a plan.tsv it cannot read (a line cut short, a stage that is not a number): one
 * line naming the file and the fix, never a Python traceback (ValueError on unpacking, on int()). */
START_TEST(compare_table_refuses_a_broken_plan) {
    char *dir = test_tmpdir(), cmd[2048], *out;
    const char *plans[] = {"stage1\\t1\\tstage 1\\n", "stage1\\tx\\tstage 1\\t0\\t1\\t./stage1\\n"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "printf '%s' > %s/plan.tsv && python3 %s/tests/compare_table.py %s", plans[i], dir,
                 test_root(), dir);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 1 && strstr(out, "plan.tsv line 1 is not one that tests/compare.sh writes") &&
                      !strstr(out, "Traceback"), "plan %d: exit %d:\n%s", i, rc, out);
        free(out);
    }
    free(dir);
}
END_TEST

/* compare_table.py on results it did not expect: a summary whose peak_mem_bytes is null (a run that
 * measured none, or a report edited by hand) is a row without memory, not a TypeError; a meta.txt
 * whose gpus is no count, and a file given for the folder, are one line naming the fix. */
START_TEST(compare_table_reads_odd_results_without_a_traceback) {
    char *dir = test_tmpdir(), cmd[2048], *out;
    snprintf(cmd, sizeof cmd,
             "printf 'stage1\\t1\\tstage 1\\t0\\t1\\t./stage1\\n' > %s/plan.tsv && echo device=cpu > %s/meta.txt && "
             "echo '{\"type\":\"summary\",\"peak_mem_bytes\":null,\"accum_steps\":null}' > %s/stage1.jsonl && "
             "python3 %s/tests/compare_table.py %s",
             dir, dir, dir, test_root(), dir);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "stage 1") && !strstr(out, "Traceback"), "null peak: exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "echo gpus=x >> %s/meta.txt && python3 %s/tests/compare_table.py %s", dir, test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "says gpus=x, not a count") && !strstr(out, "Traceback"), "gpus=x: exit %d:\n%s",
                  rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "python3 %s/tests/compare_table.py %s/plan.tsv", test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "plan.tsv is not a folder"), "a file for the folder: exit %d:\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* The Python tools a student runs — make compare's table, make timeline, the trace checks and their
 * reader — parse as Python 3.7 (they run on 3.6 too): RHEL/Rocky 8's and Ubuntu 18.04's python3 is
 * 3.6, and one ':=' in compare_table.py ended make compare there in a SyntaxError instead of the
 * table. ast's feature_version refuses what 3.7 lacks (Python 3.9 and later; older ones check
 * nothing here). */
START_TEST(python_tools_parse_as_python_3_7) {
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd,
             "cd %s && python3 -c 'import ast, sys\nfor f in sys.argv[1:]:\n    sys.version_info < (3, 9) or "
             "ast.parse(open(f, encoding=\"utf-8\").read(), f, feature_version=(3, 7))' tests/compare_table.py "
             "tests/bench_flops.py tests/timeline.py tests/step_skew.py tests/trace_check.py tests/trace_file.py 2>&1",
             test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

/* A checkout with stages 1 and 3 only: rows for those, none for 2, 4, 5, and it says so. */
START_TEST(compare_leaves_out_missing_stages) {
    char *dir = test_tmpdir(), cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "mkdir -p %s/stages/stage1_x %s/stages/stage3_x", dir, dir);
    ck_assert_int_eq(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, LIMIT "env DRY=1 STAGES_DIR=%s/stages BIN_DIR=%s bash %s/tests/compare.sh", dir, dir,
             test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_msg(strstr(out, "plan: stage1: ") && strstr(out, "plan: stage3: ") &&
                      strstr(out, "plan: stage3_nooverlap: ") && strstr(out, "--no-overlap"),
                  "%s", out);
    ck_assert_msg(!strstr(out, "plan: stage2") && !strstr(out, "plan: stage4") && !strstr(out, "plan: stage5"), "%s",
                  out);
    ck_assert_msg(strstr(out, "not in this checkout") && strstr(out, "stage 2 4 5"), "%s", out);
    free(out), free(dir);
}
END_TEST

#define SHORT "--device cpu --model tiny --batch-size 16 --train-size 256 --test-size 32 --workers 0 --progress off"

/* Too short to time: "n/a" on the console, null in JSON (never 0); the CPU note from every stage, once
 * per job (stage 1's own: its times are the baseline of every comparison). */
START_TEST(short_runs_say_na_and_cpu_runs_say_what_they_show) {
    char *dir = test_tmpdir(), cmd[2048], path[512], *out;
    const char *bins[] = {"stage1", "stage2", "stage3"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, bins[i]);
        snprintf(cmd, sizeof cmd, LIMIT "%s/%s " SHORT " --steps 3 --report %s %s", test_root(), bins[i], path,
                 i == 2 ? "--nproc-per-node 2" : "");
        if (i == 2) snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " --master-port %d", test_free_port());
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 0, "%s failed (%d):\n%s", bins[i], rc, out);
        ck_assert_msg(strstr(out, "n/a ms/it") && strstr(out, "n/a img/s") && !strstr(out, " 0 img/s"),
                      "%s: a run of 3 steps has no timing:\n%s", bins[i], out);
        ck_assert_int_eq(count_of(out, CPU_NOTE), 1);
        ck_assert_msg(strstr(out, i == 0 ? "read no GPU's speed" : "not a scaling result"), "%s", out);
        /* the comparison the lesson is about, named: a laptop's DP-vs-DDP order is not the GPUs' */
        ck_assert_msg(i == 0 || strstr(out, "which of DataParallel and DDP is faster here says nothing"), "%s", out);
        char *rep = test_slurp(path, NULL);
        ck_assert_msg(rep, "no report %s", path);
        char *sum = strstr(rep, "\"type\":\"summary\"");
        ck_assert_msg(sum && strstr(sum, "\"ms_per_iter_median\":null") && strstr(sum, "\"img_per_s\":null"),
                      "%s: summary must carry null timings:\n%s", bins[i], rep);
        if (i == 2) { /* DDP's communication times too: null, not a 0 ms that reads as measured */
            char *cs = strstr(rep, "\"type\":\"comm_summary\"");
            ck_assert_msg(strstr(sum, "\"exposed_comm_ms_per_step\":null") && cs &&
                              strstr(cs, "\"exposed_ms_median\":null") && strstr(cs, "\"allreduce_ms_median\":null") &&
                              strstr(cs, "\"exposed_pct\":null") && strstr(cs, "\"algbw_gbps\":null"),
                          "%s: untimed communication must be null:\n%s", bins[i], rep);
        }
        free(rep), free(out);
    }
    free(dir);
}
END_TEST

/* tests/bench_stage3_variants.sh waits for a 2-GPU machine, whose sessions are short: its CPU smoke test
 * runs every row (two workers through --comm host) and reads every figure into the table, so the first
 * GPU run does not find a broken script (a failed row makes the script exit 1). With ONLY, the named rows
 * and their references alone. The table's row numbers, in order: */
static int table_rows(const char *out, int *numbers, int cap) {
    const char *t = strstr(out, "\n#  CPU smoke test");
    int n = 0;
    for (const char *p = t ? strchr(t + 1, '\n') : NULL; p && p[1] >= '0' && p[1] <= '9'; p = strchr(p + 1, '\n'))
        if (n < cap) numbers[n++] = atoi(p + 1);
    return n;
}

START_TEST(bench_stage3_variants_cpu_smoke) {
    char *dir = test_tmpdir(), cmd[2048], *out;
    const char *env = "STEPS=3 ROUNDS=1 BENCH_FLAGS='--device cpu --model tiny --batch-size 16 --train-size 1024 "
                      "--test-size 64 --workers 0'";
    snprintf(cmd, sizeof cmd, "timeout -k 5 280 env %s BENCH_OUT=%s/all bash %s/tests/bench_stage3_variants.sh", env,
             dir, test_root());
    int rc = test_run(cmd, &out), rows[32];
    /* the tail: Check's messages are bounded, the table is what says which row broke */
    ck_assert_msg(rc == 0 && !strstr(out, "FAILED"), "the smoke test failed (%d):\n%s", rc,
                  strlen(out) > 3000 ? out + strlen(out) - 3000 : out);
    int n = table_rows(out, rows, 32);
    ck_assert_msg(n == 27, "%d rows in the table, expected 27:\n%s", n, strlen(out) > 3000 ? out + strlen(out) - 3000 : out);
    for (int i = 0; i < n; i++) ck_assert_int_eq(rows[i], i + 1);
    ck_assert_msg(strstr(out, "stage 3 default ") && strstr(out, "%)") && strstr(out, " | "),
                  "no exposed-comm or per-rank figures read:\n%s", strlen(out) > 3000 ? out + strlen(out) - 3000 : out);
    free(out);
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 env %s ONLY='last1 s5exp' BENCH_OUT=%s/only bash "
             "%s/tests/bench_stage3_variants.sh", env, dir, test_root());
    rc = test_run(cmd, &out);
    n = table_rows(out, rows, 32);
    ck_assert_msg(rc == 0 && n == 4 && rows[0] == 1 && rows[1] == 14 && rows[2] == 22 && rows[3] == 23,
                  "ONLY='last1 s5exp': exit %d, %d rows (expected 1, 14, 22 = s5exp's reference, 23):\n%s", rc, n,
                  out);
    free(out), free(dir);
}
END_TEST

/* A file of made-up results in a bench's results folder. */
static void put(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    test_write_text(path, text);
}

#define S3_SUMMARY(ms, img, world, mem)                                                                          \
    "{\"type\":\"summary\",\"ms_per_iter_median\":" ms ",\"img_per_s\":" img ",\"world_size\":" world              \
    ",\"batch_size\":128,\"peak_mem_bytes\":[" mem "],\"achieved_tflops\":40.0,\"peak_tflops\":494.7,"            \
    "\"peak_devices\":" world ",\"peak_math\":\"tf32\",\"peak_source\":\"made up\"}\n"

/* tests/bench_stage3.sh's table (tests/bench_stage3_table.py) on made-up results of a two-GPU run: its
 * two-GPU lines — the scaling against the faster stage 1, the goals, and where the second GPU's time goes
 * per rank — run only where two GPUs are lent, so their arithmetic is checked here, figure by figure.
 * The same folder read as a one-GPU run (two workers sharing it) claims no scaling; a rank with no timed
 * wait ("n/a") prints as such and gives no split rather than a traceback. */
START_TEST(bench_stage3_table_two_gpu_arithmetic) {
    char *dir = test_tmpdir(), cmd[2048], *out;
    put(dir, "stage1.jsonl", S3_SUMMARY("4.30", "29767.44", "1", "780000000"));
    put(dir, "stage1_again.jsonl", S3_SUMMARY("4.24", "30188.68", "1", "780000000"));
    /* 2 × 128 images in 4.50 ms against the faster stage 1's 128 in 4.24 ms: 94.2% */
    put(dir, "stage3.jsonl",
        S3_SUMMARY("4.50", "56888.89", "2", "760000000,750000000")
        "{\"type\":\"comm_summary\",\"exposed_ms_median\":0.1,\"exposed_pct\":2.2}\n"
        "{\"type\":\"comm_per_rank\",\"fwd_bwd_ms_per_rank\":[3.9,3.95],\"exposed_backward_ms_per_rank\":[0.08,0.05],"
        "\"bcast_ms_per_rank\":[0.03,0.02]}\n");
    put(dir, "stage3_one.jsonl",
        S3_SUMMARY("4.28", "29906.54", "1", "770000000")
        "{\"type\":\"comm_per_rank\",\"fwd_bwd_ms_per_rank\":[3.85],\"exposed_backward_ms_per_rank\":[0.01],"
        "\"bcast_ms_per_rank\":[0.005]}\n");
    put(dir, "stage1_gpu1.jsonl", S3_SUMMARY("4.26", "30046.95", "1", "780000000"));
    put(dir, "stage1_both0.jsonl", S3_SUMMARY("4.31", "29698.38", "1", "780000000"));
    put(dir, "stage1_both1.jsonl", S3_SUMMARY("4.33", "29561.20", "1", "780000000"));
    snprintf(cmd, sizeof cmd, "cd %s && python3 tests/bench_stage3_table.py %s '2 GPUs' 2", test_root(), dir);
    int rc = test_run(cmd, &out);
    /* extra 4.50 − 4.24 = 260 µs; machinery 4.28 − 4.24 = 40; rank 0: forward+backward 3.90 − 3.85 = 50,
     * waits (0.08 + 0.03) − (0.01 + 0.005) = 95, rest 260 − 40 − 50 − 95 = 75; rank 1: 100, 55, 65 */
    static const char *const want[] = {
        "stage 1 measured twice: 4.30 and 4.24 ms/iter; the faster is the scaling reference",
        "94.2%",
        "stage 1 on the second GPU: 4.26 ms/iter (on the first: 4.24)",
        "stage 1 on both GPUs at once, independent runs: 4.31 / 4.33 ms/iter",
        "stage 3 with one process (no peer): 4.28 ms/iter, +40 us over stage 1",
        "stage 3 per rank, ms: forward+backward 3.900 / 3.950 | waited after backward 0.080 / 0.050 | waited for "
        "buffers 0.030 / 0.020",
        "two-GPU cost over stage 1, us/step: 260 = machinery 40 + per rank (rank 0: forward+backward +50, waits +95, "
        "rest +75; rank 1: forward+backward +100, waits +55, rest +65)",
        "goals: scaling >= 97%: FAIL (94.2%) | exposed comm <= 5% of the step: PASS (2.2%) | memory max/min <= 1.05: "
        "PASS (1.013)",
        "torchrun --no-python ./stage3: not run"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        ck_assert_msg(rc == 0 && strstr(out, want[i]), "exit %d, no '%s' in:\n%s", rc, want[i], out);
    free(out);

    /* the same results as a one-GPU run's: no scaling claimed, no split, the goals deferred */
    snprintf(cmd, sizeof cmd, "cd %s && python3 tests/bench_stage3_table.py %s '2 workers on 1 GPU' 1", test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "n/a (1 GPU)") && !strstr(out, "94.2%") && !strstr(out, "two-GPU cost") &&
                      strstr(out, "goals: scaling and exposed-communication goals need 2 GPUs"),
                  "one GPU, exit %d:\n%s", rc, out);
    free(out);

    /* 2 × 128 images in 4.36 ms: 97.2%, the goal met */
    put(dir, "stage3.jsonl",
        S3_SUMMARY("4.36", "58715.60", "2", "760000000,750000000")
        "{\"type\":\"comm_summary\",\"exposed_ms_median\":0.1,\"exposed_pct\":2.3}\n"
        "{\"type\":\"comm_per_rank\",\"fwd_bwd_ms_per_rank\":[3.9,3.95],\"exposed_backward_ms_per_rank\":[0.08,0.05],"
        "\"bcast_ms_per_rank\":[0.03,null]}\n");
    snprintf(cmd, sizeof cmd, "cd %s && python3 tests/bench_stage3_table.py %s '2 GPUs' 2", test_root(), dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "goals: scaling >= 97%: PASS (97.2%)") &&
                      strstr(out, "waited for buffers 0.030 / n/a") && !strstr(out, "two-GPU cost") &&
                      !strstr(out, "Traceback"),
                  "97.2%% and a rank without a timed broadcast, exit %d:\n%s", rc, out);
    free(out);

    /* bench_stage3.sh prints this table (a heredoc copy of it in the script would go unchecked) */
    snprintf(cmd, sizeof cmd, "grep -c 'python3 tests/bench_stage3_table.py \"$OUT\" \"$MODE\" \"$NGPU\"' "
             "%s/tests/bench_stage3.sh; grep -c \"<<'PY'\" %s/tests/bench_stage3.sh", test_root(), test_root());
    test_run(cmd, &out);
    ck_assert_msg(!strcmp(out, "1\n0\n"), "tests/bench_stage3.sh should call the table once and keep no Python of "
                  "its own (grep counts: %s)", out);
    free(out), free(dir);
}
END_TEST

/* A 2-GPU session runs bench_stage3_variants.sh as gpu_session.sh's two halves, each an ONLY list that
 * fits one 10-minute device call: a row added to the script and to neither list would never run there
 * (rows 26-27, --no-cuda-graph and --sync-bn, were left out for three days). Every row must be named
 * by one of the lists, or be the reference of a row that is (ONLY adds those itself); every name must
 * be a row (the script would refuse it, but only on the GPU machine). Reads the scripts, runs nothing. */
START_TEST(gpu_session_halves_name_every_variant) {
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd,
             "cd %s && only=$(sed -nE 's/.*ONLY=\"([^\"]*)\".*/\\1/p' tests/gpu_session.sh | tr '\\n' ' ') && "
             "rows=$(sed -nE 's/^ *(ROWS=\\()?\"([a-z0-9]+)\\|([a-z0-9-]+)\\|.*/\\2 \\3/p' "
             "tests/bench_stage3_variants.sh) && "
             "echo \"rows: $(echo \"$rows\" | wc -l), named: $(echo $only | wc -w)\" && "
             "refs=$(for k in $only; do echo \"$rows\" | awk -v k=$k '$1 == k {print $2}'; done | tr '\\n' ' ') && "
             "for k in $only; do echo \"$rows\" | grep -q \"^$k \" || echo \"no row: $k\"; done && "
             "for k in $(echo \"$rows\" | cut -d' ' -f1); do case \" $only $refs \" in *\" $k \"*) ;; "
             "*) echo \"in neither half: $k\" ;; esac; done",
             test_root());
    int rc = test_run(cmd, &out);
    int rows = 0, named = 0;
    const char *r = strstr(out, "rows: ");
    if (r) sscanf(r, "rows: %d, named: %d", &rows, &named);
    ck_assert_msg(rc == 0 && rows >= 20 && named >= 20 && !strstr(out, "no row:") && !strstr(out, "in neither half:"),
                  "exit %d (%d rows read from tests/bench_stage3_variants.sh, %d names from tests/gpu_session.sh's "
                  "ONLY lists):\n%s", rc, rows, named, out);
    free(out);
}
END_TEST

/* tests/train_parity.sh waits for a GPU and torch; its QUICK=1 run (tiny model, CPU) goes through the
 * same steps: the synthetic set written as CIFAR-10 files, then fp32, bf16 and DDP on two ranks, each
 * reading those files (its log says cifar10, not synthetic) and getting its table row, and the data
 * folder removed afterwards. Where torch is missing (CI) its column is a visible SKIP; where it is
 * there, PyTorch's rows are checked too. */
START_TEST(train_parity_cpu_smoke) {
    char *dir = test_tmpdir(), cmd[2048], path[1024], *out;
    /* a folder a killed run left (its marker inside) is removed; one without the marker is not ours */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/p/data.killed %s/p/data.mine && touch %s/p/data.killed/.written-by-train_parity "
             "%s/p/.written-by-train_parity %s/p/data.mine/notes.txt", dir, dir, dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "timeout -k 5 280 env QUICK=1 PARITY_OUT=%s/p bash %s/tests/train_parity.sh", dir,
             test_root());
    int rc = test_run(cmd, &out);
    const char *tail = strlen(out) > 3000 ? out + strlen(out) - 3000 : out;
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, tail);
    int torch = !strstr(out, "SKIP  PyTorch's column");
    if (!torch) printf("    SKIP: compare: train_parity's PyTorch column — python3 has no torch here\n");
    const char *fp32 = strstr(out, "\nfp32 "), *bf16 = strstr(out, "\nbf16 "), *ddp2 = strstr(out, "\nddp2 ");
    ck_assert_msg(fp32 && bf16 && ddp2 && strstr(ddp2, "(") && (!torch || count_of(out, "difference of means") == 3),
                  "no table rows for fp32, bf16 and ddp2%s:\n%s", torch ? " with PyTorch's column" : "", tail);
    static const char *const runs[] = {"fp32", "bf16", "ddp2"};
    for (int i = 0; i < 3; i++) { /* each run read the written files */
        snprintf(path, sizeof path, "%s/p/ours_%s_1.log", dir, runs[i]);
        char *log = test_slurp(path, NULL);
        ck_assert_msg(log && strstr(log, "data: cifar10:train"), "%s does not say it read the files:\n%s", path,
                      log ? log : "(missing)");
        free(log);
    }
    snprintf(cmd, sizeof cmd, "for f in %s/p/data.*; do [ -e \"$f\" ] && echo \"$f\"; done; true", dir);
    char *left, want[1024];
    test_run(cmd, &left);
    snprintf(want, sizeof want, "%s/p/data.mine\n", dir); /* the user's stays; ours (and the killed run's) went */
    ck_assert_msg(!strcmp(left, want) && strstr(out, "data.killed, left by a run that was killed"),
                  "data folders left: '%s', want only %s", left, want);
    free(left);
    free(out);
    snprintf(cmd, sizeof cmd, "env QUICK=1 CONFIGS='fp32 fp8' PARITY_OUT=%s/q bash %s/tests/train_parity.sh", dir,
             test_root());
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "'fp8' is not one of fp32 fp16 bf16 ddp2"), "exit %d:\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* tests/run_suites.sh (make test-parallel): every suite's line, the total summed from Check's
 * summaries, and a failing suite fails the run and shows its output. A stand-in runner fails one of
 * two suites; then the real runner (this binary) runs one real suite through the script. */
START_TEST(run_suites_sums_and_fails) {
    char *dir = test_tmpdir(), cmd[2048], fake[1024], *out;
    snprintf(fake, sizeof fake, "%s/fake_runner", dir);
    test_write_text(fake, "#!/bin/sh\nif [ \"$1\" = adam ]; then echo 'adam went wrong here'; echo '50%: Checks: 2, "
                          "Failures: 1, Errors: 0'; exit 1; fi\necho 'SKIP: rng: a thing'; echo '100%: Checks: 3, "
                          "Failures: 0, Errors: 0'\n");
    ck_assert_int_eq(chmod(fake, 0755), 0);
    snprintf(cmd, sizeof cmd, "JOBS=2 TEST_BIN=%s bash %s/tests/run_suites.sh rng adam", fake, test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "rng rc=0 ") && strstr(out, "\n    SKIP: rng: a thing") &&
                      strstr(out, "adam rc=1 ") && strstr(out, "    adam went wrong here") &&
                      strstr(out, "total: 5 checks, 1 failures, 0 errors"), "exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "TEST_BIN=%s bash %s/tests/run_suites.sh nosuch", fake, test_root());
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "no suite named 'nosuch'"), "exit %d:\n%s", rc, out);
    free(out);
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert(n > 0);
    self[n] = 0;
    /* the suite the runner is asked for alone, whatever case filter this run was started with */
    snprintf(cmd, sizeof cmd, "env -u CK_RUN_CASE TEST_BIN=%s bash %s/tests/run_suites.sh rng", self, test_root());
    rc = test_run(cmd, &out);
    const char *line = strstr(out, "rng rc=0 "), *checks = line ? strstr(line, "Checks: ") : NULL;
    char total[64];
    snprintf(total, sizeof total, "total: %d checks, 0 failures, 0 errors", checks ? atoi(checks + 8) : -1);
    ck_assert_msg(rc == 0 && checks && atoi(checks + 8) > 0 && strstr(out, total), "exit %d, want '%s':\n%s", rc,
                  total, out);
    free(out), free(dir);
}
END_TEST

Suite *suite_compare(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink multicast in any worker these tests start */
    Suite *s = suite_create("compare");
    TCase *tc = tcase_create("compare");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, compare_leaves_out_missing_stages);
    tcase_add_test(tc, compare_chart_names_failed_rows);
    tcase_add_test(tc, compare_warns_when_stage1_drifts);
    tcase_add_test(tc, compare_read_only_results_folder_is_refused);
    tcase_add_test(tc, compare_counts_rows_without_a_summary);
    tcase_add_test(tc, compare_table_refuses_a_broken_plan);
    tcase_add_test(tc, compare_table_reads_odd_results_without_a_traceback);
    tcase_add_test(tc, python_tools_parse_as_python_3_7);
    tcase_add_test(tc, compare_names_a_row_stopped_at_its_limit);
    tcase_add_test(tc, short_runs_say_na_and_cpu_runs_say_what_they_show);
    tcase_add_test(tc, compare_quick_has_every_stage);
    tcase_add_test(tc, bench_stage3_variants_cpu_smoke);
    tcase_add_test(tc, bench_stage3_table_two_gpu_arithmetic);
    tcase_add_test(tc, train_parity_cpu_smoke);
    tcase_add_test(tc, run_suites_sums_and_fails);
    suite_add_tcase(s, tc);
    TCase *session = tcase_create("gpu_session"); /* CK_RUN_CASE=gpu_session: reads scripts, runs nothing */
    tcase_add_test(session, gpu_session_halves_name_every_variant);
    suite_add_tcase(s, session);
    return s;
}
