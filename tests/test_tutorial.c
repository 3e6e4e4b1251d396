/* test_tutorial.c — the doc tests: every command of docs/tutorial.md marked ```sh cpu-test runs and
 * exits as the tutorial says (tests/tutorial_test.sh does the work); every relative link of every page
 * resolves and every translation (X.zh-CN.md, docs/tutorial.zh-CN.md among them) keeps the headings,
 * code blocks — commands and their cpu-test markers included — and tables of the page it translates
 * (tests/doc_check.py). The other tests feed both scripts small broken pages, so we know they fail —
 * naming the block, file and line — when a command breaks, a link dies or a translation drifts. The
 * stage READMEs' transcripts (a bare ``` block of `$ ` commands and their output) run too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests.h"

/* Run tests/tutorial_test.sh on a Markdown file (NULL: the real tutorial). */
static int run_doc_test(const char *md, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "bash %s/tests/tutorial_test.sh %s", test_root(), md ? md : "");
    return test_run(cmd, out);
}

START_TEST(tutorial_cpu_commands_run) {
    char *out;
    int rc = run_doc_test(NULL, &out);
    ck_assert_msg(rc == 0, "a command of docs/tutorial.md failed:\n%s", out);
    /* It really ran something: every stage's training command, not only --help. */
    const char *must[] = {"./stage1 --device cpu", "./stage2 --device cpu", "./stage3 --device cpu",
                          "./stage4 --device cpu", "STAGE3_FAIL_AT=1:3"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        ck_assert_msg(strstr(out, must[i]), "the doc test did not run a block with '%s':\n%s", must[i], out);
    printf("%s", strstr(out, "tutorial_test:") ? strstr(out, "tutorial_test:") : "");
    free(out);
}
END_TEST

/* Every English page with a transcript (its zh-CN twin holds the same code blocks: doc_check): the
 * commands run and print the lines the page shows. */
START_TEST(readme_transcripts_run) {
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "cd %s && n=0; for f in $(grep -l '^\\$ ' stages/*/README.md docs/*.md | grep -v zh-CN); "
             "do n=$((n + 1)); bash tests/tutorial_test.sh $f || echo \"FAILED: $f\"; done; echo \"pages: $n\"",
             test_root());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(!strstr(out, "FAILED: ") && !strstr(out, "FAIL: "), "a page's transcript drifted:\n%s", out);
    /* it ran the READMEs' runs: the sampler's three ranks, stage 4's two runs, stage 5's inf step */
    const char *must[] = {"transcript  1 (line", "--show-sampler --dataset-size 10 --world-size 3",
                          "./stage4 --device cpu --epochs 1 --train-size 4096 --deterministic", "--test-inf-step 3"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        ck_assert_msg(strstr(out, must[i]), "no transcript with '%s' ran:\n%s", must[i], out);
    free(out);
}
END_TEST

/* A transcript's rules: its lines in order, each whole, `…` and `...` any text, a `...` line any lines;
 * a wrong figure or a line out of order fails, naming the transcript, its line and the line missing. */
START_TEST(transcript_test_fails_on_a_drifted_line) {
    char *dir = test_tmpdir(), md[512], *out;
    snprintf(md, sizeof md, "%s/t.md", dir);
    const char *good = "# t\n\n```\n$ printf 'a 1\\nnoise\\nsummary: 3 steps in 4.2 s | loss 2.5 | x\\n'\n"
                       "a 1\n...\nsummary: 3 steps in … s | loss 2.5 ...\n```\n";
    test_write_text(md, good);
    int rc = run_doc_test(md, &out);
    ck_assert_msg(rc == 0 && strstr(out, "ok   transcript  1 (line   4)") && strstr(out, "1 transcripts"),
                  "a transcript that holds passed nothing:\n%s", out);
    free(out);
    const char *bad[] = {
        "# t\n\n```\n$ printf 'a 1\\nsummary: 3 steps in 4.2 s | loss 2.5\\n'\nsummary: 3 steps in … s | loss 2.6\n```\n",
        "# t\n\n```\n$ printf 'b\\na\\n'\na\nb\n```\n",         /* out of order */
        "# t\n\n```\n$ printf 'a 10\\n'\na 1\n```\n",               /* a part of a line is not the line */
        "# t\n\n```\n$ printf 'a\\n'; exit 3\na\n```\n"};           /* a failing command */
    const char *says[] = {"printed no line like 'summary: 3 steps in … s | loss 2.6'", "printed no line like 'b'",
                          "printed no line like 'a 1'", "exited with code 3"};
    for (int i = 0; i < 4; i++) {
        test_write_text(md, bad[i]);
        rc = run_doc_test(md, &out);
        ck_assert_msg(rc != 0 && strstr(out, "FAIL: transcript 1 (") && strstr(out, "line 4)") && strstr(out, says[i]),
                      "case %d: want '%s':\n%s", i, says[i], out);
        free(out);
    }
    unlink(md);
    rmdir(dir);
    free(dir);
}
END_TEST

/* A tutorial with a good block, a broken one and a pending one: the script fails and names block 2
 * and its line; the good block still reports ok; the pending block is not run. Then exit=N and
 * '# expect:' lines, each enforced. */
START_TEST(tutorial_test_fails_on_a_broken_command) {
    char *dir = test_tmpdir(), en[512], *out;
    snprintf(en, sizeof en, "%s/t.md", dir);
    const char *doc_en = "# t\n\n```sh cpu-test\n./stage1 --help   # every flag\n```\n\ntext\n\n"
                         "```sh cpu-test\n./stage1 --device cpu --no-such-flag\n```\n\n"
                         "```sh cpu-test-pending\nexit 7\n```\n";
    test_write_text(en, doc_en);
    int rc = run_doc_test(en, &out);
    ck_assert_msg(rc != 0, "a broken command passed the doc test:\n%s", out);
    ck_assert_msg(strstr(out, "FAIL: block 2 (") && strstr(out, "line 9)"), "the failure does not name block 2, line 9:\n%s", out);
    ck_assert_msg(strstr(out, "unknown option '--no-such-flag'"), "the command's own error is not shown:\n%s", out);
    ck_assert_msg(strstr(out, "ok   block  1"), "the good block was not reported ok:\n%s", out);
    ck_assert_msg(strstr(out, "1 pending"), "the pending block was not counted:\n%s", out);
    free(out);

    /* Fixed, the same tutorial passes (so it was the command, not the harness). */
    test_write_text(en, "```sh cpu-test\n./stage1 --help\n```\n```sh cpu-test exit=1\nfalse\n```\n");
    rc = run_doc_test(en, &out);
    ck_assert_msg(rc == 0, "a good tutorial failed:\n%s", out);
    free(out);

    /* exit=N is checked exactly: a command expected to fail that succeeds is a failure. */
    test_write_text(en, "```sh cpu-test exit=3\ntrue\n```\n");
    rc = run_doc_test(en, &out);
    ck_assert_msg(rc != 0 && strstr(out, "FAIL: block 1") && strstr(out, "expects 3"), "exit=3 not enforced:\n%s", out);
    free(out);

    /* '# expect: TEXT' lines: the output must hold each; the first missing one is named. */
    test_write_text(en, "```sh cpu-test\necho 'lr 0.202'\n# expect: lr 0.202\n# expect: lr 0.334\n```\n");
    rc = run_doc_test(en, &out);
    ck_assert_msg(rc != 0 && strstr(out, "FAIL: block 1") && strstr(out, "printed no 'lr 0.334'") &&
                      !strstr(out, "printed no 'lr 0.202'"), "'# expect:' not enforced:\n%s", out);
    free(out);
    test_write_text(en, "```sh cpu-test\necho 'lr 0.202, lr 0.334'\n# expect: lr 0.202\n# expect: lr 0.334\n```\n");
    rc = run_doc_test(en, &out);
    ck_assert_msg(rc == 0, "a block that prints what it expects failed:\n%s", out);
    free(out), free(dir);
}
END_TEST

/* Runs `doc` (a page of cpu-test blocks) through the doc test, which must pass and leave `real` (a path
 * the blocks name, moved by the test to a folder of its own) unwritten; removes it if they wrote it. */
static void blocks_pass_leaving_alone(const char *doc, const char *real) {
    char *dir = test_tmpdir(), en[512], *out;
    snprintf(en, sizeof en, "%s/t.md", dir);
    test_write_text(en, doc);
    int rc = run_doc_test(en, &out);
    struct stat st;
    const int touched = stat(real, &st) == 0;
    if (touched) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", real);
        ck_assert_int_eq(system(cmd), 0);
    }
    ck_assert_msg(rc == 0, "the blocks failed:\n%s", out);
    ck_assert_msg(!touched, "the blocks wrote the real %s:\n%s", real, out);
    free(out), free(dir);
}

