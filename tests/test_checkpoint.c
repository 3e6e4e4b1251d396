/* test_checkpoint.c — checkpoints round-trip bit-exactly, and every damaged or mismatched file is
 * refused with exit status 2 and a message that says what is wrong; a failed save never destroys
 * the previous checkpoint.
 *
 * Failing saves are simulated without permissions (the tests may run as root): a path into a missing
 * directory, a file-size limit (RLIMIT_FSIZE, i.e. "disk full" after a few KiB), and the .tmp name
 * pointing at /dev/full. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "errors.h"
#include "tests.h"


/* ----------------------------------------------------------------------------------------------
 * a small fake model, a temporary directory per test */

enum { NP = 1000, NB = 37 };
#define HEADER 304    /* format version 9 */
#define HEADER_V8 296 /* format version 8 */
#define HEADER_V7 272 /* format version 7 */
#define HEADER_V5 256 /* format versions 5 and 6 */
#define HEADER_V2 192 /* format versions 2 to 4 */
#define FILE_BYTES (HEADER + 4 * (2 * NP + NB) + 8)

static char g_dir[64];
static char g_path[128];
static float g_params[NP], g_buffers[NB], g_mom[NP];
static CheckpointMeta g_meta;

static void fixture_setup(void) {
    strcpy(g_dir, "/tmp/test_ckpt_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/a.ckpt", g_dir);
    test_fill_uniform(g_params, NP, 1, -1, 1);
    test_fill_uniform(g_buffers, NB, 2, 0, 3);
    test_fill_uniform(g_mom, NP, 3, -0.01f, 0.01f);
    g_params[0] = -0.0f; /* bit patterns that a float compare would not distinguish */
    g_params[1] = NAN;
    g_params[2] = 1.40129846e-45f;
    g_mom[NP - 1] = INFINITY;
    memset(&g_meta, 0, sizeof g_meta);
    strcpy(g_meta.arch, "tiny");
    strcpy(g_meta.norm, "bn");
    g_meta.n_params = NP;
    g_meta.n_buffers = NB;
    g_meta.shape_hash = 0x0123456789abcdefull;
    g_meta.step = 1234567890123LL;
    g_meta.epoch = 3;
    g_meta.batch_in_epoch = 17;
    g_meta.seed = 4294967295LL;
    g_meta.momentum_valid = 1;
    g_meta.world_size = 4;
    g_meta.batch_size = 16;
    g_meta.train_size = 50000;
    g_meta.accum_steps = 3;
    g_meta.shuffle = 0; /* --no-shuffle --drop-last: neither is a zero-filled default */
    g_meta.drop_last = 1;
    g_meta.data_source = CKPT_DATA_CIFAR10;
    g_meta.scaler_scale = 32768.0; /* an fp16 run's GradScaler, backed off once, 7 steps since */
    g_meta.scaler_growth_tracker = 7;
    g_meta.scaler_growth_factor = 2.0;
    g_meta.scaler_backoff_factor = 0.5;
    g_meta.scaler_growth_interval = 2000;
    g_meta.schedule = CKPT_SCHED_COSINE; /* cosine over 11 epochs of 160 steps, --lr 0.05 */
    g_meta.schedule_steps = 1760;
    g_meta.lr = 0.05;
    g_meta.warmup_steps = 40; /* warmed up from 0.1 × lr over 40 steps */
    g_meta.warmup_start_factor = 0.1;
    g_meta.momentum = 0.85; /* SGD's, with weight decay and clipping: no default among them */
    g_meta.weight_decay = 1e-4;
    g_meta.clip_grad_norm = 2.5;
    g_meta.data_signature = 0xfedcba9876543210ull; /* the training set's: every bit of a u64 may be set */
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void fixture_teardown(void) { nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void write_bytes(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n + 1);
    ck_assert_uint_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* load `path` against `expect` in a child: returns the status, output in *out */
typedef struct {
    const char *path;
    CheckpointMeta expect;
} LoadJob;

static void load_child(void *arg) {
    LoadJob *j = arg;
    static float p[NP + 16], b[NB + 16], m[NP + 16];
    CheckpointMeta got;
    checkpoint_load(j->path, &j->expect, &got, p, b, m, NULL);
}

static void expect_load_refused(const char *path, const CheckpointMeta *expect, const char *want,
                                const char *what) {
    LoadJob j = {path, *expect};
    char *out = NULL;
    int st = test_run_captured(load_child, &j, &out);
    ck_assert_msg(st == 2, "%s: load exited %d (want 2): %s", what, st, out);
    ck_assert_msg(strstr(out, path), "%s: message does not name the file: %s", what, out);
    ck_assert_msg(strstr(out, want), "%s: message lacks \"%s\": %s", what, want, out);
    free(out);
}

/* ----------------------------------------------------------------------------------------------
 * tests */

START_TEST(test_fnv1a64_vectors) {
    ck_assert_uint_eq(fnv1a64(FNV1A64_INIT, "", 0), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(fnv1a64(FNV1A64_INIT, "a", 1), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(fnv1a64(FNV1A64_INIT, "foobar", 6), 0x85944171f73967e8ull);
    /* streaming equals one shot */
    ck_assert_uint_eq(fnv1a64(fnv1a64(FNV1A64_INIT, "foo", 3), "bar", 3), 0x85944171f73967e8ull);
}
END_TEST

START_TEST(test_round_trip) {
    const uint64_t saved = checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_path);
    ck_assert_msg(access(tmp, F_OK) != 0, "%s remains after a good save", tmp);
    size_t n;
    unsigned char *b = read_bytes(g_path, &n);
    ck_assert_uint_eq(n, FILE_BYTES);
    ck_assert(memcmp(b, "DPDDPCKP", 8) == 0);
    ck_assert(b[8] == 9 && b[9] == 0 && b[10] == 0 && b[11] == 0); /* version 9, little-endian */
    ck_assert(b[12] == (HEADER & 0xff) && b[13] == HEADER >> 8);    /* header size */
    ck_assert(b[128] == 16 && b[136] == (50000 & 0xff) && b[144] == 3); /* batch, train size, K */
    ck_assert(b[152] == 0 && b[160] == 1);                          /* shuffle, drop_last */
    ck_assert(b[168] == 2);                /* the data source: CIFAR-10 is 2 in every file ever written */
    double scale;
    memcpy(&scale, b + 192, 8);                                     /* the scaler, f64 LE at 192 */
    ck_assert(scale == 32768.0 && b[200] == 7 && b[224] == (2000 & 0xff));
    double lr;
    memcpy(&lr, b + 248, 8);                                        /* the schedule: 176, 184, 248 */
    ck_assert(b[176] == 2 /* cosine */ && b[184] == (1760 & 0xff) && b[185] == (1760 >> 8) && lr == 0.05);
    double hyper[3];
    memcpy(hyper, b + 272, 24); /* the optimizer's hyperparameters: f64 at 272, 280, 288 */
    ck_assert(hyper[0] == 0.85 && hyper[1] == 1e-4 && hyper[2] == 2.5);
    ck_assert(b[296] == 0x10 && b[303] == 0xfe); /* the training set's signature, u64 LE at 296 */
    ck_assert_str_eq((const char *)b + 16, "tiny");
    ck_assert(b[56] == (NP & 0xff) && b[57] == (NP >> 8));          /* n_params LE at 56 */
    ck_assert(b[72] == 0xef && b[79] == 0x01);                      /* shape_hash LE at 72 */
    ck_assert(memcmp(b + HEADER, g_params, 4 * NP) == 0);
    uint64_t h = fnv1a64(FNV1A64_INIT, b, n - 8), stored = 0;
    for (int i = 0; i < 8; i++) stored |= (uint64_t)b[n - 8 + i] << (8 * i);
    ck_assert_uint_eq(h, stored);
    uint64_t peeked = 0; /* what a save returns, and the file's last 8 bytes, name it (report.c) */
    ck_assert(checkpoint_file_checksum(g_path, &peeked) && peeked == stored && saved == stored);
    ck_assert(!checkpoint_file_checksum(tmp, &peeked)); /* no file */
    free(b);

    static float p[NP], bu[NB], m[NP];
    memset(p, 0x55, sizeof p);
    CheckpointMeta got, expect = g_meta;
    expect.step = expect.epoch = expect.batch_in_epoch = expect.seed = 0; /* counters are ignored */
    checkpoint_load(g_path, &expect, &got, p, bu, m, NULL);
    ck_assert_str_eq(got.arch, "tiny");
    ck_assert_str_eq(got.norm, "bn");
    ck_assert_int_eq(got.n_params, NP);
    ck_assert_int_eq(got.n_buffers, NB);
    ck_assert_uint_eq(got.shape_hash, g_meta.shape_hash);
    ck_assert_int_eq(got.step, g_meta.step);
    ck_assert_int_eq(got.epoch, 3);
    ck_assert_int_eq(got.batch_in_epoch, 17);
    ck_assert_int_eq(got.seed, 4294967295LL);
    ck_assert_int_eq(got.momentum_valid, 1);
    ck_assert_int_eq(got.world_size, 4);
    ck_assert_int_eq(got.batch_size, 16);
    ck_assert_int_eq(got.train_size, 50000);
    ck_assert_int_eq(got.accum_steps, 3);
    ck_assert_int_eq(got.shuffle, 0);
    ck_assert_int_eq(got.drop_last, 1);
    ck_assert_int_eq(got.data_source, CKPT_DATA_CIFAR10);
    ck_assert_int_eq(got.version, 9);
    ck_assert_uint_eq(got.data_signature, 0xfedcba9876543210ull);
    ck_assert(got.schedule == CKPT_SCHED_COSINE && got.schedule_steps == 1760 && got.lr == 0.05);
    ck_assert(got.warmup_steps == 40 && got.warmup_start_factor == 0.1);
    ck_assert(got.momentum == 0.85 && got.weight_decay == 1e-4 && got.clip_grad_norm == 2.5);
    ck_assert(got.scaler_scale == 32768.0 && got.scaler_growth_tracker == 7);
    ck_assert(got.scaler_growth_factor == 2.0 && got.scaler_backoff_factor == 0.5);
    ck_assert_int_eq(got.scaler_growth_interval, 2000);
    ck_assert(checkpoint_has_scaler(&got));
    /* a scale backed off all the way to 0 is a state a run reaches (torch's too): saved and loaded */
    CheckpointMeta zero = g_meta;
    zero.scaler_scale = 0.0;
    checkpoint_save(g_path, &zero, g_params, g_buffers, g_mom, NULL);
    checkpoint_load(g_path, &expect, &got, p, bu, m, NULL);
    ck_assert(got.scaler_scale == 0.0 && checkpoint_has_scaler(&got) && got.scaler_growth_interval == 2000);
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    ck_assert(memcmp(p, g_params, sizeof p) == 0);
    ck_assert(memcmp(bu, g_buffers, sizeof bu) == 0);
    ck_assert(memcmp(m, g_mom, sizeof m) == 0);

    /* saving again over an existing checkpoint replaces it */
    g_meta.step = 7;
    g_params[5] = 42.0f;
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    checkpoint_load(g_path, &expect, &got, p, bu, m, NULL);
    ck_assert_int_eq(got.step, 7);
    ck_assert(p[5] == 42.0f);

    /* a model without buffers (norm none) and a 31-character arch name fit too */
    CheckpointMeta nb = g_meta;
    nb.n_buffers = 0;
    strcpy(nb.norm, "none");
    memset(nb.arch, 'x', 31);
    nb.arch[31] = 0;
    checkpoint_save(g_path, &nb, g_params, NULL, g_mom, NULL);
    checkpoint_load(g_path, &nb, &got, p, NULL, m, NULL);
    ck_assert_str_eq(got.arch, nb.arch);
    ck_assert_str_eq(got.norm, "none");
    ck_assert(memcmp(m, g_mom, sizeof m) == 0);
}
END_TEST

static void put64(unsigned char *p, int64_t v);
static void write_resealed(const char *path, unsigned char *b, size_t n);
static int64_t f64_bits(double v);

/* Adam's checkpoint: exp_avg in momentum's place, exp_avg_sq after it, and its step count; it loads
 * only into an Adam run, and its step count is not negative (it may exceed the optimizer steps: a resume
 * regrouped to fewer steps an epoch re-counts those, not Adam's). */
START_TEST(test_adam_round_trip) {
    static float sq[NP], p[NP], bu[NB], m[NP], s2[NP];
    test_fill_uniform(sq, NP, 4, 0, 1e-4f);
    CheckpointMeta a = g_meta, got;
    a.optimizer = CKPT_OPT_ADAM;
    a.adam_steps = 1234567890000LL; /* ≤ step: skipped steps are not Adam's */
    a.momentum = 0;                 /* Adam has none (its weight decay and clipping are g_meta's) */
    checkpoint_save(g_path, &a, g_params, g_buffers, g_mom, sq);
    size_t n;
    unsigned char *b = read_bytes(g_path, &n);
    ck_assert_uint_eq(n, FILE_BYTES + 4 * NP);
    ck_assert(b[232] == 1 /* Adam */ && !memcmp(b + n - 8 - 4 * NP, sq, 4 * NP));
    checkpoint_load(g_path, &a, &got, p, bu, m, s2);
    ck_assert_int_eq(got.optimizer, CKPT_OPT_ADAM);
    ck_assert_int_eq(got.adam_steps, 1234567890000LL);
    ck_assert(got.momentum == 0 && got.weight_decay == 1e-4 && got.clip_grad_norm == 2.5);
    ck_assert(!memcmp(p, g_params, sizeof p) && !memcmp(m, g_mom, sizeof m) && !memcmp(s2, sq, sizeof s2));
    expect_load_refused(g_path, &g_meta, "trained with --optimizer adam, but this run uses --optimizer sgd",
                        "Adam into SGD");
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    expect_load_refused(g_path, &a, "trained with --optimizer sgd, but this run uses --optimizer adam", "SGD into Adam");
    char bad[160];
    snprintf(bad, sizeof bad, "%s/crafted.ckpt", g_dir);
    checkpoint_save(g_path, &a, g_params, g_buffers, g_mom, sq);
    free(b);
    b = read_bytes(g_path, &n);
    put64(b + 240, g_meta.step + 1); /* more Adam steps than optimizer steps: a regrouped resume's, loads */
    write_resealed(bad, b, n);
    checkpoint_load(bad, &a, &got, p, bu, m, s2);
    ck_assert_int_eq(got.adam_steps, g_meta.step + 1);
    put64(b + 240, -1);
    write_resealed(bad, b, n);
    expect_load_refused(bad, &a, "counters no save writes", "a negative Adam step count");
    put64(b + 240, 5), put64(b + 272, f64_bits(0.9)); /* a momentum in an Adam checkpoint */
    write_resealed(bad, b, n);
    expect_load_refused(bad, &a, "counters no save writes", "a momentum for Adam");
    free(b);
    /* An Adam file cut short at exactly SGD's length, resumed with SGD's flags (or evaluated), and an SGD
     * file grown to Adam's, resumed with Adam's: each could be that or a flipped optimizer field, and the
     * message names both (not "the header was damaged" alone, which reads as certain). */
    checkpoint_save(g_path, &a, g_params, g_buffers, g_mom, sq);
    b = read_bytes(g_path, &n);
    write_bytes(bad, b, FILE_BYTES);
    char says[96];
    snprintf(says, sizeof says, "--optimizer adam, %d bytes, but the file has %d", FILE_BYTES + 4 * NP, FILE_BYTES);
    expect_load_refused(bad, &g_meta, says, "Adam cut to SGD's length: what the header says");
    expect_load_refused(bad, &g_meta, "cut short at exactly that length, or its header was damaged",
                        "Adam cut to SGD's length: both stories");
    CheckpointMeta any = g_meta;
    any.optimizer = CKPT_OPT_ANY;
    expect_load_refused(bad, &any, "the length of an --optimizer sgd checkpoint — the save was cut short",
                        "Adam cut to SGD's length, --evaluate");
    free(b);
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    b = read_bytes(g_path, &n);
    unsigned char *grown = calloc(FILE_BYTES + 4 * NP, 1);
    memcpy(grown, b, n);
    write_bytes(bad, grown, FILE_BYTES + 4 * NP);
    expect_load_refused(bad, &a, "bytes were appended after it was written, or its header was damaged",
                        "SGD grown to Adam's length");
    free(grown);
    /* …but a header naming Adam and another buffer count does not describe this model: only the damaged
     * header explains a file of exactly this model's SGD length (not a cut-short Adam save of this model) */
    unsigned char *two = malloc(n);
    memcpy(two, b, n);
    two[232] = 1, two[64] ^= 1; /* the optimizer (Adam) and a bit of n_buffers */
    write_bytes(bad, two, n);
    snprintf(says, sizeof says, "the file has %d, the length of this model's checkpoint — the header was damaged",
             FILE_BYTES);
    expect_load_refused(bad, &g_meta, says, "Adam and another buffer count in an SGD file's header");
    LoadJob j = {bad, g_meta};
    char *out = NULL;
    test_run_captured(load_child, &j, &out);
    ck_assert_msg(!strstr(out, "describes this model"), "a header with another buffer count is said to describe this "
                  "model: %s", out);
    free(out), free(two);
    free(b);
}
END_TEST

START_TEST(test_truncated) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n;
    unsigned char *b = read_bytes(g_path, &n);
    char cut[160];
    snprintf(cut, sizeof cut, "%s/cut.ckpt", g_dir);
    /* empty, inside the magic, inside the header, at the header's end, inside each blob, inside
     * the checksum, one byte short */
    const size_t at[] = {0, 5, 8, 60, 127, 128, 129, 128 + 4 * NP + 3, 128 + 4 * (NP + NB) + 100, n - 8, n - 3, n - 1};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        write_bytes(cut, b, at[i]);
        char what[64];
        snprintf(what, sizeof what, "cut at %zu of %zu", at[i], n);
        expect_load_refused(cut, &g_meta, "truncated", what);
    }
    /* the message gives sizes and the fix */
    write_bytes(cut, b, 1000);
    LoadJob j = {cut, g_meta};
    char *out = NULL;
    ck_assert_int_eq(test_run_captured(load_child, &j, &out), 2);
    char want[64];
    snprintf(want, sizeof want, "1000 of %d bytes", FILE_BYTES);
    ck_assert_msg(strstr(out, want) && strstr(out, "earlier checkpoint"), "%s", out);
    free(out);
    /* bytes beyond the checksum are refused too */
    unsigned char *longer = calloc(n + 4, 1);
    memcpy(longer, b, n);
    write_bytes(cut, longer, n + 4);
    expect_load_refused(cut, &g_meta, "corrupt", "4 trailing bytes");
    expect_load_refused(cut, &g_meta, "use an earlier checkpoint", "4 trailing bytes: the fix"); /* as every corrupt one */
    free(longer);
    free(b);
}
END_TEST

/* A flipped bit in a size field (n_params at byte 56, n_buffers at 64) of the checkpoint bytes b makes
 * the file look cut short or overlong; written to bad, it must read as a damaged header instead. */
static void expect_size_flips_refused(const char *bad, unsigned char *b, size_t n, const char *what_prefix) {
    for (size_t at = 56; at <= 64; at += 8) {
        b[at] ^= 1;
        write_bytes(bad, b, n);
        b[at] ^= 1;
        char what[96];
        snprintf(what, sizeof what, "%sbit 0 of byte %zu (a size field) flipped", what_prefix, at);
        expect_load_refused(bad, &g_meta, "the header was damaged after it was written", what);
    }
}

START_TEST(test_flipped_byte) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n;
    unsigned char *b = read_bytes(g_path, &n);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.ckpt", g_dir);
    /* first param byte, a middle one, the buffers, the last momentum byte, a header counter
     * (step), the arch name, and the checksum itself */
    const size_t at[] = {128, 128 + 2001, 128 + 4 * NP + 7, n - 9, 80, 16, n - 8, n - 1};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            b[at[i]] ^= (unsigned char)(1u << bit);
            write_bytes(bad, b, n);
            b[at[i]] ^= (unsigned char)(1u << bit);
            char what[64];
            snprintf(what, sizeof what, "bit %d of byte %zu flipped", bit, at[i]);
            expect_load_refused(bad, &g_meta, "corrupt: checksum mismatch", what);
        }
    }
    expect_size_flips_refused(bad, b, n, "");
    free(b);
}
END_TEST

