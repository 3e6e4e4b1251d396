/* data.c — datasets in host memory: the embedded synthetic CIFAR-like set and the CIFAR-10 reader.
 *
 * Synthetic set. Real CIFAR-10 cannot be assumed present (no network on many machines, and CI
 * must run anyway), so the trainer ships a stand-in that has the same shape and, more importantly,
 * *behaves* like an image classification problem: a CNN's loss goes down, test accuracy climbs
 * well above chance over a few epochs but not to 100% after one, and random crops and flips help.
 *
 *   object(class)     = a few smooth random patterns (low-frequency sinusoids and Gaussian blobs,
 *                       each with its own colour) under a Gaussian window: a blob-like "thing";
 *                       plus a weak class colour cast.
 *   background[16]    = the same kind of patterns without the window: clutter shared by all classes.
 *   sample(split, i)  = mid-grey + object(label) at a random strength, shifted by up to ±4 px and
 *                       mirrored with p = 0.5 + a weaker object of another class (weight < 0.5,
 *                       shifted on its own) + two random background patterns + random contrast,
 *                       brightness and tint + pixel noise; clamped to 0..255.
 * Every layer is drawn on a 40×40 canvas so a ±4 px shift never runs off its edge. The clutter is
 * stronger than the object and the noise is heavy, so a linear look at the pixels does poorly
 * (nearest class mean: ~50%) and a CNN has something to learn.
 *
 * Prototypes depend only on the seed (train and test share them: same distribution). Every
 * sample's random choices come from its own stream keyed by hash3(seed, split, index), so a
 * sample does not depend on how many were generated before it (generation could be parallel),
 * and the test split (a different `split` key) never repeats a training sample.
 *
 * CIFAR-10 binary format: each record is 1 label byte followed by 3072 pixel bytes (1024 red,
 * 1024 green, 1024 blue, each row-major 32×32) — already the CHW layout we keep in memory. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h" /* fsync_dir_of: the export renames as a save does */
#include "errors.h"
#include "rng.h"

/* torchvision's usual CIFAR-10 statistics (per channel, on the 0..1 scale). */
const float DATA_MEAN[3] = {0.4914f, 0.4822f, 0.4465f};
const float DATA_STD[3] = {0.2470f, 0.2435f, 0.2616f};

// ----------------------------------------------------------------------------------------------
// synthetic set

/* The knobs below were tuned (with PyTorch, SGD lr 0.05, batch 128, crop + flip, seeds 0 and 1) so
 * that learning is visible but not instant: a CIFAR ResNet-18 reaches ~70% train / ~83% test
 * accuracy after epoch 1, ~87% after 2 and ~90% after 5, still climbing; the CPU "tiny" CNN on
 * 8192 images ~50% after one epoch and ~61% after two. Stronger objects or weaker clutter make
 * it trivially easy (>97% after one epoch); weaker ones make the first epochs look stuck. */
#define SHIFT 4                      /* max translation of each layer, in pixels */
#define CANVAS (IMG_H + 2 * SHIFT)   /* patterns are drawn on 40×40 so every shift is defined */
#define CANVAS_PIXELS (IMG_C * CANVAS * CANVAS)
#define N_BACKGROUND 16              /* clutter patterns shared by all classes */
#define OBJ_RMS 35.0                 /* class object contrast (pixel levels, RMS) */
#define BG_RMS 45.0                  /* clutter contrast: stronger than the object, like real photos */
#define COLOUR 8.0                   /* class colour cast (std, pixel levels): a weak hint only */
#define MIX_MAX 0.5f                 /* the distractor object never outweighs the labelled one */
#define NOISE_MIN 45.0f              /* pixel noise amplitude, uniform in [NOISE_MIN, 2·NOISE_MIN] */
#define WINDOW 9.0                   /* σ (pixels) of the Gaussian window that makes a pattern an object */

enum { SPLIT_PROTOTYPE = 0, SPLIT_TRAIN = 1, SPLIT_TEST = 2 }; /* keys of the hash streams */

