/* tests.h — the suites of the Check test runner and small shared test helpers.
 * Each tests/test_*.c file defines one suite_*() listed here and in test_main.c. */
#ifndef TESTS_H
#define TESTS_H

#include <check.h>
#include <math.h>
#include <stdint.h>

Suite *suite_rng(void);
Suite *suite_ops_ref(void);     /* CPU reference: finite-difference gradient checks in float64 */
Suite *suite_ops_cuda(void);    /* CUDA ops against the CPU reference (skips without a GPU) */
Suite *suite_fixtures(void);    /* PyTorch fixtures (tests/fixtures/) against the CPU backend */
Suite *suite_data(void);
Suite *suite_loader(void);
Suite *suite_checkpoint(void);
Suite *suite_cli(void);
Suite *suite_model(void);
Suite *suite_e2e(void);         /* runs ./stage1 end to end */
/* Stages 2 and 3. */
Suite *suite_gil(void);         /* stage 2: the GIL model */
Suite *suite_dp(void);          /* stage 2: scatter / replicate / gather / reduce, DP ≡ one device */
Suite *suite_dist(void);        /* stage 3: launcher, rendezvous store, communicators */
Suite *suite_resume(void);      /* resuming under other flags: refused naming the flag, or exact */
Suite *suite_store(void);       /* the store and the host ring's ports under attack: secret, limits, timeouts */
Suite *suite_ddp(void);         /* stage 3: buckets, DDP ≡ one device, faults */
Suite *suite_accum(void);       /* stage 4: accumulation ≡ a K× batch, no_sync counts, resume */
Suite *suite_adam(void);        /* --optimizer adam against torch.optim.Adam */
Suite *suite_syncbn(void);       /* --sync-bn: SyncBatchNorm's ops against plain batch norm; stages 3–5 */
Suite *suite_clip(void);        /* --clip-grad-norm against clip_grad_norm_; where each stage clips */
/* Stage 5. */
Suite *suite_amp(void);         /* mixed precision: conversions, autocast ops, GradScaler, ./stage5 */
Suite *suite_trace(void);       /* --trace: the timeline files of stages 1–3 (CPU) */
Suite *suite_compare(void);     /* make compare: every stage's row; CPU runs' note; "n/a" timings */
Suite *suite_tutorial(void);    /* the doc test: docs/tutorial.md's CPU commands run (tests/tutorial_test.sh) */
Suite *suite_flops(void);       /* FLOPs per step (model_flops) against PyTorch; the summary's TFLOP/s */

/* Uniform random floats in [lo, hi) from a fixed seed (test inputs). */
void test_fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi);
void test_fill_uniform_f64(double *x, int64_t n, uint64_t seed, double lo, double hi);
/* The larger of m and v for a running maximum of errors: a NaN v wins and then stays, so a NaN output
 * fails the bound it is checked against. fmax would drop it (and, over floats widened to double,
 * crashes GCC 12 at -O3 on aarch64: an internal compiler error in vect_transform_reduction). */
static inline double test_max_nan(double m, double v) { return v > m || isnan(v) ? v : m; }
/* max |a−b| / max(1, max|b|) style relative error: ‖a−b‖∞ / max(‖b‖∞, tiny). */
double test_rel_err(const float *a, const float *b, int64_t n);
/* 1 if a CUDA device is visible; prints a visible SKIP line naming `what` otherwise (once per what). */
int test_have_gpu(const char *what);
/* Path of the repository root (where ./stage1 lives), from the runner's argv[0] or "." */
const char *test_root(void);
/* Run fn(arg) in a forked child with stdout+stderr captured into *out (malloc'd); returns its exit
 * status (0 when fn returns, 128+signal when killed). For code that must exit(2) on bad input. */
int test_run_captured(void (*fn)(void *), void *arg, char **out);
/* A free loopback port p (with p+1 free too) for a test's rendezvous store. */
int test_free_port(void);
/* How much slower this build runs: TEST_TIME_SCALE (make sanitize / tsan set it), at least 1. Every
 * wall-clock bound a test asserts is multiplied by it. */