START_TEST(test_bad_magic_version_missing) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n;
    unsigned char *b = read_bytes(g_path, &n);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.ckpt", g_dir);
    b[0] = 'X';
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "not a checkpoint of this trainer", "bad magic");
    b[0] = 'D';
    write_bytes(bad, (const unsigned char *)"hello world, this is a text file\n", 33);
    expect_load_refused(bad, &g_meta, "not a checkpoint of this trainer", "text file");
    write_bytes(bad, (const unsigned char *)"PK", 2);
    expect_load_refused(bad, &g_meta, "not a checkpoint of this trainer", "2-byte non-checkpoint");
    b[8] = 11;
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "version 11", "future version");
    /* a flipped bit (9 → 11) reads the same: the message names both causes, and the fix for each */
    expect_load_refused(bad, &g_meta, "or, if this one wrote it, the file was damaged", "future version: damaged?");
    b[8] = 0;
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "version 0", "version 0");
    b[8] = 4; /* version 4 with version 9's header size */
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "header size 304, expected 192", "version 4, 304-byte header");
    b[8] = 6; /* version 6 with version 9's header size */
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "header size 304, expected 256", "version 6, 304-byte header");
    expect_load_refused(bad, &g_meta, "use an earlier checkpoint", "version 6, 304-byte header: the fix");
    b[8] = 7; /* version 7 with version 9's header size */
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "header size 304, expected 272", "version 7, 304-byte header");
    b[8] = 8; /* version 8 with version 9's header size */
    write_bytes(bad, b, n);
    expect_load_refused(bad, &g_meta, "header size 304, expected 296", "version 8, 304-byte header");
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.ckpt", g_dir);
    expect_load_refused(missing, &g_meta, "No such file", "missing file");
    expect_load_refused(g_dir, &g_meta, "not a regular file", "a directory");
    free(b);
}
END_TEST