/* A page's blocks that write fixed names under /tmp (as the tutorial's once did: `rm -rf /tmp/ddp_run`,
 * then --save there): two runs of the doc test on one machine deleted and locked each other's files,
 * and another user's leftover failed it. Each run has its own /tmp for its blocks, shared from block
 * to block, and the real /tmp is not touched. */
START_TEST(tutorial_blocks_get_a_tmp_of_their_own) {
    char name[64], real[128], doc[1024];
    snprintf(name, sizeof name, "tutorial_tmp_probe_%d", (int)getpid());
    snprintf(real, sizeof real, "/tmp/%s", name);
    unlink(real);
    snprintf(doc, sizeof doc, "```sh cpu-test\nrm -rf /tmp/%s\nmkdir /tmp/%s && echo kept > /tmp/%s/f\n```\n\n"
             "```sh cpu-test\n# expect: kept\ncat /tmp/%s/f\n```\n", name, name, name, name);
    blocks_pass_leaving_alone(doc, real);
}
END_TEST

/* The same for the page's runs/ paths (`mkdir -p runs/tutorial`, `--save runs/tutorial/ddp_run`): a
 * reader's runs go into their own clone, git-ignored, but the doc test must leave the checkout it
 * tests as it found it — a student's runs/tutorial/ddp_run is not its to delete, nor to fill. Only a
 * path that starts with runs/ (or ./runs/) as a word moves: ./stage1, tests/… and docs/logs/runs/…
 * stay as written. */