/* A tiny per-sample stream: splitmix64 over a counter. Cheap to start (one hash), unlike
 * seeding a Mt19937 (624 words) for each of 50000 samples. */
typedef struct { uint64_t state; } SampleRng;

static uint64_t srng_next(SampleRng *r) { return splitmix64(r->state++); }
static float srng_uniform(SampleRng *r) { return (float)(srng_next(r) >> 40) / 16777216.0f; } /* [0,1) */
static int srng_int(SampleRng *r, int n) { return (int)(srng_next(r) % (uint64_t)n); }

/* A smooth random colour pattern on the canvas, zero-mean-ish, scaled to RMS `rms`: a sum of a few
 * low-frequency sinusoids and Gaussian blobs, each with its own colour (amplitude per channel).
 * window > 0 multiplies it by a Gaussian window around the centre: an "object" rather than a texture. */
static void draw_pattern(Mt19937 *g, int n_parts, double window, double rms, float *out /* CANVAS_PIXELS */) {
    for (int i = 0; i < CANVAS_PIXELS; i++) out[i] = 0.0f;
    for (int k = 0; k < n_parts; k++) {
        double amp[IMG_C];
        for (int ch = 0; ch < IMG_C; ch++) amp[ch] = mt_normal(g);
        int blob = mt_uniform(g) < 0.5;
        /* sinusoid: ≤ 2.5 cycles across the image; blob: σ of 2..6 pixels, centre near the middle */
        double fx = (mt_uniform(g) * 5.0 - 2.5) * 2.0 * M_PI / IMG_W;
        double fy = (mt_uniform(g) * 5.0 - 2.5) * 2.0 * M_PI / IMG_H;
        double phase = mt_uniform(g) * 2.0 * M_PI;
        double cx = CANVAS / 2.0 + (mt_uniform(g) - 0.5) * 16.0, cy = CANVAS / 2.0 + (mt_uniform(g) - 0.5) * 16.0;
        double sigma = 2.0 + 4.0 * mt_uniform(g);
        for (int y = 0; y < CANVAS; y++)
            for (int x = 0; x < CANVAS; x++) {
                double v = blob ? 2.0 * exp(-((x - cx) * (x - cx) + (y - cy) * (y - cy)) / (2.0 * sigma * sigma))
                                : cos(fx * x + fy * y + phase);
                for (int ch = 0; ch < IMG_C; ch++) out[(ch * CANVAS + y) * CANVAS + x] += (float)(amp[ch] * v);
            }
    }
    if (window > 0.0)
        for (int y = 0; y < CANVAS; y++)
            for (int x = 0; x < CANVAS; x++) {
                double dx = x - (CANVAS - 1) / 2.0, dy = y - (CANVAS - 1) / 2.0;
                float w = (float)exp(-(dx * dx + dy * dy) / (2.0 * window * window));
                for (int ch = 0; ch < IMG_C; ch++) out[(ch * CANVAS + y) * CANVAS + x] *= w;
            }
    /* The same RMS for every pattern: otherwise a class whose random amplitudes came out small would
     * be a faint, noise-dominated class, much harder than the others. */
    double ss = 0.0;
    for (int i = 0; i < CANVAS_PIXELS; i++) ss += (double)out[i] * out[i];
    float scale = (float)(rms / sqrt(ss / CANVAS_PIXELS + 1e-12));
    for (int i = 0; i < CANVAS_PIXELS; i++) out[i] *= scale;
}

typedef struct {
    float object[NUM_CLASSES][CANVAS_PIXELS];    /* what a class looks like */
    float colour[NUM_CLASSES][IMG_C];            /* a weak class colour cast */
    float background[N_BACKGROUND][CANVAS_PIXELS]; /* clutter, shared by all classes */
} Prototypes;

/* Everything shared by train and test (the "world"): depends on the seed only. */
static void synthetic_prototypes(uint64_t seed, Prototypes *P) {
    Mt19937 g;
    mt_seed(&g, hash3(seed, SPLIT_PROTOTYPE, 0));
    for (int c = 0; c < NUM_CLASSES; c++) {
        draw_pattern(&g, 4, WINDOW, OBJ_RMS, P->object[c]);
        for (int ch = 0; ch < IMG_C; ch++) P->colour[c][ch] = (float)(COLOUR * mt_normal(&g));
    }
    for (int k = 0; k < N_BACKGROUND; k++) draw_pattern(&g, 3, 0.0, BG_RMS, P->background[k]);
}