/* --evaluate's expect of a model without --unused-param's head (run_resume sizes its arrays for the model
 * and the head): a file of another parameter count must not be read into them — a canary after the
 * array, checked as the load refuses the file, says whether it was. */
static struct {
    float p[NP - 20 + 10]; /* the model's NP − 20 and a head of 10 */
    float canary[64];
} g_head_room;
static void head_canary_hook(void) {
    for (int i = 0; i < 64; i++)
        if (g_head_room.canary[i] != 12345.0f) {
            fprintf(stderr, "canary overwritten: the file's parameters were read past the model's and head's\n");
            return;
        }
}
static void load_head_child(void *arg) {
    LoadJob *j = arg;
    static float b[NB + 16], m[NP + 16];
    for (int i = 0; i < 64; i++) g_head_room.canary[i] = 12345.0f;
    die_user_hook = head_canary_hook;
    CheckpointMeta got;
    checkpoint_load(j->path, &j->expect, &got, g_head_room.p, b, m, NULL);
}

START_TEST(test_wrong_model) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    CheckpointMeta e = g_meta;
    strcpy(e.arch, "resnet18");
    expect_load_refused(g_path, &e, "model tiny, but this run trains resnet18", "arch");
    e = g_meta;
    strcpy(e.norm, "none");
    expect_load_refused(g_path, &e, "--norm bn, but this run uses --norm none", "norm");
    e = g_meta;
    e.n_params = NP + 16; /* the child's arrays have room for it */
    expect_load_refused(g_path, &e, "1000 parameters", "n_params");
    e = g_meta;
    e.n_params = NP - 1;
    expect_load_refused(g_path, &e, "this tiny model has 999", "n_params smaller");
    /* off by exactly --unused-param's head: the flag is named, passed or dropped */
    e = g_meta;
    e.n_params = NP + 16, e.head_params = 16; /* the run has the head, the checkpoint not */
    expect_load_refused(g_path, &e, "extra head of --unused-param (stages 3–5) — drop it", "head in the run");
    e = g_meta;
    e.n_params = NP - 10, e.head_params = 10;
    expect_load_refused(g_path, &e, "extra head of --unused-param (stages 3–5) — pass it", "head in the file");
    e.head_params = 11;
    expect_load_refused(g_path, &e, "saved by a different model definition", "off by another count");
    /* evaluating (a head's hash to accept): a file 20 parameters larger than a model with a head of 10 is
     * refused without being read into arrays sized for the model and its head */
    e = g_meta;
    e.n_params = NP - 20, e.head_params = 10, e.head_hash = 0x1234, e.evaluating = 1;
    LoadJob j = {g_path, e};
    char *out = NULL;
    ck_assert_int_eq(test_run_captured(load_head_child, &j, &out), 2);
    ck_assert_msg(strstr(out, "has 1000 parameters, but this tiny model has 980") && !strstr(out, "canary"), "%s", out);
    free(out);
    e = g_meta;
    e.n_buffers = NB + 1;
    expect_load_refused(g_path, &e, "buffer", "n_buffers");
    e = g_meta;
    e.shape_hash ^= 1;
    expect_load_refused(g_path, &e, "shape fingerprint", "shape_hash");
}
END_TEST