START_TEST(tutorial_blocks_get_a_runs_of_their_own) {
    char name[64], real[1024], doc[2048];
    snprintf(name, sizeof name, "tutorial_runs_probe_%d", (int)getpid());
    snprintf(real, sizeof real, "%s/runs/%s", test_root(), name);
    snprintf(doc, sizeof doc,
             "```sh cpu-test\nrm -rf runs/%s\nmkdir -p runs/%s && echo kept > runs/%s/f\n```\n\n"
             "```sh cpu-test\n# expect: kept\ncat runs/%s/f \"./runs/%s/f\"\ntest -x ./stage1 && test -f tests/tutorial_test.sh\n"
             "# expect: as written: docs/logs/runs/x tests/runs/y my_runs/z\n"
             "echo as written: docs/logs/runs/x tests/runs/y my_runs/z\n```\n",
             name, name, name, name, name);
    blocks_pass_leaving_alone(doc, real);
}
END_TEST

/* tests/doc_check.py on a folder (NULL: the checkout the script is in — not test_root(), which under the
 * sanitizers is a folder of links without the README), with the flags checked against the built stages
 * (test_root()'s) when `flags` is set. 77 when python3 is missing. */
static int run_doc_check(const char *root, int flags, char **out) {
    if (system("python3 -c 'import unicodedata' >/dev/null 2>&1") != 0) {
        printf("SKIP doc_check: python3 is missing (tests/doc_check.py checks the links and translations)\n");
        return 77;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/doc_check.py %s%s%s", test_root(), root ? root : "",
             flags ? " --stages " : "", flags ? test_root() : "");
    return test_run(cmd, out);
}

START_TEST(docs_links_resolve_and_translations_match) {
    char *out = NULL;
    int rc = run_doc_check(NULL, 1, &out);
    if (rc == 77) return;
    ck_assert_msg(rc == 0, "a dead link, a drifted translation or a flag no stage has in the docs:\n%s", out);
    ck_assert_msg(strstr(out, "flags checked against ./stage1"), "the flags were not checked:\n%s", out);
    /* It read the pages: the README, docs/ and every stage's lesson, and all seven translations. */
    int pages = 0, twins = 0;
    const char *last = strstr(out, "doc_check:");
    ck_assert_msg(last && sscanf(last, "doc_check: %d pages, %d translations", &pages, &twins) == 2,
                  "no summary line:\n%s", out);
    ck_assert_msg(pages >= 25 && twins >= 7, "doc_check read %d pages and %d translations:\n%s", pages, twins, out);
    printf("%s", last);
    free(out);
}
END_TEST