/* One sample, from its own stream. Writes 3072 bytes and returns the label. */
static uint8_t synthetic_sample(const Prototypes *P, uint64_t seed, int split, int64_t index, uint8_t *img) {
    SampleRng r = {hash3(seed, (uint64_t)split, (uint64_t)index)};
    int label = srng_int(&r, NUM_CLASSES);
    int other = (label + 1 + srng_int(&r, NUM_CLASSES - 1)) % NUM_CLASSES; /* any class but label */
    int bg1 = srng_int(&r, N_BACKGROUND), bg2 = srng_int(&r, N_BACKGROUND);
    /* canvas offsets 0..2·SHIFT: where the 32×32 window sits over each layer */
    int ox = srng_int(&r, 2 * SHIFT + 1), oy = srng_int(&r, 2 * SHIFT + 1);
    int ox2 = srng_int(&r, 2 * SHIFT + 1), oy2 = srng_int(&r, 2 * SHIFT + 1);
    int bx = srng_int(&r, 2 * SHIFT + 1), by = srng_int(&r, 2 * SHIFT + 1);
    int flip = srng_int(&r, 2);
    float strength = 0.5f + 0.5f * srng_uniform(&r);       /* how visible the object is */
    float mix = MIX_MAX * srng_uniform(&r);                /* weight of the distractor object */
    float w1 = 2.0f * srng_uniform(&r) - 1.0f, w2 = 2.0f * srng_uniform(&r) - 1.0f; /* clutter */
    float contrast = 0.6f + 0.8f * srng_uniform(&r);       /* 0.6 .. 1.4 around mid-grey */
    float bright = 60.0f * (srng_uniform(&r) - 0.5f);      /* ±30 */
    float noise_amp = NOISE_MIN + NOISE_MIN * srng_uniform(&r); /* some images are much noisier */
    uint64_t bits = 0;
    int nbits = 0;
    for (int ch = 0; ch < IMG_C; ch++) {
        float base = 128.0f + bright + 30.0f * (srng_uniform(&r) - 0.5f) /* tint */ + contrast * P->colour[label][ch];
        const float *po = P->object[label] + ch * CANVAS * CANVAS, *pd = P->object[other] + ch * CANVAS * CANVAS;
        const float *pb1 = P->background[bg1] + ch * CANVAS * CANVAS, *pb2 = P->background[bg2] + ch * CANVAS * CANVAS;
        for (int y = 0; y < IMG_H; y++)
            for (int x = 0; x < IMG_W; x++) {
                int xs = flip ? IMG_W - 1 - x : x; /* mirror the object: flips are part of the distribution */
                float v = strength * (1.0f - mix) * po[(y + oy) * CANVAS + xs + ox] +
                          strength * mix * pd[(y + oy2) * CANVAS + xs + ox2] +
                          w1 * pb1[(y + by) * CANVAS + x + bx] + w2 * pb2[(y + by) * CANVAS + x + bx];
                /* noise: triangular on [−1, 1] from two 8-bit uniforms; 4 pixels per 64-bit draw */
                if (nbits == 0) { bits = srng_next(&r); nbits = 4; }
                float tri = ((float)(bits & 0xff) + (float)((bits >> 8) & 0xff) - 255.0f) / 255.0f;
                bits >>= 16;
                nbits--;
                v = base + contrast * v + noise_amp * tri;
                v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
                img[(ch * IMG_H + y) * IMG_W + x] = (uint8_t)(v + 0.5f);
            }
    }
    return (uint8_t)label;
}