/* ---- crafted headers (a valid checksum is no defence against edits) ---- */

static void put64(unsigned char *p, int64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)((uint64_t)v >> (8 * i));
}
/* Write b with its checksum recomputed, as an attacker (or a careless script) would. */
static void write_resealed(const char *path, unsigned char *b, size_t n) {
    put64(b + n - 8, (int64_t)fnv1a64(FNV1A64_INIT, b, n - 8));
    write_bytes(path, b, n);
}
static int64_t f64_bits(double v) {
    int64_t u;
    memcpy(&u, &v, 8);
    return u;
}

START_TEST(test_crafted_counters_refused) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n;
    unsigned char *b = read_bytes(g_path, &n), *orig = malloc(n);
    memcpy(orig, b, n);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/crafted.ckpt", g_dir);
    struct { int off; int64_t v; const char *what; } cases[] = {
        {80, -1, "negative step"},          {88, -5, "negative epoch"},
        {96, -1, "negative position"},      {88, INT64_MAX, "huge epoch"},
        {80, INT64_MIN, "INT64_MIN step"},  {96, (int64_t)1 << 62, "huge position"},
        {120, 0, "world size 0"},           {128, 0, "batch size 0"},
        {128, -16, "negative batch size"},  {144, 0, "accumulation 0"},
        {112, 7, "momentum flag 7"},        {136, -1, "negative training-set size"},
        {152, 2, "shuffle 2"},              {160, -1, "drop_last -1"},
        {168, 3, "data source 3"},          {168, -1, "data source -1"},
        /* the GradScaler's state: a scale torch's float32 could not hold, a counter past the interval
         * it resets at, factors the flags refuse, or half a state */
        {192, f64_bits(-32768.0), "negative scale"}, {192, f64_bits(NAN), "NaN scale"},
        {192, f64_bits(INFINITY), "inf scale"},      {192, f64_bits(0.1), "scale not a float32"},
        {192, f64_bits(1e39), "scale beyond float32"}, {200, 2000, "tracker = interval"},
        {200, -1, "negative tracker"},               {208, f64_bits(1.0), "growth factor 1"},
        {208, f64_bits(INFINITY), "growth factor inf"}, {120, ((int64_t)1 << 24) + 1, "world size beyond 2^24"},
        {216, f64_bits(1.0), "backoff factor 1"},    {216, 0, "backoff factor 0"},
        {224, 0, "interval 0"},                      {224, (int64_t)1 << 31, "interval beyond int32"},
        {232, 2, "optimizer 2"},                     {232, -1, "optimizer -1"},
        {240, 5, "Adam steps in an SGD checkpoint"},
        /* the schedule (version 6): a kind no save writes, a negative length, a learning rate no flag takes */
        {176, 3, "schedule 3"},                      {176, -1, "schedule -1"},
        {184, -1, "negative schedule length"},       {248, f64_bits(NAN), "NaN lr"},
        {248, f64_bits(-0.1), "negative lr"},
        /* the warm-up (version 7): a negative length, a factor LinearLR refuses, a factor without a warm-up */
        {256, -1, "negative warm-up"},               {264, 0, "warm-up factor 0"},
        {264, f64_bits(1.5), "warm-up factor above 1"}, {264, f64_bits(NAN), "NaN warm-up factor"},
        {256, 0, "a factor without a warm-up"},      {256, 1760, "a warm-up as long as the schedule"},
        /* the optimizer's hyperparameters (version 8): values the flags refuse */
        {272, f64_bits(-0.1), "negative momentum"},  {272, f64_bits(1.0), "momentum 1"},
        {272, f64_bits(NAN), "NaN momentum"},        {280, f64_bits(-1e-4), "negative weight decay"},
        {280, f64_bits(2.0), "weight decay above 1"}, {280, f64_bits(NAN), "NaN weight decay"},
        {288, f64_bits(-1.0), "negative max_norm"},  {288, f64_bits(INFINITY), "infinite max_norm"},
        {288, f64_bits(NAN), "NaN max_norm"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(b, orig, n);
        put64(b + cases[i].off, cases[i].v);
        write_resealed(bad, b, n);
        expect_load_refused(bad, &g_meta, "counters no save writes", cases[i].what);
    }
    /* header strings with control bytes are quoted escaped, never printed raw */
    memcpy(b, orig, n);
    memcpy(b + 16, "ti\x1b[2Jny\n", 10);
    write_resealed(bad, b, n);
    LoadJob j = {bad, g_meta};
    char *out;
    ck_assert_int_eq(test_run_captured(load_child, &j, &out), 2);
    ck_assert_msg(strstr(out, "model ti\\x1b[2Jny\\x0a,") && !strchr(out, 0x1b), "%s", out);
    free(out);
    free(b), free(orig);
}
END_TEST