/* A page with a dead link, a wrong anchor and a good one, and a translation that drifted in every way
 * the check knows: each problem is named with its file (and line), and nothing else is. */
START_TEST(doc_check_fails_on_dead_links_and_drifted_translations) {
    char *dir = test_tmpdir(), en[512], zh[512], sub[512], *out = NULL;
    snprintf(en, sizeof en, "%s/page.md", dir);
    snprintf(zh, sizeof zh, "%s/page.zh-CN.md", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    char other[600];
    snprintf(other, sizeof other, "%s/other.md", sub);
    test_write_text(other, "# Other\n\n## Why `--cudnn-benchmark` lost, and what fixed it\n\n## 为什么：慢（两倍）\n\n"
                      "[back](../page.md#two-steps) [dead](../gone.md) [web](https://example.com/x.md)\n");
    test_write_text(en, "# Page\n\n[中文](page.zh-CN.md) [ok](sub/other.md#why---cudnn-benchmark-lost-and-what-fixed-it)"
                   " [zh anchor](sub/other.md#为什么慢两倍) `[not a link](nowhere.md)`\n\n"
                   "## Two steps\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                   "```sh\n./stage1 --help   # every flag\n```\n\n```text\nloss 2.30\n```\n\n"
                   "[bad anchor](#three-steps)\n");
    /* Good: translated comments and prose only. */
    test_write_text(zh, "# 页\n\n[English](page.md)\n\n## 两步\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                   "```sh\n# 一条注释\n./stage1 --help   # 所有参数\n```\n\n```text\nloss 2.30\n```\n");
    int rc = run_doc_check(dir, 0, &out);
    if (rc == 77) { free(dir); return; }
    ck_assert_msg(rc == 1, "broken links passed doc_check:\n%s", out);
    ck_assert_msg(strstr(out, "sub/other.md:7: link to ../gone.md: gone.md does not exist"), "dead link not named:\n%s", out);
    ck_assert_msg(strstr(out, "page.md:19: link to #three-steps: no heading of page.md has the anchor #three-steps"),
                  "wrong anchor not named:\n%s", out);
    ck_assert_msg(strstr(out, "3 pages, 1 translations, 2 problems"),
                  "good links, web links, a code span or the translation were flagged:\n%s", out);
    free(out);

    /* The translation drifts: a heading level, a command, an output line, a table row, the link back. */
    test_write_text(zh, "# 页\n\n### 两步\n\n| a | b |\n|---|---|\n\n"
                   "```sh\n./stage1 --help --x   # 所有参数\n```\n\n```text\nloss 2.31\n```\n");
    rc = run_doc_check(dir, 0, &out);
    ck_assert_msg(rc == 1, "a drifted translation passed doc_check:\n%s", out);
    const char *must[] = {"page.zh-CN.md: headings differ from page.md at heading 2",
                          "page.zh-CN.md:8: code block differs from page.md:11 in its commands",
                          "page.zh-CN.md:12: code block differs from page.md:15 in its text",
                          "page.zh-CN.md: 2 table rows, page.md has 3",
                          "page.zh-CN.md: does not link back to page.md"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        ck_assert_msg(strstr(out, must[i]), "doc_check did not say '%s':\n%s", must[i], out);
    free(out);

    /* A block's marker changed (the tutorial test would run it in one language only), and one missing. */
    test_write_text(zh, "# 页\n\n[English](page.md)\n\n## 两步\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                   "```sh cpu-test\n./stage1 --help\n```\n");
    rc = run_doc_check(dir, 0, &out);
    ck_assert_msg(rc == 1 && strstr(out, "page.zh-CN.md: 1 code blocks, page.md has 2") &&
                      strstr(out, "page.zh-CN.md:11: code block opens ```sh cpu-test, page.md:11 opens ```sh"),
                  "a changed marker or a missing block passed doc_check:\n%s", out);
    free(out);

    /* Flags: a stage's command with a flag it lacks (one another stage has, one no stage has, one on a
     * continued line), a span naming no stage's flag; a family, another program's flag and good
     * commands pass. */
    const char *block = "```sh\n./stage1 --epochs 1 --nproc-per-node 2\n./stage3 --epochs 1 \\\n"
                        "    --no-such-flag 3 | tail -1\n```\n\n";
    ck_assert_int_eq(unlink(other), 0);
    char page[1024];
    snprintf(page, sizeof page, "# 页\n\n[English](page.md)\n\n%s", block);
    test_write_text(zh, page); /* the translation holds the same block: its three problems are reported too */
    snprintf(page, sizeof page, "# Page\n\n[中文](page.zh-CN.md)\n\n%s"
                   "`./stage5 --amp bf16` and `--grad-com fp16`, the `--gil-*` family, `--kernel-name-exclude`, "
                   "`--grad-comm fp16`; torchrun --nproc-per-node 2 ./stage3 --epochs 1\n", block);
    test_write_text(en, page);
    rc = run_doc_check(dir, 1, &out);
    ck_assert_msg(rc == 1 && strstr(out, "page.md:6: ./stage1 has no flag --nproc-per-node") &&
                      strstr(out, "page.md:8: ./stage3 has no flag --no-such-flag") &&
                      strstr(out, "page.md:11: `--grad-com` is no stage's flag") &&
                      strstr(out, "page.zh-CN.md:6: ./stage1 has no flag --nproc-per-node") && strstr(out, "5 problems"),
                  "a flag no stage has passed doc_check (or a good one was flagged):\n%s", out);
    free(out), free(dir);
}
END_TEST

/* Bench commands: a quoted `bash tests/X.sh` (or `make T`, whose recipe runs it) whose linked log ran it
 * with other step counts is named, wrapped over two lines too; the log's own counts quoted, a log
 * without a header naming the command, or a link that belongs to the next command, pass. */
START_TEST(doc_check_matches_bench_commands_to_their_logs) {
    char *dir = test_tmpdir(), path[600], *out = NULL;
    snprintf(path, sizeof path, "%s/logs", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/logs/a.txt", dir);
    test_write_text(path, "# NCCL_NVLS_ENABLE=0 STEPS=150 bash tests/bench_x.sh (make x), one GPU\nx 4.24 ms\n");
    snprintf(path, sizeof path, "%s/logs/plain.txt", dir);
    test_write_text(path, "x 4.30 ms\n# STEPS=9 bash tests/bench_x.sh\n");
    snprintf(path, sizeof path, "%s/page.md", dir);
    test_write_text(path, "# P\n\n4.24 ms (`bash tests/bench_x.sh`, [log](logs/a.txt)).\n\n"
                     "4.24 ms (`MEM_STEPS=3 STEPS=150 bash\ntests/bench_x.sh`, [log](logs/a.txt)).\n\n"
                     "4.24 ms (`STEPS=150 bash tests/bench_x.sh`, [log](logs/a.txt)); 4.30 ms (`bash tests/bench_x.sh`,\n"
                     "[log](logs/plain.txt)).\n\n"
                     "Runs: `bash tests/bench_x.sh` at 300 steps, and `STEPS=150 bash tests/bench_x.sh`, [log](logs/a.txt).\n\n"
                     "`make x` ([log](logs/a.txt)); `make x STEPS=150` ([log](logs/a.txt)).\n");
    snprintf(path, sizeof path, "%s/Makefile", dir); /* make x runs the script: its spans are the script's */
    test_write_text(path, "all: x\n\nx: stage1\n\tbash tests/bench_x.sh\n");
    int rc = run_doc_check(dir, 0, &out);
    if (rc == 77) { free(dir); return; }
    ck_assert_msg(rc == 1 &&
                      strstr(out, "page.md:3: `bash tests/bench_x.sh` — its log a.txt ran it with STEPS=150") &&
                      strstr(out, "page.md:5: `MEM_STEPS=3 STEPS=150 bash tests/bench_x.sh` — its log a.txt ran it "
                                  "with STEPS=150") &&
                      strstr(out, "page.md:13: `make x` — its log a.txt ran it with STEPS=150") && strstr(out, "3 problems"),
                  "a bench command unlike its log's passed doc_check (or a matching one was flagged):\n%s", out);
    free(out), free(dir);
}
END_TEST

/* Logs: a file in docs/logs that no page, script or source names is a problem; one a page links, one a
 * script names, and one named only by another log (a log is no citation) are told apart. */
START_TEST(doc_check_names_logs_nothing_cites) {
    char *dir = test_tmpdir(), path[600], *out = NULL;
    const char *logs[] = {"docs", "docs/logs", "tests"};
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, logs[i]);
        ck_assert_int_eq(mkdir(path, 0755), 0);
    }
    const char *files[][2] = {
        {"docs/logs/linked.txt", "x 4.24 ms\n"},
        {"docs/logs/scripted.jsonl", "{}\n"},
        {"docs/logs/orphan.txt", "see also linked.txt and orphan_2.md\n"},
        {"docs/logs/orphan_2.md", "# a log that names only itself: orphan_2.md\n"},
        {"docs/page.md", "# P\n\n4.24 ms ([log](logs/linked.txt)).\n"},
        {"tests/bench.sh", "echo > docs/logs/scripted.jsonl\n"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i][0]);
        test_write_text(path, files[i][1]);
    }
    int rc = run_doc_check(dir, 0, &out);
    if (rc == 77) { free(dir); return; }
    ck_assert_msg(rc == 1 && strstr(out, "docs/logs/orphan.txt: no page, script or source names it") &&
                      strstr(out, "docs/logs/orphan_2.md: no page, script or source names it") && strstr(out, "2 problems"),
                  "a log nothing cites passed doc_check (or a cited one was flagged):\n%s", out);
    free(out), free(dir);
}
END_TEST

/* Report records: a record type the code writes (json_begin's literal, or ddp.c's report()) that the
 * README's "What each run prints" does not name is a problem; one named only outside that section is too. */
START_TEST(doc_check_names_every_report_record) {
    char *dir = test_tmpdir(), path[600], *out = NULL;
    snprintf(path, sizeof path, "%s/common", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/common/w.c", dir);
    test_write_text(path, "json_begin(&r->report, \"config\");\njson_begin(r, \"summary\");\n"
                     "json_begin(s->report, \"novel\");\nreport(d, \"comm_epoch\", &a, &b, &c);\n"
                     "json_begin(&r->report, type);\n");
    snprintf(path, sizeof path, "%s/README.md", dir);
    test_write_text(path, "# R\n\n## What each run prints\n\nRecords: `config`, `\"summary\"`, `comm_epoch`.\n\n"
                     "## Next\n\n`novel` named elsewhere does not count.\n");
    int rc = run_doc_check(dir, 0, &out);
    if (rc == 77) { free(dir); return; }
    ck_assert_msg(rc == 1 && strstr(out, "README.md:3: the --report record `novel` (common/w.c writes it) is not "
                                         "named under 'What each run prints'") && strstr(out, "1 problems"),
                  "a record type the README does not list passed doc_check (or a listed one was flagged):\n%s", out);
    free(out);
    /* Listed: it passes. */
    test_write_text(path, "# R\n\n## What each run prints\n\n`config`, `summary`, `comm_epoch` and `novel`.\n");
    rc = run_doc_check(dir, 0, &out);
    ck_assert_msg(rc == 0 && strstr(out, "0 problems"), "every record listed, yet doc_check failed:\n%s", out);
    free(out), free(dir);
}
END_TEST

Suite *suite_tutorial(void) {
    Suite *s = suite_create("tutorial");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, tutorial_cpu_commands_run);
    tcase_add_test(tc, tutorial_test_fails_on_a_broken_command);
    tcase_add_test(tc, readme_transcripts_run);
    tcase_add_test(tc, transcript_test_fails_on_a_drifted_line);
    tcase_add_test(tc, tutorial_blocks_get_a_tmp_of_their_own);
    tcase_add_test(tc, tutorial_blocks_get_a_runs_of_their_own);
    tcase_add_test(tc, docs_links_resolve_and_translations_match);
    tcase_add_test(tc, doc_check_fails_on_dead_links_and_drifted_translations);
    tcase_add_test(tc, doc_check_names_every_report_record);
    tcase_add_test(tc, doc_check_matches_bench_commands_to_their_logs);
    tcase_add_test(tc, doc_check_names_logs_nothing_cites);
    suite_add_tcase(s, tc);
    return s;
}