void dataset_synthetic(Dataset *ds, int64_t n, uint64_t seed, int train) {
    ASSERT(n >= 1);
    memset(ds, 0, sizeof *ds);
    ds->n = n;
    ds->images = xmalloc((size_t)n * IMG_PIXELS);
    ds->labels = xmalloc((size_t)n);
    Prototypes *proto = xmalloc(sizeof(Prototypes));
    synthetic_prototypes(seed, proto);
    int split = train ? SPLIT_TRAIN : SPLIT_TEST;
    for (int64_t i = 0; i < n; i++)
        ds->labels[i] = synthetic_sample(proto, seed, split, i, ds->images + (size_t)i * IMG_PIXELS);
    free(proto);
    snprintf(ds->source, sizeof ds->source, "synthetic(seed=%llu)", (unsigned long long)seed);
}

// ----------------------------------------------------------------------------------------------
// CIFAR-10 binary reader

#define CIFAR_RECORD (1 + IMG_PIXELS)   /* 3073 bytes */
#define CIFAR_PER_FILE 10000            /* records in each official file */

const char *const cifar10_file_names[CIFAR10_FILES] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                                      "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
static const char *const *const CIFAR_TRAIN_FILES = cifar10_file_names;
static const char *const *const CIFAR_TEST_FILES = cifar10_file_names + 5;

/* docs/get_cifar10.sh as the user can run it from where they are: that path from the repository root
 * (where the tutorial runs the stages), else the one next to this binary — ./stage1 started from another
 * directory (`../stage1`, a script's own folder) would be told of a path that is not there. */
static const char *get_cifar10_script(void) {
    static char path[4200];
    if (access("docs/get_cifar10.sh", F_OK) == 0) return "docs/get_cifar10.sh";
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = 0;
        snprintf(path, sizeof path, "%s/docs/get_cifar10.sh", exe);
        if (access(path, F_OK) == 0) return path;
    }
    return "docs/get_cifar10.sh";
}

/* The folder of a file's path ("." for a bare name), into buf. */
static const char *folder_of(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    snprintf(buf, len, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    return buf;
}

/* The fix for a file of the set that is there but bad: remove it, then the script for the file's folder.
 * Both halves matter. Without the folder the script fills ./data/cifar-10-batches-bin, not the one the
 * run reads; and it leaves alone a folder whose six files have the official size, so a copy, a link or
 * a corrupt label byte among them would still be there after a bare re-run ("already in DIR"). */
static const char *refetch(const char *path, char *buf, size_t len) {
    char dir[4096];
    snprintf(buf, len, "remove '%s' and download the set again with %s %s", path, get_cifar10_script(),
             folder_of(path, dir, sizeof dir));
    return buf;
}

/* Open one file, its record count into *records; every problem is the user's to fix, so die_user. */
static FILE *cifar_open(const char *path, int64_t *records) {
    /* O_NONBLOCK: opening a FIFO put there must not wait forever for a writer; the type is checked
     * before the first read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    char fix[4400], dir[4096];
    if (fd < 0) {
        const int err = errno;
        folder_of(path, dir, sizeof dir);
        if (err == ENOENT)
            die_user("CIFAR-10 file '%s' not found — download the set there with %s %s, or drop --data to use the "
                     "synthetic set", path, get_cifar10_script(), dir);
        if (err == EACCES) { /* whose permission it is: a folder that may not be entered denies every file */
            if (access(dir, X_OK) != 0)
                die_user("--data folder '%s' may not be entered (no search permission, so none of its files can be "
                         "read) — chmod a+x '%s', or run as a user who may read it", dir, dir);
            die_user("CIFAR-10 file '%s' is not readable (permission denied) — chmod a+r '%s', or run as a user "
                     "who may read it", path, path);
        }
        die_user("cannot open CIFAR-10 file '%s': %s — %s", path, strerror(err), refetch(path, fix, sizeof fix));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) die_user("cannot stat CIFAR-10 file '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        die_user("CIFAR-10 file '%s' is not a regular file (%s) — %s", path,
                 S_ISDIR(st.st_mode) ? "a directory" : "a device, FIFO or socket", refetch(path, fix, sizeof fix));
    int64_t size = (int64_t)st.st_size;
    if (size == 0)
        die_user("CIFAR-10 file '%s' is empty (0 bytes; the official files have %d): an interrupted download? "
                 "%s", path, CIFAR_RECORD * CIFAR_PER_FILE, refetch(path, fix, sizeof fix));
    if (size % CIFAR_RECORD != 0)
        die_user("CIFAR-10 file '%s' has %lld bytes, which is not a whole number of %d-byte records "
                 "(1 label + 3072 pixels; the official files have %d bytes): truncated download, or not "
                 "the binary version? %s",
                 path, (long long)size, CIFAR_RECORD, CIFAR_RECORD * CIFAR_PER_FILE, refetch(path, fix, sizeof fix));
    *records = size / CIFAR_RECORD;
    FILE *f = fdopen(fd, "rb");
    if (!f) die_at(__FILE__, __LINE__, "fdopen", errno_string(), path);
    return f;
}