/* b (n bytes, an older format) resealed as g_dir/name and loaded: its meta (its arrays must be the
 * saved ones). */
static CheckpointMeta load_resealed(const char *name, unsigned char *b, size_t n) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    write_resealed(path, b, n);
    static float p[NP], bu[NB], m[NP];
    CheckpointMeta got;
    checkpoint_load(path, &g_meta, &got, p, bu, m, NULL);
    ck_assert(memcmp(p, g_params, sizeof p) == 0 && memcmp(m, g_mom, sizeof m) == 0);
    return got;
}

/* A version 8 file (a 296-byte header: no signature of the training set) still loads, its signature
 * unknown (0), so that a resume says the data could not be checked rather than refusing it. */
START_TEST(test_version8_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n, n8;
    unsigned char *b = read_bytes(g_path, &n), *v8 = test_ckpt_as_version(8, HEADER_V8, b, n, &n8);
    ck_assert_uint_eq(n8, n - 8);
    CheckpointMeta got = load_resealed("v8.ckpt", v8, n8);
    ck_assert_int_eq(got.version, 8);
    ck_assert_uint_eq(got.data_signature, 0);
    ck_assert(got.momentum == 0.85 && got.weight_decay == 1e-4 && got.clip_grad_norm == 2.5);
    ck_assert(got.data_source == CKPT_DATA_CIFAR10 && got.train_size == 50000);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/v8_flipped.ckpt", g_dir);
    expect_size_flips_refused(bad, v8, n8, "version 8: ");
    free(b), free(v8);
}
END_TEST

/* A version 7 file (a 272-byte header: no optimizer hyperparameters) still loads, with them unknown (0),
 * so that a resume says nothing about them. */
START_TEST(test_version7_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n, n7;
    unsigned char *b = read_bytes(g_path, &n), *v7 = test_ckpt_as_version(7, HEADER_V7, b, n, &n7);
    CheckpointMeta got = load_resealed("v7.ckpt", v7, n7);
    ck_assert_int_eq(got.version, 7);
    ck_assert(got.warmup_steps == 40 && got.warmup_start_factor == 0.1);
    ck_assert(got.momentum == 0 && got.weight_decay == 0 && got.clip_grad_norm == 0);
    /* a flipped bit in a size field of an older, shorter header is a damaged header too: the file is as
     * long as this model's checkpoint in that version's layout (not in the current one's) */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/v7_flipped.ckpt", g_dir);
    expect_size_flips_refused(bad, v7, n7, "version 7: ");
    free(b), free(v7);
}
END_TEST

/* The files committed as the fuzzer's seeds (tests/fuzz/checkpoint/), written by the trainer versions of
 * their day — one of every header layout — still load, as the checkpoints users keep would; and only
 * versions 8 on record the optimizer's hyperparameters, only version 9 the training set's signature. */
START_TEST(test_committed_files_still_load) {
    static const struct { const char *name; uint32_t version; int adam; } files[] = {
        {"v1.ckpt", 1, 0}, {"v2.ckpt", 2, 0}, {"v3.ckpt", 3, 0}, {"v5.ckpt", 5, 0},
        {"v5_adam.ckpt", 5, 1}, {"v7_warmup.ckpt", 7, 0}, {"v8_clip.ckpt", 8, 0}, {"v9_data.ckpt", 9, 0},
    };
    static float p[NP], bu[NB], m[NP], sq[NP];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/tests/fuzz/checkpoint/%s", test_root(), files[i].name);
        CheckpointMeta expect = g_meta, got;
        expect.optimizer = files[i].adam ? CKPT_OPT_ADAM : CKPT_OPT_SGD;
        checkpoint_load(path, &expect, &got, p, bu, m, files[i].adam ? sq : NULL);
        ck_assert_msg(got.version == files[i].version, "%s: version %u", files[i].name, got.version);
        if (got.version < 8)
            ck_assert_msg(got.momentum == 0 && got.weight_decay == 0 && got.clip_grad_norm == 0, "%s", files[i].name);
        else
            ck_assert(got.momentum == 0.9 && got.weight_decay == 5e-4 && got.clip_grad_norm == 1.0);
        /* v9_data.ckpt is v8_clip.ckpt with a signature (0xfedcba9876543210) added */
        ck_assert_msg(got.data_signature == (got.version < 9 ? 0 : 0xfedcba9876543210ull), "%s: signature %016llx",
                      files[i].name, (unsigned long long)got.data_signature);
    }
}
END_TEST

/* version 6's layout (256-byte header, no warm-up) */
static unsigned char *as_version6(const unsigned char *b, size_t n, size_t *n6) {
    return test_ckpt_as_version(6, HEADER_V5, b, n, n6);
}

/* A version 6 file (a 256-byte header: no warm-up) still loads, with no warm-up. */
START_TEST(test_version6_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n, n6;
    unsigned char *b = read_bytes(g_path, &n), *v6 = as_version6(b, n, &n6);
    CheckpointMeta got = load_resealed("v6.ckpt", v6, n6);
    ck_assert_int_eq(got.version, 6);
    ck_assert(got.schedule == CKPT_SCHED_COSINE && got.lr == 0.05);
    ck_assert(got.warmup_steps == 0 && got.warmup_start_factor == 0);
    free(b), free(v6);
}
END_TEST

/* version 4's layout (192-byte header, no scaler state) */
static unsigned char *as_version4(const unsigned char *b, size_t n, size_t *n4) {
    return test_ckpt_as_version(4, HEADER_V2, b, n, n4);
}