double test_time_scale(void);
/* The rendezvous secret (auth.h) tests that open a store put in their environment. */
#define TEST_SECRET "test-suite-rendezvous-secret"
/* The "loss" of every {"type":"step"} line of a JSON-lines report, in order; returns how many. */
int test_read_losses(const char *path, double *loss, int max);
/* Field `key` of every {"type":"<type>"} record that has it, in order (NAN for null); returns how many. */
int test_report_series(const char *path, const char *type, const char *key, double *out, int max);
/* Field `key` of the last {"type":"<type>"} record (NAN if none, if it lacks the key, or null). */
double test_report_field(const char *path, const char *type, const char *key);
/* The numbers of list `key` ("key":[a,b,…]) of the last {"type":"<type>"} record of a report, into
 * out (at most max); returns how many, or -1 without such a record or key. */
int test_report_list(const char *path, const char *type, const char *key, double *out, int max);
/* PyTorch's lr for optimizer steps 0..total of one case of tests/fixtures/schedule.txt (made by
 * tests/torch/schedule_fixture.py), e.g. ("cosine", 9, 0.1); returns how many, or -1 without the case. */
int test_torch_schedule(const char *schedule, int total, double lr, double *out, int max);
/* A whole file as a malloc'd NUL-terminated string (NULL if missing); *len gets its size. */
char *test_slurp(const char *path, long *len);
/* text written to path (created or emptied); a test failure if it cannot be. */
void test_write_text(const char *path, const char *text);
/* A checkpoint's header alone (magic, version 9, its 304-byte header size, then zeros) written to path:
 * a file that --resume's up-front check passes (checkpoint_check_start) and checkpoint_load refuses
 * ("is truncated") — for tests of the refusals that come later, in the run (rank 0's, in a job). */
void test_write_ckpt_header_only(const char *path);
/* The bytes b (n, a checkpoint in today's format: version 9, a 304-byte header) rewritten as an older
 * version whose header ends at `header` (each older header is a prefix of today's): the fields after it
 * dropped, the blobs moved up, version and header size set. A malloc'd copy, its length in *n_old; the
 * checksum is the caller's to make good. */
unsigned char *test_ckpt_as_version(int version, size_t header, const unsigned char *b, size_t n, size_t *n_old);
/* A fresh directory under /tmp (malloc'd path). */
char *test_tmpdir(void);
/* Another user's file, as a run meets it in a shared directory: DIR made sticky and world-writable (as
 * /tmp) and DIR/NAME created read-only, with the prefix to run the command under so that it may not
 * write it — "", or as root "setpriv …", which drops root's power to write any file (running as
 * another user instead, the binary may sit where that user cannot reach it, as under /root). NULL,
 * after a SKIP line naming WHAT, where root cannot drop it (setpriv missing, or no CAP_SETPCAP). */
const char *test_unwritable_file(const char *dir, const char *name, char *path, size_t len, const char *what);
/* Run a shell command, capturing stdout+stderr into a malloc'd string; returns exit status. */
int test_run(const char *cmd, char **output);
/* test_run for a command that must succeed (exit 0; else the test fails, naming `what`, the command
 * and its output); the output is returned (malloc'd) when out is not NULL. */
void test_run_ok(const char *cmd, const char *what, char **out);
/* PyTorch fixtures: tests/fixtures/NAME, a "FIXT0001" file of named records (the format in
 * tests/torch/fixtures.py). Their memory lives until the test process ends and stays reachable
 * (fx_keep), so that leak checks pass without a close. */
typedef struct Fx {
    char *buf;
    long len;
} Fx;
/* Open tests/fixtures/name; a missing file fails the test naming `maker`, the script that writes it. */
Fx fx_open(const char *name, const char *maker);
/* Record `name` (fails the test if absent): a copy of its data — the file does not align records —
 * and its element count and dtype (0 f32, 1 f64, 2 i64, 3 i32). */
const void *fx_get(const Fx *fx, const char *name, int64_t *count, int *dtype);
/* Record "CAS.FIELD" of a fixture whose cases share field names (the optimizers' oracles): fails the
 * test unless it has that dtype and count. */
const void *fx_need(const Fx *fx, const char *cas, const char *field, int dtype, int64_t count);
/* p, listed so that it stays reachable until the process ends (leak checks); returns p. */
void *fx_keep(void *p);
/* (test_ddp.c) A checkpoint's parameters (malloc'd), and a model's parameter count. */
float *test_load_params(const char *path, const char *arch, int norm_bn);
int64_t test_n_params(const char *arch); /* without batch norm (--norm none) */
int64_t test_n_params_norm(const char *arch, int norm_bn);

#endif