/* The directory --data names, as the user will look for it: missing (with the command that fills it),
 * not a directory, or the folder above the unpacked archive's. */
static void cifar_dir_check(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            die_user("--data '%s': no such directory — download CIFAR-10 into it with %s %s "
                     "(or give the directory that holds data_batch_1.bin … test_batch.bin), or drop --data to "
                     "use the synthetic set", dir, get_cifar10_script(), dir);
        if (errno == EACCES) /* the folder may be right: a folder above it is what denies it */
            die_user("--data '%s' cannot be reached: a folder on its path may not be entered (no search "
                     "permission) — chmod a+x the folders above it, or run as a user who may read it", dir);
        die_user("--data '%s': %s (give the directory that holds data_batch_1.bin … test_batch.bin)", dir,
                 strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        die_user("--data '%s' is not a directory (give the directory that holds data_batch_1.bin … "
                 "test_batch.bin)", dir);
    char first[4096], below[4096];
    snprintf(first, sizeof first, "%s/%s", dir, cifar10_file_names[0]);
    snprintf(below, sizeof below, "%s/cifar-10-batches-bin/%s", dir, cifar10_file_names[0]);
    if (access(first, F_OK) == 0) return;
    if (stat(below, &st) == 0 && S_ISREG(st.st_mode))
        die_user("--data '%s' holds the unpacked archive's folder, not its files: give --data "
                 "%s/cifar-10-batches-bin", dir, dir);
    /* The two other downloads on the same page, which a "file not found" would leave a puzzle. */
    static const char *const python[] = {"data_batch_1", "cifar-10-batches-py/data_batch_1"};
    static const char *const c100[] = {"train.bin", "cifar-100-binary/train.bin"};
    for (int i = 0; i < 2; i++) {
        snprintf(below, sizeof below, "%s/%s", dir, python[i]);
        if (access(below, F_OK) == 0)
            die_user("--data '%s' holds CIFAR-10's python version (pickled %s): the stages read the binary "
                     "version — download it with %s DIR and give --data DIR", dir, python[i], get_cifar10_script());
        snprintf(below, sizeof below, "%s/%s", dir, c100[i]);
        if (access(below, F_OK) == 0)
            die_user("--data '%s' holds CIFAR-100 (%s): the stages train on CIFAR-10's 10 classes — download "
                     "it with %s DIR and give --data DIR", dir, c100[i], get_cifar10_script());
    }
    /* The archive downloaded by hand (or a workshop's copy) but not unpacked: the script unpacks it,
     * checked against the official MD5, with no network. */
    snprintf(below, sizeof below, "%s/cifar-10-binary.tar.gz", dir);
    if (access(below, F_OK) == 0)
        die_user("--data '%s' holds the archive cifar-10-binary.tar.gz, not yet unpacked — unpack it there with "
                 "%s --archive %s %s", dir, get_cifar10_script(), below, dir);
}

/* The set's files, opened: every one exists and has a sane size, so a broken download is reported
 * before any time goes into reading (whatever the limit), and the counts are those of the files
 * that are then read — one replaced in between (a download or copy still writing) is read whole as
 * it was when opened, never as fewer or other samples than the count. Returns their records. */
typedef struct CifarFiles {
    int n;
    FILE *f[5];
    int64_t recs[5];
    char path[5][4096];
} CifarFiles;

static int64_t cifar_open_all(const char *dir, int train, int64_t limit, CifarFiles *cf) {
    cifar_dir_check(dir);
    const char *const *names = train ? CIFAR_TRAIN_FILES : CIFAR_TEST_FILES;
    int64_t total = 0;
    cf->n = train ? 5 : 1;
    for (int k = 0; k < cf->n; k++) {
        snprintf(cf->path[k], sizeof cf->path[k], "%s/%s", dir, names[k]);
        cf->f[k] = cifar_open(cf->path[k], &cf->recs[k]);
        total += cf->recs[k];
    }
    if (limit > total) {
        for (int k = 0; k < cf->n; k++) fclose(cf->f[k]);
        die_user("asked for %lld %s samples but '%s' holds only %lld (%s%s): lower --%s-size", (long long)limit,
                 train ? "training" : "test", dir, (long long)total, names[0], train ? " .. data_batch_5.bin" : "",
                 train ? "train" : "test");
    }
    return total;
}

static _Noreturn void cifar_bad_label(const char *path, int64_t record, int label) {
    char fix[4400];
    die_user("CIFAR-10 file '%s', record %lld: label %d is outside 0..9 — corrupt file, or the CIFAR-100 format? "
             "%s", path, (long long)record, label, refetch(path, fix, sizeof fix));
}

/* Two of the set's files that are one file (a link) or a copy (the same first record: the official
 * files, and any two files of one set, start with different images; one of a single value throughout
 * is no image but a placeholder, as tests write) — a download "fixed" by hand.
 * Every size check passes, and the run would train on those samples twice, or test on training
 * samples and report their accuracy as the test's. Files missing or not regular are left to
 * cifar_open, which names them when its split needs them. */
static void cifar_copies(const char *dir) {
    struct {
        dev_t dev;
        ino_t ino;
        int ok, image; /* image: its first record's pixels are not all one value */
        uint8_t first[CIFAR_RECORD];
    } f[CIFAR10_FILES];
    char path[CIFAR10_FILES][4096];
    for (int k = 0; k < CIFAR10_FILES; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s", dir, cifar10_file_names[k]);
        int fd = open(path[k], O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        struct stat st;
        f[k].ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  pread(fd, f[k].first, CIFAR_RECORD, 0) == CIFAR_RECORD;
        if (f[k].ok) f[k].dev = st.st_dev, f[k].ino = st.st_ino;
        f[k].image = f[k].ok && memcmp(f[k].first + 1, f[k].first + 2, IMG_PIXELS - 1) != 0;
        if (fd >= 0) close(fd);
        for (int j = 0; j < k && f[k].ok; j++) {
            const int link = f[j].ok && f[j].dev == f[k].dev && f[j].ino == f[k].ino;
            char fix[4400];
            if (link || (f[j].ok && f[k].image && !memcmp(f[j].first, f[k].first, CIFAR_RECORD)))
                die_user("CIFAR-10 files '%s' and '%s' are %s: %s — %s", path[j], path[k],
                         link ? "one file (a link)" : "copies (they start with the same image)",
                         k == CIFAR10_FILES - 1 ? "the test accuracy would be measured on training samples"
                                                : "the run would train on the same samples twice",
                         refetch(path[k], fix, sizeof fix));
        }
    }
}

int64_t cifar10_check(const char *dir, int train, int64_t limit) {
    if (!train) cifar_copies(dir); /* once: config_resolve checks the test split with or without training */
    CifarFiles cf;
    int64_t total = cifar_open_all(dir, train, limit, &cf), n = limit > 0 ? limit : total, i = 0, bad_r = 0;
    /* and the labels the run will read, a byte a record: a corrupt file is refused once, here, not by
     * each of stages 3–5's workers alike (a read that fails is left to the reader, which says so) */
    int bad_k = -1, label = 0;
    for (int k = 0; k < cf.n && bad_k < 0; k++)
        for (int64_t r = 0; r < cf.recs[k] && i < n && bad_k < 0; r++, i++) {
            uint8_t b;
            if (pread(fileno(cf.f[k]), &b, 1, (off_t)(r * CIFAR_RECORD)) == 1 && b >= NUM_CLASSES)
                bad_k = k, bad_r = r, label = b;
        }
    for (int k = 0; k < cf.n; k++) fclose(cf.f[k]);
    if (bad_k >= 0) cifar_bad_label(cf.path[bad_k], bad_r, label);
    return total;
}

void dataset_cifar10(Dataset *ds, const char *dir, int train, int64_t limit) {
    memset(ds, 0, sizeof *ds);
    CifarFiles cf;
    int64_t total = cifar_open_all(dir, train, limit, &cf);
    int64_t n = limit > 0 ? limit : total;
    ds->n = n;
    ds->images = xmalloc((size_t)n * IMG_PIXELS);
    ds->labels = xmalloc((size_t)n);
    uint8_t record[CIFAR_RECORD];
    int64_t i = 0;
    for (int k = 0; k < cf.n; k++) {
        FILE *f = cf.f[k];
        const char *path = cf.path[k];
        for (int64_t r = 0; r < cf.recs[k] && i < n; r++, i++) {
            if (fread(record, 1, CIFAR_RECORD, f) != CIFAR_RECORD)
                die_user("reading CIFAR-10 file '%s' failed at record %lld: %s", path, (long long)r,
                         ferror(f) ? strerror(errno) : "unexpected end of file (did it change while reading?)");
            if (record[0] >= NUM_CLASSES) {
                for (int j = k; j < cf.n; j++) fclose(cf.f[j]); /* for the fuzzer, which goes on after it */
                cifar_bad_label(path, r, record[0]);
            }
            ds->labels[i] = record[0];
            memcpy(ds->images + (size_t)i * IMG_PIXELS, record + 1, IMG_PIXELS);
        }
        fclose(f);
    }
    ASSERT(i == n);
    snprintf(ds->source, sizeof ds->source, "cifar10:%s", train ? "train" : "test");
}

static _Noreturn void cifar_exists(const char *path) {
    die_user("'%s' already exists: give a new or empty directory (nothing there is overwritten)", path);
}

/* The inverse of dataset_cifar10: the set in the official binary layout, so that another trainer
 * (tests/torch/train_parity.py) can read exactly the bytes --data gives ours. A file of one of the six
 * names already there (real CIFAR-10, an earlier export) is never overwritten. Each file is written as
 * NAME.tmp and fsynced, and only once all six are whole are they renamed to their names (then the
 * directory fsynced), as a checkpoint's save does: an export killed part-way leaves no file under a
 * CIFAR-10 name — a cut test_batch.bin of whole records would read as a smaller test set — only .tmp
 * files, which the rerun replaces (saying so). A failed write removes every file this export wrote:
 * left behind, they would make the rerun refuse the folder. */
typedef struct Written {
    char path[CIFAR10_FILES][4096]; /* the .tmp files written, or (renamed) their final names */
    int n;
} Written;

static void cifar_unwrite(const Written *w) {
    for (int k = 0; k < w->n; k++) unlink(w->path[k]);
}

/* Test-only: WRITE_SYNTHETIC_KILL_AFTER=N makes the export kill itself (SIGKILL, as `kill -9` or the
 * out-of-memory killer would) once N bytes of it are written and flushed — a kill part-way, for the
 * test that the rerun then works. */
static long long cifar_kill_after(void) {
    const char *v = getenv("WRITE_SYNTHETIC_KILL_AFTER");
    if (!v || !v[0]) return 0;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || *end || n < 1)
        die_user("WRITE_SYNTHETIC_KILL_AFTER='%s' (test-only): expected a byte count above 0 — unset it to export", v);
    return n;
}

static void cifar_write_file(const char *dir, const char *name, const Dataset *ds, int64_t from, int64_t to,
                             Written *w, long long kill_after, long long *written) {
    char *tmp = w->path[w->n], path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof w->path[0], "%s/%s.tmp", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;
        cifar_unwrite(w);
        die_user("cannot create '%s': %s (check that the directory exists and is writable%s)", tmp, strerror(err),
                 err == EEXIST ? ", and remove what is at that name" : "");
    }
    w->n++;
    FILE *f = fdopen(fd, "wb");
    if (!f) die_at(__FILE__, __LINE__, "fdopen", errno_string(), tmp);
    uint8_t record[CIFAR_RECORD];
    int ok = 1;
    for (int64_t i = from; i < to && ok; i++) {
        record[0] = ds->labels[i];
        memcpy(record + 1, ds->images + (size_t)i * IMG_PIXELS, IMG_PIXELS);
        ok = fwrite(record, 1, CIFAR_RECORD, f) == CIFAR_RECORD;
        if (ok && kill_after && (*written += CIFAR_RECORD) >= kill_after) {
            fflush(f);
            raise(SIGKILL);
        }
    }
    int err = ok ? 0 : errno;
    if (ok && (fflush(f) != 0 || fsync(fd) != 0)) ok = 0, err = errno; /* before the rename, as a save does */
    if (fclose(f) != 0 && ok) ok = 0, err = errno;
    if (!ok) {
        cifar_unwrite(w);
        die_runtime("writing '%s' failed: %s (%s) — the %d file(s) written there are removed", path, strerror(err),
                    err == EFBIG ? "this shell's file-size limit, ulimit -f: raise it" : "a full disk?", w->n);
    }
}