/* A version 4 file (a 192-byte header: no GradScaler state) still loads, its scaler fields zero. */
START_TEST(test_version4_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n, n4;
    unsigned char *b = read_bytes(g_path, &n), *v4 = as_version4(b, n, &n4);
    CheckpointMeta got = load_resealed("v4.ckpt", v4, n4);
    ck_assert_int_eq(got.version, 4);
    ck_assert_int_eq(got.data_source, CKPT_DATA_CIFAR10);
    ck_assert(got.scaler_scale == 0 && got.scaler_growth_tracker == 0 && got.scaler_growth_interval == 0);
    free(b), free(v4);
}
END_TEST

/* A version 1 file (128-byte header, no batch size / data size / K) still loads. */
START_TEST(test_version1_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n, n1;
    unsigned char *b = read_bytes(g_path, &n), *v1 = test_ckpt_as_version(1, 128, b, n, &n1);
    CheckpointMeta got = load_resealed("v1.ckpt", v1, n1);
    ck_assert_int_eq(got.version, 1);
    ck_assert_int_eq(got.step, g_meta.step);
    ck_assert_int_eq(got.batch_size, 0); /* unknown */
    free(b), free(v1);
}
END_TEST

/* A version 2 file (the same header, zeros where version 3 records the sampler) still loads, its
 * sampler unknown — and those bytes are not read, so a version 2 file is never refused for them. */
START_TEST(test_version2_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n5, n;
    unsigned char *b5 = read_bytes(g_path, &n5), *b = as_version4(b5, n5, &n);
    free(b5);
    b[8] = 2;
    put64(b + 152, 0), put64(b + 160, 0);
    CheckpointMeta got = load_resealed("v2.ckpt", b, n);
    ck_assert_int_eq(got.version, 2);
    ck_assert_int_eq(got.batch_size, 16);
    ck_assert_int_eq(got.accum_steps, 3);
    ck_assert(got.shuffle == 0 && got.drop_last == 0);
    put64(b + 152, 7); /* reserved in version 2: not read */
    ck_assert_int_eq(load_resealed("v2.ckpt", b, n).shuffle, 0);
    free(b);
}
END_TEST

/* A version 3 file (zeros where version 4 records the data source) still loads, its data source
 * unknown (so a resume does not check it) — and those bytes are not read. */
START_TEST(test_version3_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n5, n;
    unsigned char *b5 = read_bytes(g_path, &n5), *b = as_version4(b5, n5, &n);
    free(b5);
    b[8] = 3;
    put64(b + 168, 0);
    CheckpointMeta got = load_resealed("v3.ckpt", b, n);
    ck_assert_int_eq(got.version, 3);
    ck_assert(got.shuffle == 0 && got.drop_last == 1);
    ck_assert_int_eq(got.data_source, CKPT_DATA_UNKNOWN);
    put64(b + 168, 7); /* reserved in version 3: not read */
    ck_assert_int_eq(load_resealed("v3.ckpt", b, n).data_source, CKPT_DATA_UNKNOWN);
    free(b);
}
END_TEST

/* A version 5 file (the same header, zeros where version 6 records the schedule) still loads, its
 * schedule unknown (so a resume says nothing about it) — and those bytes are not read. */
START_TEST(test_version5_still_loads) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    size_t n7, n;
    unsigned char *b7 = read_bytes(g_path, &n7), *b = as_version6(b7, n7, &n);
    free(b7);
    b[8] = 5;
    put64(b + 176, 7), put64(b + 184, -1), put64(b + 248, f64_bits(NAN)); /* reserved in version 5: not read */
    CheckpointMeta got = load_resealed("v5.ckpt", b, n);
    ck_assert_int_eq(got.version, 5);
    ck_assert(got.schedule == CKPT_SCHED_UNKNOWN && got.schedule_steps == 0 && got.lr == 0);
    ck_assert(got.scaler_scale == 32768.0 && got.scaler_growth_interval == 2000);
    free(b);
}
END_TEST

/* ---- what --report / --trace must not overwrite, and what a --save directory already holds ---- */

static void touch(const char *dir, const char *name, const char *text, time_t mtime) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_bytes(path, (const unsigned char *)text, strlen(text));
    struct timespec t[2] = {{mtime, 0}, {mtime, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, t, 0), 0);
}

START_TEST(test_is_one_and_list) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    ck_assert(checkpoint_is_one(g_path));
    char other[200], *newest = (char *)"x";
    snprintf(other, sizeof other, "%s/DPDDPCK", g_dir); /* a prefix of the magic is not one */
    write_bytes(other, (const unsigned char *)"DPDDPCK", 7);
    ck_assert(!checkpoint_is_one(other) && !checkpoint_is_one(g_dir));
    snprintf(other, sizeof other, "%s/missing", g_dir);
    ck_assert(!checkpoint_is_one(other));
    snprintf(other, sizeof other, "%s/fifo", g_dir);
    ck_assert_int_eq(mkfifo(other, 0600), 0);
    ck_assert(!checkpoint_is_one(other)); /* and it did not wait for a writer */
    /* only the names checkpoint_path writes, as regular files, count: a.ckpt, the FIFO and these do not */
    ck_assert_int_eq(checkpoint_list(g_dir, &newest), 0);
    ck_assert_ptr_null(newest);
    touch(g_dir, "epoch01.ckpt", "x", 100);
    touch(g_dir, "step0000001.ckpt", "x", 100);
    touch(g_dir, "epoch001.ckpt.tmp", "x", 100);
    touch(g_dir, "epoch001.ckptx", "x", 100);
    snprintf(other, sizeof other, "%s/epoch009.ckpt", g_dir);
    ck_assert_int_eq(mkdir(other, 0700), 0);
    ck_assert_int_eq(checkpoint_list(g_dir, NULL), 0);
    /* the newest is the last one written, whatever its name */
    touch(g_dir, "epoch002.ckpt", "x", 300);
    touch(g_dir, "step00000040.ckpt", "x", 200);
    touch(g_dir, "epoch1000.ckpt", "x", 100);
    char slash[100], want[200];
    snprintf(slash, sizeof slash, "%s//", g_dir);
    ck_assert_int_eq(checkpoint_list(slash, &newest), 3);
    snprintf(want, sizeof want, "%s/epoch002.ckpt", g_dir);
    ck_assert_str_eq(newest, want);
    free(newest);
    /* written within one timestamp: the later name (a later epoch or step) is the newer */
    touch(g_dir, "epoch004.ckpt", "x", 400);
    touch(g_dir, "epoch003.ckpt", "x", 400);
    ck_assert_int_eq(checkpoint_list(g_dir, &newest), 5);
    snprintf(want, sizeof want, "%s/epoch004.ckpt", g_dir);
    ck_assert_str_eq(newest, want);
    free(newest);
    snprintf(other, sizeof other, "%s/no/such", g_dir);
    ck_assert_int_eq(checkpoint_list(other, &newest), 0);
    ck_assert_ptr_null(newest);
}
END_TEST

/* ---- --save checked before training ---- */