void dataset_write_cifar10(const Dataset *train, const Dataset *test, const char *dir) {
    if (train->n < 5)
        die_user("a training set of %lld samples cannot fill CIFAR-10's 5 files: give at least 5", (long long)train->n);
    char path[4096];
    struct stat st;
    for (int k = 0; k < CIFAR10_FILES; k++) { /* before the first file: ours must not end up beside a user's */
        snprintf(path, sizeof path, "%s/%s", dir, cifar10_file_names[k]);
        if (lstat(path, &st) == 0) cifar_exists(path);
    }
    int left = 0; /* an interrupted export's .tmp files: replaced (anything but a file there: open says what) */
    for (int k = 0; k < CIFAR10_FILES; k++) {
        snprintf(path, sizeof path, "%s/%s.tmp", dir, cifar10_file_names[k]);
        left += lstat(path, &st) == 0 && S_ISREG(st.st_mode) && unlink(path) == 0;
    }
    if (left)
        printf("note: removed %d partial file%s (NAME.bin.tmp) in '%s', left by an export that was interrupted\n",
               left, left == 1 ? "" : "s", dir);
    Written w = {.n = 0};
    long long kill_after = cifar_kill_after(), written = 0;
    for (int k = 0; k < 5; k++) /* as even as it goes: the official 50000 are 5 × 10000 */
        cifar_write_file(dir, CIFAR_TRAIN_FILES[k], train, train->n * k / 5, train->n * (k + 1) / 5, &w,
                         kill_after, &written);
    cifar_write_file(dir, CIFAR_TEST_FILES[0], test, 0, test->n, &w, kill_after, &written);
    /* All six whole: now their names. RENAME_NOREPLACE keeps "never overwritten" against a file made
     * there since the check above; a file system without it gets a plain rename (the check stands). */
    for (int k = 0; k < CIFAR10_FILES; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, cifar10_file_names[k]);
        int rc = renameat2(AT_FDCWD, w.path[k], AT_FDCWD, path, RENAME_NOREPLACE);
        if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) rc = rename(w.path[k], path);
        if (rc != 0) {
            int err = errno;
            cifar_unwrite(&w);
            if (err == EEXIST) cifar_exists(path);
            die_runtime("renaming '%s' to '%s' failed: %s — the %d file(s) written there are removed", w.path[k],
                        path, strerror(err), w.n);
        }
        snprintf(w.path[k], sizeof w.path[0], "%s", path); /* a later failure removes it under its name */
    }
    fsync_dir_of(path); /* the renames themselves durable (path: the last of the six) */
}

void dataset_free(Dataset *ds) {
    free(ds->images);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}