static void probe_child(void *dir) { checkpoint_probe(dir, 0, 3, 7, NULL, 0, 0); }
/* a run resumed from the end of epoch 1 (step 12), training to the end of epoch 3 (step 36) */
static void resumed_probe_child(void *dir) { checkpoint_probe(dir, 1, 3, 0, "elsewhere/epoch001.ckpt", 12, 36); }

START_TEST(test_save_probe) {
    char sub[200], file[240], *out;
    snprintf(sub, sizeof sub, "%s/new/dir", g_dir);
    checkpoint_probe(sub, 0, 3, 7, NULL, 0, 0); /* created, written, and left empty */
    DIR *d = opendir(sub);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d))) ck_assert_msg(e->d_name[0] == '.', "probe left %s", e->d_name);
    closedir(d);
    snprintf(file, sizeof file, "%s/plain", g_dir);
    write_bytes(file, (const unsigned char *)"x", 1);
    ck_assert_int_eq(test_run_captured(probe_child, file, &out), 2); /* a file, not a directory */
    ck_assert_msg(strstr(out, "not a directory"), "%s", out);
    free(out);
    snprintf(sub, sizeof sub, "%s/plain/under", g_dir); /* under a regular file */
    ck_assert_int_eq(test_run_captured(probe_child, sub, &out), 2);
    ck_assert_msg(strstr(out, "--save") && strstr(out, "(mkdir('") && strstr(out, "Not a directory") &&
                  strstr(out, "part of that path is a file"), "%s", out);
    free(out);
    /* a directory where an epoch's checkpoint will go: refused now, not at the rename after training */
    char blocker[240];
    snprintf(sub, sizeof sub, "%s/new/dir", g_dir);
    snprintf(blocker, sizeof blocker, "%s/epoch002.ckpt", sub);
    ck_assert_int_eq(mkdir(blocker, 0755), 0);
    ck_assert_int_eq(test_run_captured(probe_child, sub, &out), 2);
    ck_assert_msg(strstr(out, "epoch002.ckpt' exists and is not a regular file") && strstr(out, "epoch 2"), "%s", out);
    free(out);
    rmdir(blocker);
    if (access("/proc/self/status", F_OK) == 0) { /* a read-only place, even for root */
        ck_assert_int_eq(test_run_captured(probe_child, "/proc/self", &out), 2);
        ck_assert_msg(strstr(out, "cannot write a checkpoint there (open(") && strstr(out, "writable directory"),
                      "%s", out);
        free(out);
        /* a missing parent is created (mkdir -p) where it can be; where it cannot, the mkdir is named */
        ck_assert_int_eq(test_run_captured(probe_child, "/proc/self/no/such", &out), 2);
        ck_assert_msg(strstr(out, "(mkdir('/proc/self/no'):") && strstr(out, "takes no new directories"),
                      "%s", out);
        free(out);
    }
    snprintf(sub, sizeof sub, "%s/ro", g_dir); /* a read-only directory: only without root's override */
    ck_assert_int_eq(mkdir(sub, 0500), 0);
    if (access(sub, W_OK) != 0) {
        ck_assert_int_eq(test_run_captured(probe_child, sub, &out), 2);
        ck_assert_msg(strstr(out, "(open(") && strstr(out, "Permission denied"), "%s", out);
        free(out);
    }
    /* a save's .tmp name, and the name where --steps stops inside an epoch, count too: a directory
     * there fails the open, a FIFO would hang it; a regular file there (an earlier run's) is fine, and
     * so is anything under a name this run does not write */
    snprintf(sub, sizeof sub, "%s/names", g_dir);
    checkpoint_probe(sub, 0, 3, 7, NULL, 0, 0);
    snprintf(file, sizeof file, "%s/epoch001.ckpt", sub);
    write_bytes(file, (const unsigned char *)"x", 1);
    snprintf(file, sizeof file, "%s/epoch004.ckpt", sub); /* after --epochs 3 */
    ck_assert_int_eq(mkdir(file, 0700), 0);
    snprintf(file, sizeof file, "%s/step00000006.ckpt", sub); /* not where --steps 7 stops */
    ck_assert_int_eq(mkdir(file, 0700), 0);
    checkpoint_probe(sub, 0, 3, 7, NULL, 0, 0);
    snprintf(file, sizeof file, "%s/epoch003.ckpt.tmp", sub);
    ck_assert_int_eq(mkdir(file, 0700), 0);
    ck_assert_int_eq(test_run_captured(probe_child, sub, &out), 2);
    ck_assert_msg(strstr(out, file) && strstr(out, "not a regular file; the checkpoint of epoch 3"), "%s", out);
    free(out);
    ck_assert_int_eq(rmdir(file), 0);
    snprintf(file, sizeof file, "%s/step00000007.ckpt", sub);
    ck_assert_int_eq(mkfifo(file, 0600), 0);
    ck_assert_int_eq(test_run_captured(probe_child, sub, &out), 2);
    ck_assert_msg(strstr(out, file) && strstr(out, "the checkpoint of --steps 7"), "%s", out);
    free(out);
    /* a resumed run: a later checkpoint of its line under a name it writes is refused (it would be
     * written over), but a regular .tmp file there — a save interrupted before its rename — is not one */
    snprintf(sub, sizeof sub, "%s/resumed", g_dir);
    checkpoint_probe(sub, 0, 0, 0, NULL, 0, 0); /* creates it */
    snprintf(file, sizeof file, "%s/epoch003.ckpt.tmp", sub);
    write_bytes(file, (const unsigned char *)"x", 1);
    ck_assert_msg(test_run_captured(resumed_probe_child, sub, &out) == 0, "a resumed run refused an interrupted "
                  "save's .tmp as a later checkpoint: %s", out);
    free(out);
    snprintf(file, sizeof file, "%s/epoch003.ckpt", sub);
    write_bytes(file, (const unsigned char *)"x", 1);
    ck_assert_int_eq(test_run_captured(resumed_probe_child, sub, &out), 2);
    ck_assert_msg(strstr(out, file) && strstr(out, "a later checkpoint than --resume"), "%s", out);
    free(out);
}
END_TEST

/* ---- failing saves ---- */

typedef struct {
    const char *path;
    int limit_fsize; /* bytes; 0 = none */
} SaveJob;

static void save_child(void *arg) {
    SaveJob *j = arg;
    if (j->limit_fsize) { /* "disk full" after limit bytes: write() fails with EFBIG */
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {(rlim_t)j->limit_fsize, (rlim_t)j->limit_fsize};
        ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    }
    static float p[NP];
    for (int i = 0; i < NP; i++) p[i] = 99.0f; /* different contents from the saved checkpoint */
    checkpoint_save(j->path, &g_meta, p, g_buffers, g_mom, NULL);
}

static void expect_save_fails_keeping_old(SaveJob *j, const char *what) {
    char *out = NULL;
    int st = test_run_captured(save_child, j, &out);
    ck_assert_msg(st == 1, "%s: save exited %d (want 1, die_at): %s", what, st, out);
    ck_assert_msg(strstr(out, j->path), "%s: message does not name the path: %s", what, out);
    free(out);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", j->path);
    ck_assert_msg(access(tmp, F_OK) != 0, "%s: %s left behind", what, tmp);
    /* the previous checkpoint is intact and loads */
    static float p[NP], bu[NB], m[NP];
    CheckpointMeta got;
    checkpoint_load(g_path, &g_meta, &got, p, bu, m, NULL);
    ck_assert_msg(memcmp(p, g_params, sizeof p) == 0, "%s: previous checkpoint damaged", what);
}

START_TEST(test_failed_save_keeps_previous) {
    checkpoint_save(g_path, &g_meta, g_params, g_buffers, g_mom, NULL);
    SaveJob j = {g_path, 4096}; /* the file is ~8 KiB: the write fails half way */
    expect_save_fails_keeping_old(&j, "RLIMIT_FSIZE");
    /* the .tmp name leads to /dev/full: every write fails with ENOSPC */
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_path);
    ck_assert_int_eq(symlink("/dev/full", tmp), 0);
    SaveJob full = {g_path, 0};
    expect_save_fails_keeping_old(&full, "/dev/full");
    /* a directory that does not exist */
    char nodir[160];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/b.ckpt", g_dir);
    SaveJob nd = {nodir, 0};
    char *out = NULL;
    int st = test_run_captured(save_child, &nd, &out);
    ck_assert_msg(st == 1 && strstr(out, nodir), "missing dir: exit %d: %s", st, out);
    free(out);
}
END_TEST

static void path_child(void *arg) { free(checkpoint_path((const char *)arg, 1, 1, 1)); }

/* --save DIR that cannot be made, or takes no file: refused with the other flag checks in every stage,
 * before the run header. Stages 3–5 found it in rank 0 after the launch (the other workers were then
 * stopped); node 0's launcher, where rank 0 saves, now makes it and checks it first. /proc refuses new
 * files and directories even to root. */
START_TEST(test_save_dir_without_room_refused_before_launch) {
    if (access("/proc/self/status", F_OK) != 0) return; /* no /proc: nothing here to test it with */
    static const char *const dirs[] = {"/proc/ck", "/proc"};
    for (int stage = 1; stage <= 5; stage++)
        for (int i = 0; i < 2; i++) {
            char cmd[1024], *out;
            snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage%d --device cpu --model tiny --train-size 256 "
                     "--test-size 32 --batch-size 16 --steps 1 --progress off --save %s%s", test_root(), stage,
                     dirs[i], stage >= 3 ? " --nproc-per-node 2 --standalone" : "");
            int rc = test_run(cmd, &out);
            char said[64];
            snprintf(said, sizeof said, "--save '%s': cannot", dirs[i]);
            ck_assert_msg(rc == 2 && strstr(out, said) && strstr(out, "give --save a") && !strstr(out, "launching") &&
                          !strstr(out, "parameters,") && !strstr(out, "rank 0"), "stage %d, --save %s: exit %d:\n%s",
                          stage, dirs[i], rc, out);
            free(out);
        }
}
END_TEST

/* --resume FILE that is no checkpoint (another file, an empty one): refused with the other flag checks,
 * before the run header and the model — and in stages 3–5 before the launch, once; it was found only by
 * checkpoint_load, after both (stages 3–5: by rank 0, after the rendezvous). */
START_TEST(test_resume_not_a_checkpoint_refused_before_the_header) {
    char path[200], *out;
    snprintf(path, sizeof path, "%s/notes.txt", g_dir);
    for (int empty = 0; empty < 2; empty++) {
        write_bytes(path, (const unsigned char *)"notes\n", empty ? 0 : 6);
        for (int stage = 1; stage <= 5; stage++) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage%d --device cpu --model tiny --train-size 256 "
                     "--test-size 32 --batch-size 16 --epochs 2 --progress off --resume %s%s", test_root(), stage,
                     path, stage >= 3 ? " --nproc-per-node 2 --standalone" : "");
            int rc = test_run(cmd, &out);
            const char *said = empty ? "is empty, not a checkpoint" : "is not a checkpoint of this trainer";
            ck_assert_msg(rc == 2 && strstr(out, said) && !strstr(strstr(out, said) + 1, said) &&
                          !strstr(out, "parameters,") && !strstr(out, "launching"), "stage %d: exit %d:\n%s", stage,
                          rc, out);
            free(out);
        }
    }
}
END_TEST

START_TEST(test_checkpoint_path) {
    char dir[160];
    snprintf(dir, sizeof dir, "%s/run/ckpts", g_dir); /* two levels to create */
    char *p = checkpoint_path(dir, 3, 1234, 1);
    char want[200];
    snprintf(want, sizeof want, "%s/epoch003.ckpt", dir);
    ck_assert_str_eq(p, want);
    free(p);
    struct stat st;
    ck_assert(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
    p = checkpoint_path(dir, 3, 1234, 0);
    snprintf(want, sizeof want, "%s/step00001234.ckpt", dir);
    ck_assert_str_eq(p, want);
    free(p);
    char slash[170];
    snprintf(slash, sizeof slash, "%s//", dir); /* existing, with trailing slashes */
    p = checkpoint_path(slash, 12, 0, 1);
    snprintf(want, sizeof want, "%s/epoch012.ckpt", dir);
    ck_assert_str_eq(p, want);
    free(p);
    /* a file where the directory should be */
    char file[170];
    snprintf(file, sizeof file, "%s/afile", g_dir);
    write_bytes(file, (const unsigned char *)"x", 1);
    char *out = NULL;
    int rc = test_run_captured(path_child, file, &out);
    ck_assert_msg(rc == 2 && strstr(out, file) && strstr(out, "not a directory"), "exit %d: %s", rc, out);
    free(out);
    char under[190];
    snprintf(under, sizeof under, "%s/afile/sub", g_dir);
    rc = test_run_captured(path_child, under, &out);
    ck_assert_msg(rc == 2 && strstr(out, under), "exit %d: %s", rc, out);
    free(out);
}
END_TEST

Suite *suite_checkpoint(void) {
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 30);
    tcase_add_checked_fixture(tc, fixture_setup, fixture_teardown);
    tcase_add_test(tc, test_fnv1a64_vectors);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_adam_round_trip);
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_flipped_byte);
    tcase_add_test(tc, test_bad_magic_version_missing);
    tcase_add_test(tc, test_crafted_counters_refused);
    tcase_add_test(tc, test_version1_still_loads);
    tcase_add_test(tc, test_version2_still_loads);
    tcase_add_test(tc, test_version3_still_loads);
    tcase_add_test(tc, test_version4_still_loads);
    tcase_add_test(tc, test_version5_still_loads);
    tcase_add_test(tc, test_version6_still_loads);
    tcase_add_test(tc, test_version7_still_loads);
    tcase_add_test(tc, test_version8_still_loads);
    tcase_add_test(tc, test_committed_files_still_load);
    tcase_add_test(tc, test_is_one_and_list);
    tcase_add_test(tc, test_save_probe);
    tcase_add_test(tc, test_save_dir_without_room_refused_before_launch);
    tcase_add_test(tc, test_resume_not_a_checkpoint_refused_before_the_header);
    tcase_add_test(tc, test_wrong_model);
    tcase_add_test(tc, test_failed_save_keeps_previous);
    tcase_add_test(tc, test_checkpoint_path);
    suite_add_tcase(s, tc);
    return s;
}
