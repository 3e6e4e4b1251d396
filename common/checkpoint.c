/* checkpoint.c — atomic, verified checkpoints (see checkpoint.h).
 *
 * Layout, little-endian, every field written explicitly (byte by byte through put_u32/put_u64, not a
 * raw struct dump, so compiler padding or a reordered CheckpointMeta can never change the format):
 *
 *   offset size  field
 *        0    8  magic "DPDDPCKP"
 *        8    4  u32 format version (9; version 1 ended the header at 128, versions 2–4 at 192, 5–6 at 256,
 *                7 at 272, 8 at 296)
 *       12    4  u32 header size in bytes (304; 128 in version 1, 192 in versions 2–4, 256 in 5–6, 272 in 7,
 *                296 in 8)
 *       16   32  arch, NUL-padded ("resnet18" | "tiny")
 *       48    8  norm, NUL-padded ("bn" | "none")
 *       56    8  i64 n_params        64  8  i64 n_buffers      72  8  u64 shape_hash
 *       80    8  i64 step            88  8  i64 epoch          96  8  i64 batch_in_epoch
 *      104    8  i64 seed           112  8  i64 momentum_valid 120  8  i64 world_size
 *      128    8  i64 batch_size    136  8  i64 train_size    144  8  i64 accum_steps
 *      152    8  i64 shuffle       160  8  i64 drop_last (version 3; zero in version 2)
 *      168    8  i64 data_source (version 4: 1 synthetic, 2 CIFAR-10; zero before)
 *      176    8  i64 schedule (version 6: 1 const, 2 cosine; zero before)
 *      184    8  i64 the schedule's length in optimizer steps (version 6: --epochs × steps per epoch)
 *      192    8  f64 GradScaler scale (version 5)
 *      200    8  i64 growth tracker  208  8  f64 growth factor  216  8  f64 backoff factor
 *      224    8  i64 growth interval (≥ 1; all five 0: saved without a GradScaler)
 *      232    8  i64 optimizer (version 5: 0 SGD, 1 Adam; SGD before)
 *      240    8  i64 Adam's step count (the steps it took: its bias corrections' t; 0 for SGD)
 *      248    8  f64 the base learning rate, --lr (version 6)
 *      256    8  i64 warm-up steps, --warmup-steps (version 7: 0 = none)
 *      264    8  f64 the warm-up's start factor, --warmup-start-factor (version 7; 0 without a warm-up)
 *      272    8  f64 SGD's momentum, --momentum (version 8; 0 for Adam)
 *      280    8  f64 the weight decay, --weight-decay (version 8)
 *      288    8  f64 clip_grad_norm_'s max_norm, --clip-grad-norm (version 8; 0 = no clipping)
 *      296    8  u64 the training set's signature (version 9: FNV-1a-64 of its source, size, labels and images)
 *      304       f32 params[n_params], f32 buffers[n_buffers], f32 momentum[n_params] (Adam: exp_avg),
 *                and for Adam f32 exp_avg_sq[n_params]
 *      end    8  u64 FNV-1a-64 of every byte before it
 *
 * The float blobs are written straight from host memory: we only build for little-endian hosts
 * (x86-64, aarch64), checked at compile time, rather than byte-swapping ~90 MB per save. */

#include "checkpoint.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c writes float blobs in host order and assumes a little-endian host"
#endif

#define CKPT_MAGIC "DPDDPCKP"
#define CKPT_VERSION 9u
#define CKPT_HEADER 304    /* version 9 */
#define CKPT_HEADER_V8 296 /* version 8 */
#define CKPT_HEADER_V7 272 /* version 7 */
#define CKPT_HEADER_V5 256 /* versions 5 and 6 */
#define CKPT_HEADER_V2 192 /* versions 2 to 4 */
#define CKPT_HEADER_V1 128
#define CKPT_HUGE ((int64_t)1 << 53) /* no count or position in a real checkpoint comes near it */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_f64(unsigned char *p, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_u64(p, u);
}
static double get_f64(const unsigned char *p) {
    uint64_t u = get_u64(p);
    double v;
    memcpy(&v, &u, 8);
    return v;
}
static uint32_t header_size(uint32_t version) {
    return version == 1 ? CKPT_HEADER_V1 : version <= 4 ? CKPT_HEADER_V2 : version <= 6 ? CKPT_HEADER_V5
           : version == 7 ? CKPT_HEADER_V7 : version == 8 ? CKPT_HEADER_V8 : CKPT_HEADER;
}

static void header_encode(unsigned char h[CKPT_HEADER], const CheckpointMeta *m) {
    memset(h, 0, CKPT_HEADER);
    memcpy(h, CKPT_MAGIC, 8);
    put_u32(h + 8, CKPT_VERSION);
    put_u32(h + 12, CKPT_HEADER);
    ASSERT(strnlen(m->arch, sizeof m->arch) < 32 && strnlen(m->norm, sizeof m->norm) < 8);
    memcpy(h + 16, m->arch, strnlen(m->arch, sizeof m->arch));
    memcpy(h + 48, m->norm, strnlen(m->norm, sizeof m->norm));
    const int64_t f[] = {m->n_params, m->n_buffers, (int64_t)m->shape_hash, m->step, m->epoch,
                         m->batch_in_epoch, m->seed, m->momentum_valid, m->world_size};
    for (int i = 0; i < 9; i++) put_u64(h + 56 + 8 * i, (uint64_t)f[i]);
    put_u64(h + 128, (uint64_t)m->batch_size);
    put_u64(h + 136, (uint64_t)m->train_size);
    put_u64(h + 144, (uint64_t)m->accum_steps);
    put_u64(h + 152, (uint64_t)m->shuffle);
    put_u64(h + 160, (uint64_t)m->drop_last);
    put_u64(h + 168, (uint64_t)m->data_source);
    put_u64(h + 176, (uint64_t)m->schedule);
    put_u64(h + 184, (uint64_t)m->schedule_steps);
    put_f64(h + 248, m->lr);
    put_f64(h + 192, m->scaler_scale);
    put_u64(h + 200, (uint64_t)m->scaler_growth_tracker);
    put_f64(h + 208, m->scaler_growth_factor);
    put_f64(h + 216, m->scaler_backoff_factor);
    put_u64(h + 224, (uint64_t)m->scaler_growth_interval);
    put_u64(h + 232, (uint64_t)m->optimizer);
    put_u64(h + 240, (uint64_t)m->adam_steps);
    put_u64(h + 256, (uint64_t)m->warmup_steps);
    put_f64(h + 264, m->warmup_start_factor);
    put_f64(h + 272, m->momentum);
    put_f64(h + 280, m->weight_decay);
    put_f64(h + 288, m->clip_grad_norm);
    put_u64(h + 296, m->data_signature);
}

static void header_decode(const unsigned char h[CKPT_HEADER], CheckpointMeta *m) {
    memset(m, 0, sizeof *m);
    memcpy(m->arch, h + 16, 31); /* the last byte of each string field stays NUL */
    memcpy(m->norm, h + 48, 7);
    int64_t *f[] = {&m->n_params, &m->n_buffers, NULL, &m->step, &m->epoch, &m->batch_in_epoch,
                    &m->seed, &m->momentum_valid, &m->world_size};
    for (int i = 0; i < 9; i++)
        if (f[i]) *f[i] = (int64_t)get_u64(h + 56 + 8 * i);
    m->shape_hash = get_u64(h + 72);
    m->version = get_u32(h + 8);
    if (m->version >= 2) {
        m->batch_size = (int64_t)get_u64(h + 128);
        m->train_size = (int64_t)get_u64(h + 136);
        m->accum_steps = (int64_t)get_u64(h + 144);
    }
    if (m->version >= 3) {
        m->shuffle = (int64_t)get_u64(h + 152);
        m->drop_last = (int64_t)get_u64(h + 160);
    }
    if (m->version >= 4) m->data_source = (int64_t)get_u64(h + 168);
    if (m->version >= 5) {
        m->scaler_scale = get_f64(h + 192);
        m->scaler_growth_tracker = (int64_t)get_u64(h + 200);
        m->scaler_growth_factor = get_f64(h + 208);
        m->scaler_backoff_factor = get_f64(h + 216);
        m->scaler_growth_interval = (int64_t)get_u64(h + 224);
        m->optimizer = (int64_t)get_u64(h + 232);
        m->adam_steps = (int64_t)get_u64(h + 240);
    }
    if (m->version >= 6) {
        m->schedule = (int64_t)get_u64(h + 176);
        m->schedule_steps = (int64_t)get_u64(h + 184);
        m->lr = get_f64(h + 248);
    }
    if (m->version >= 7) {
        m->warmup_steps = (int64_t)get_u64(h + 256);
        m->warmup_start_factor = get_f64(h + 264);
    }
    if (m->version >= 8) {
        m->momentum = get_f64(h + 272);
        m->weight_decay = get_f64(h + 280);
        m->clip_grad_norm = get_f64(h + 288);
    }
    if (m->version >= 9) m->data_signature = get_u64(h + 296); /* any value: a hash */
}

const char *checkpoint_escape(const char *s, size_t len, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len && s[i] && o + 5 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') out[o++] = (char)ch;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
    }
    out[o] = 0;
    return out;
}

/* A GradScaler state torch's scaler could hold: none at all (every field 0), or a float32 scale —
 * 0 included: backed off step after step, a scale underflows to 0 (torch's too) — a growth counter
 * below its interval (update() resets it on reaching it), growth > 1 > backoff > 0. */
int checkpoint_has_scaler(const CheckpointMeta *m) { return m->scaler_growth_interval != 0; }

static int scaler_possible(const CheckpointMeta *m) {
    if (!checkpoint_has_scaler(m))
        return m->scaler_scale == 0.0 && m->scaler_growth_tracker == 0 && m->scaler_growth_factor == 0.0 &&
               m->scaler_backoff_factor == 0.0;
    return isfinite(m->scaler_scale) && m->scaler_scale >= 0 && m->scaler_scale <= FLT_MAX &&
           (double)(float)m->scaler_scale == m->scaler_scale && m->scaler_growth_interval >= 1 &&
           m->scaler_growth_interval <= INT32_MAX && m->scaler_growth_tracker >= 0 &&
           m->scaler_growth_tracker < m->scaler_growth_interval && isfinite(m->scaler_growth_factor) &&
           m->scaler_growth_factor > 1.0 && m->scaler_backoff_factor > 0.0 && m->scaler_backoff_factor < 1.0;
}

/* Counters no save writes: negative, or beyond anything a run reaches. */
static int counters_possible(const CheckpointMeta *m) {
    const int64_t pos[] = {m->step, m->epoch, m->batch_in_epoch, m->train_size};
    for (int i = 0; i < 4; i++)
        if (pos[i] < 0 || pos[i] > CKPT_HUGE) return 0;
    if (m->momentum_valid != 0 && m->momentum_valid != 1) return 0;
    if (m->world_size < 1 || m->world_size > (1 << 24)) return 0;
    if (m->version >= 2 && (m->batch_size < 1 || m->batch_size > INT32_MAX || m->accum_steps < 1 ||
                            m->accum_steps > INT32_MAX))
        return 0;
    if (m->version >= 3 && ((m->shuffle != 0 && m->shuffle != 1) || (m->drop_last != 0 && m->drop_last != 1)))
        return 0;
    if (m->version >= 4 && (m->data_source < CKPT_DATA_UNKNOWN || m->data_source > CKPT_DATA_CIFAR10)) return 0;
    if (m->version >= 5 && !scaler_possible(m)) return 0;
    if (m->version >= 5 && (m->optimizer == CKPT_OPT_SGD ? m->adam_steps != 0
                            : m->optimizer != CKPT_OPT_ADAM || m->adam_steps < 0 || m->adam_steps > CKPT_HUGE))
        return 0; /* not "≤ step": a regrouped resume re-counts the steps (fewer an epoch) but keeps Adam's */
    if (m->version >= 6 && (m->schedule < CKPT_SCHED_UNKNOWN || m->schedule > CKPT_SCHED_COSINE ||
                            m->schedule_steps < 0 || m->schedule_steps > CKPT_HUGE || !isfinite(m->lr) || m->lr < 0))
        return 0;
    if (m->version >= 7 && (m->warmup_steps < 0 || m->warmup_steps > CKPT_HUGE ||
                            (m->warmup_steps > 0 && m->warmup_steps >= m->schedule_steps) || /* a run refuses it */
                            (m->warmup_steps == 0 ? m->warmup_start_factor != 0.0
                                                  : !(m->warmup_start_factor > 0.0 && m->warmup_start_factor <= 1.0))))
        return 0; /* a warm-up's factor is in (0, 1], and there is none without a warm-up */
    if (m->version >= 8 && !(m->momentum >= 0 && m->momentum < 1 && m->weight_decay >= 0 && m->weight_decay <= 1 &&
                             m->clip_grad_norm >= 0 && m->clip_grad_norm <= 1e30 &&
                             (m->optimizer == CKPT_OPT_SGD || m->momentum == 0)))
        return 0; /* the flags' ranges (NaN fails every comparison); Adam has no momentum */
    return 1;
}

/* Total file size for a model of this size and optimizer (Adam: one more parameter-sized blob); −1
 * if the counts are nonsense (negative / overflow). */
static int64_t ckpt_size(int64_t n_params, int64_t n_buffers, int64_t optimizer) {
    if (n_params < 0 || n_buffers < 0 || n_params > ((int64_t)1 << 40) || n_buffers > ((int64_t)1 << 40)) return -1;
    return CKPT_HEADER + 4 * ((optimizer == CKPT_OPT_ADAM ? 3 : 2) * n_params + n_buffers) + 8;
}

/* ----------------------------------------------------------------------------------------------
 * save */

/* Write all of buf, updating the running checksum; 0 on success, −1 with errno set on failure. */
static int write_all(int fd, const void *buf, size_t len, uint64_t *hash) {
    if (hash) *hash = fnv1a64(*hash, buf, len);
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* A failed save removes its temporary file and stops; the checkpoint under the real name (if any)
 * was never touched, so training can be resumed from it. */
#define save_fail(tmp, fd, what, path, err) save_fail_at(__LINE__, tmp, fd, what, path, err) /* names the call's line */
_Noreturn static void save_fail_at(int line, const char *tmp, int fd, const char *what, const char *path, int err) {
    if (fd >= 0) close(fd);
    unlink(tmp);
    char call[1100];
    snprintf(call, sizeof call, "%s('%s')", what, path);
    die_at(__FILE__, line, call, strerror(err),
           err == EFBIG ? "the checkpoint is larger than this shell's file-size limit (ulimit -f): raise it; any "
                          "earlier checkpoint there is intact and can be given to --resume"
                        : "check free space and permissions of the --save directory (df -h); any earlier "
                          "checkpoint there is intact and can be given to --resume");
}

void fsync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xstrndup(path, slash == path ? 1 : (size_t)(slash - path)) : xstrdup(".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        /* some filesystems cannot fsync a directory (EINVAL); the data itself is already synced */
        if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
            die_at(__FILE__, __LINE__, "fsync(directory)", errno_string(), dir);
        close(fd);
    }
    free(dir);
}

uint64_t checkpoint_save(const char *path, const CheckpointMeta *meta, const float *params,
                         const float *buffers, const float *momentum, const float *exp_avg_sq) {
    ASSERT((meta->optimizer == CKPT_OPT_ADAM) == (exp_avg_sq != NULL));
    size_t plen = strlen(path);
    char *tmp = xmalloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) save_fail(tmp, -1, "open", tmp, errno);
    unsigned char header[CKPT_HEADER];
    header_encode(header, meta);
    uint64_t h = FNV1A64_INIT;
    size_t np = (size_t)meta->n_params * sizeof(float), nb = (size_t)meta->n_buffers * sizeof(float);
    if (write_all(fd, header, sizeof header, &h) || write_all(fd, params, np, &h) ||
        write_all(fd, buffers, nb, &h) || write_all(fd, momentum, np, &h) ||
        (exp_avg_sq && write_all(fd, exp_avg_sq, np, &h)))
        save_fail(tmp, fd, "write", tmp, errno);
    unsigned char sum[8];
    put_u64(sum, h);
    if (write_all(fd, sum, 8, NULL)) save_fail(tmp, fd, "write", tmp, errno);
    /* fsync before rename: otherwise a crash can leave the new name pointing at unwritten blocks */
    if (fsync(fd) != 0) save_fail(tmp, fd, "fsync", tmp, errno);
    if (close(fd) != 0) save_fail(tmp, -1, "close", tmp, errno);
    if (rename(tmp, path) != 0) save_fail(tmp, -1, "rename to final name", path, errno);
    fsync_dir_of(path);
    free(tmp);
    return h;
}

/* ----------------------------------------------------------------------------------------------
 * load */

/* Read exactly len bytes (or to EOF); returns the count read. */
static size_t read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, (char *)buf + got, len - got > ((size_t)1 << 30) ? (size_t)1 << 30 : len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

/* Read len bytes into dst (or, when dst is NULL, through a scratch buffer) and hash them. */
static void read_blob(int f, const char *path, void *dst, size_t len, uint64_t *h) {
    static unsigned char scratch[1 << 16];
    if (dst) {
        if (read_full(f, dst, len) != len) die_user("checkpoint '%s': read error: %s", path, errno_string());
        *h = fnv1a64(*h, dst, len);
        return;
    }
    while (len > 0) {
        size_t n = len < sizeof scratch ? len : sizeof scratch;
        if (read_full(f, scratch, n) != n) die_user("checkpoint '%s': read error: %s", path, errno_string());
        *h = fnv1a64(*h, scratch, n);
        len -= n;
    }
}

/* The start of a checkpoint (its first got bytes, at most CKPT_HEADER_V1, in hd; the file has size)
 * checked: the magic, a whole version-1 header, a version this trainer reads and that version's header
 * size. Anything else is a user error naming the file and the fix. want: this model's checkpoint size,
 * for the message of a truncated file (0: not known yet — checkpoint_check_start). Returns the header's
 * size. */
static uint32_t header_start(const unsigned char *hd, size_t got, const char *path, int64_t size, int64_t want) {
    if (size == 0 && want == 0) /* a save renames a whole file into place: no save of ours leaves one empty */
        die_user("'%s' is empty, not a checkpoint (give --resume a file written by --save, e.g. DIR/epoch003.ckpt)",
                 path);
    size_t mlen = got < 8 ? got : 8;
    if (memcmp(hd, CKPT_MAGIC, mlen) != 0) /* a short prefix of the magic reads as truncated */
        die_user("'%s' is not a checkpoint of this trainer (wrong magic; expected a file written by --save)", path);
    if (got < CKPT_HEADER_V1 && want > 0)
        die_user("checkpoint '%s' is truncated: %lld of %lld bytes — was the save interrupted? use an "
                 "earlier checkpoint", path, (long long)size, (long long)want);
    if (got < CKPT_HEADER_V1)
        die_user("checkpoint '%s' is truncated: %lld bytes, less than a checkpoint's header (%d) — was the save "
                 "interrupted? use an earlier checkpoint", path, (long long)size, CKPT_HEADER_V1);
    uint32_t version = get_u32(hd + 8), hsize = get_u32(hd + 12);
    if (version < 1 || version > CKPT_VERSION)
        die_user("checkpoint '%s' has format version %u; this trainer reads versions 1 to %u: use the trainer "
                 "version that wrote it — or, if this one wrote it, the file was damaged after it was written "
                 "(a flipped bit); use an earlier checkpoint", path, version, CKPT_VERSION);
    if (hsize != header_size(version))
        die_user("checkpoint '%s' is corrupt: header size %u, expected %u — the file was damaged after it was "
                 "written; use an earlier checkpoint", path, hsize, header_size(version));
    return hsize;
}

void checkpoint_check_start(const char *path) {
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) die_user("cannot open checkpoint '%s': %s (check the --resume path)", path, errno_string());
    struct stat st;
    unsigned char hd[CKPT_HEADER_V1] = {0};
    const int regular = fstat(f, &st) == 0 && S_ISREG(st.st_mode);
    const size_t got = regular ? read_full(f, hd, CKPT_HEADER_V1) : 0;
    close(f); /* before any refusal: the fuzzer (tests/fuzz/fuzz_cli.c) goes on after one */
    if (!regular) die_user("checkpoint '%s' is not a regular file (give --resume a .ckpt file)", path);
    header_start(hd, got, path, (int64_t)st.st_size, 0);
}

void checkpoint_load(const char *path, const CheckpointMeta *expect, CheckpointMeta *meta,
                     float *params, float *buffers, float *momentum, float *exp_avg_sq) {
    /* O_NONBLOCK: a FIFO given to --resume must not wait for a writer; the type is checked first */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) die_user("cannot open checkpoint '%s': %s (check the --resume path)", path, errno_string());
    struct stat st;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode))
        die_user("checkpoint '%s' is not a regular file (give --resume a .ckpt file)", path);
    const int64_t size = (int64_t)st.st_size;
    const int any_optimizer = expect->optimizer == CKPT_OPT_ANY;
    /* ANY sizes as SGD. (Written as "any ? SGD : optimizer", GCC 12.2 at -O2 dropped the two any_optimizer
     * tests below — gone with -fno-tree-vrp, no undefined behaviour found —, and --evaluate refused an SGD
     * checkpoint as trained by another optimizer.) */
    const int64_t want_model = ckpt_size(expect->n_params, expect->n_buffers, expect->optimizer);

    unsigned char hd[CKPT_HEADER] = {0}; /* the largest header */
    uint32_t hsize = header_start(hd, read_full(f, hd, CKPT_HEADER_V1), path, size, want_model);
    if (hsize > CKPT_HEADER_V1 && read_full(f, hd + CKPT_HEADER_V1, hsize - CKPT_HEADER_V1) != hsize - CKPT_HEADER_V1)
        die_user("checkpoint '%s' is truncated: %lld of %lld bytes — was the save interrupted? use an "
                 "earlier checkpoint", path, (long long)size, (long long)want_model);
    CheckpointMeta m;
    header_decode(hd, &m);
    int64_t want = ckpt_size(m.n_params, m.n_buffers, m.optimizer) - CKPT_HEADER + hsize;
    if (want < (int64_t)hsize)
        die_user("checkpoint '%s' is corrupt: impossible sizes in its header — the file was damaged after it was "
                 "written; use an earlier checkpoint", path);
    /* A flipped bit in a size field makes a whole file look cut short or overlong; when the file is
     * exactly as long as this model's checkpoint, it is the header that changed, not the file's end. */
    if (size != want && size == want_model - CKPT_HEADER + (int64_t)hsize) {
        /* Unless the header names this very model — then, the lengths differing, with the other
         * optimizer: an Adam file cut short at exactly SGD's length (or an SGD file grown to Adam's)
         * tells the same story as a flipped optimizer field, and the message cannot pick one. */
        if (m.n_params == expect->n_params && m.n_buffers == expect->n_buffers)
            die_user("checkpoint '%s' is corrupt: its header describes this model trained with --optimizer %s, "
                     "%lld bytes, but the file has %lld, the length of an --optimizer %s checkpoint — %s, or its "
                     "header was damaged after it was written; use an earlier checkpoint", path,
                     m.optimizer == CKPT_OPT_ADAM ? "adam" : "sgd", (long long)want, (long long)size,
                     m.optimizer == CKPT_OPT_ADAM ? "sgd" : "adam",
                     size < want ? "the save was cut short at exactly that length"
                                 : "bytes were appended after it was written");
        die_user("checkpoint '%s' is corrupt: its header implies %lld bytes, but the file has %lld, the length of "
                 "this model's checkpoint — the header was damaged after it was written; use an earlier checkpoint",
                 path, (long long)want, (long long)size);
    }
    if (size < want)
        die_user("checkpoint '%s' is truncated: %lld of %lld bytes — was the save interrupted? use an "
                 "earlier checkpoint", path, (long long)size, (long long)want);
    if (size > want)
        die_user("checkpoint '%s' is corrupt: %lld bytes where its header implies %lld — the file was changed "
                 "after it was written (bytes appended?); use an earlier checkpoint", path, (long long)size,
                 (long long)want);

    /* Read (straight into the caller's arrays when the sizes agree) and verify the checksum before
     * judging the header's model description, so a flipped header byte reads as corruption. */
    const int with_head = expect->head_hash && m.n_params == expect->n_params + expect->head_params;
    int fits = (m.n_params == expect->n_params || with_head) && m.n_buffers == expect->n_buffers &&
               (any_optimizer || m.optimizer == expect->optimizer);
    uint64_t h = fnv1a64(FNV1A64_INIT, hd, hsize);
    size_t np = (size_t)m.n_params * sizeof(float), nb = (size_t)m.n_buffers * sizeof(float);
    read_blob(f, path, fits ? params : NULL, np, &h);
    read_blob(f, path, fits ? buffers : NULL, nb, &h);
    read_blob(f, path, fits ? momentum : NULL, np, &h);
    if (m.optimizer == CKPT_OPT_ADAM) read_blob(f, path, fits ? exp_avg_sq : NULL, np, &h);
    unsigned char sum[8];
    if (read_full(f, sum, 8) != 8) die_user("checkpoint '%s': read error: %s", path, errno_string());
    close(f);
    if (get_u64(sum) != h)
        die_user("checkpoint '%s' is corrupt: checksum mismatch (stored %016llx, computed %016llx) — the "
                 "file was damaged after it was written; use an earlier checkpoint", path,
                 (unsigned long long)get_u64(sum), (unsigned long long)h);
    m.checksum = h;

    if (!counters_possible(&m))
        die_user("checkpoint '%s' is corrupt: counters no save writes (epoch %lld, step %lld, batch %lld, world size "
                 "%lld, batch size %lld, accumulation %lld, shuffle %lld, drop_last %lld, data source %lld, "
                 "GradScaler scale %g, growth tracker %lld, growth %g, backoff %g, interval %lld, optimizer %lld, "
                 "Adam steps %lld) — was it edited? use another checkpoint", path, (long long)m.epoch, (long long)m.step,
                 (long long)m.batch_in_epoch, (long long)m.world_size, (long long)m.batch_size,
                 (long long)m.accum_steps, (long long)m.shuffle, (long long)m.drop_last, (long long)m.data_source,
                 m.scaler_scale, (long long)m.scaler_growth_tracker, m.scaler_growth_factor,
                 m.scaler_backoff_factor, (long long)m.scaler_growth_interval, (long long)m.optimizer,
                 (long long)m.adam_steps);
    char arch[4 * sizeof m.arch + 8], norm[4 * sizeof m.norm + 8]; /* the header's strings, printable */
    checkpoint_escape(m.arch, sizeof m.arch, arch, sizeof arch);
    checkpoint_escape(m.norm, sizeof m.norm, norm, sizeof norm);
    const char *verb = expect->evaluating ? "evaluate" : "resume";
    if (strcmp(m.arch, expect->arch) != 0)
        die_user("checkpoint '%s' was saved for model %s, but this run %s %s (pass --model %s to %s it%s)", path,
                 arch, expect->evaluating ? "builds" : "trains", expect->arch, arch, verb,
                 expect->evaluating ? ", or drop --model: --evaluate takes the checkpoint's" : "");
    if (strcmp(m.norm, expect->norm) != 0)
        die_user("checkpoint '%s' was saved with --norm %s, but this run uses --norm %s (pass --norm %s to %s it%s)",
                 path, norm, expect->norm, norm, verb,
                 expect->evaluating ? ", or drop --norm: --evaluate takes the checkpoint's" : "");
    if (with_head && m.shape_hash == expect->head_hash) {
        *meta = m;
        return;
    }
    if (m.n_params != expect->n_params && expect->head_params &&
        llabs(m.n_params - expect->n_params) == expect->head_params)
        die_user("checkpoint '%s' has %lld parameters, this %s model %lld: the difference is the extra head of "
                 "--unused-param (stages 3–5) — %s it to %s this checkpoint", path, (long long)m.n_params,
                 expect->arch, (long long)expect->n_params, m.n_params > expect->n_params ? "pass" : "drop", verb);
    if (m.n_params != expect->n_params)
        die_user("checkpoint '%s' has %lld parameters, but this %s model has %lld (saved by a different "
                 "model definition)", path, (long long)m.n_params, expect->arch, (long long)expect->n_params);
    if (m.n_buffers != expect->n_buffers)
        die_user("checkpoint '%s' has %lld buffer values, but this %s model has %lld (saved by a different "
                 "model definition)", path, (long long)m.n_buffers, expect->arch, (long long)expect->n_buffers);
    if (!any_optimizer && m.optimizer != expect->optimizer) {
        const char *was = m.optimizer == CKPT_OPT_ADAM ? "adam" : "sgd", *now = expect->optimizer == CKPT_OPT_ADAM ? "adam" : "sgd";
        die_user("checkpoint '%s' was trained with --optimizer %s, but this run uses --optimizer %s: its optimizer "
                 "state is %s's (pass --optimizer %s to resume it)", path, was, now, was, was);
    }
    if (m.shape_hash != expect->shape_hash)
        die_user("checkpoint '%s' has a different shape fingerprint (%016llx, this model %016llx): same "
                 "parameter count but different layer shapes or names (saved by a different model "
                 "definition)", path, (unsigned long long)m.shape_hash, (unsigned long long)expect->shape_hash);
    *meta = m;
}

int checkpoint_peek_model(const char *path, char arch[32], char norm[8]) {
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return 0;
    struct stat st;
    unsigned char h[56];
    int ok = fstat(f, &st) == 0 && S_ISREG(st.st_mode) && read_full(f, h, sizeof h) == sizeof h &&
             !memcmp(h, CKPT_MAGIC, 8) && memchr(h + 16, 0, 32) && memchr(h + 48, 0, 8);
    close(f);
    if (!ok) return 0;
    memcpy(arch, h + 16, 32), memcpy(norm, h + 48, 8);
    return 1;
}

int checkpoint_peek_meta(const char *path, CheckpointMeta *m) {
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return 0;
    struct stat st;
    unsigned char h[CKPT_HEADER] = {0};
    int ok = fstat(f, &st) == 0 && S_ISREG(st.st_mode) && read_full(f, h, CKPT_HEADER_V1) == CKPT_HEADER_V1 &&
             !memcmp(h, CKPT_MAGIC, 8);
    uint32_t version = ok ? get_u32(h + 8) : 0, hsize = ok ? get_u32(h + 12) : 0;
    ok = ok && version >= 1 && version <= CKPT_VERSION && hsize == header_size(version) &&
         (hsize == CKPT_HEADER_V1 || read_full(f, h + CKPT_HEADER_V1, hsize - CKPT_HEADER_V1) == hsize - CKPT_HEADER_V1);
    close(f);
    if (ok) header_decode(h, m);
    return ok;
}

int checkpoint_file_checksum(const char *path, uint64_t *sum) {
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return 0;
    struct stat st;
    unsigned char magic[8], end[8];
    int yes = fstat(f, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= CKPT_HEADER_V1 + 8 &&
              pread(f, magic, 8, 0) == 8 && !memcmp(magic, CKPT_MAGIC, 8) && pread(f, end, 8, st.st_size - 8) == 8;
    close(f);
    if (yes) *sum = get_u64(end);
    return yes;
}

int checkpoint_is_one(const char *path) {
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return 0;
    struct stat st;
    char magic[8];
    int yes = fstat(f, &st) == 0 && S_ISREG(st.st_mode) && read_full(f, magic, 8) == 8 && !memcmp(magic, CKPT_MAGIC, 8);
    close(f);
    return yes;
}

/* ----------------------------------------------------------------------------------------------
 * paths */

/* name is prefix, at least `digits` decimal digits, ".ckpt" — a name checkpoint_path writes. */
static int ckpt_name(const char *name, const char *prefix, int digits) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n)) return 0;
    const char *p = name + n;
    int d = 0;
    while (*p >= '0' && *p <= '9') p++, d++;
    return d >= digits && !strcmp(p, ".ckpt");
}

/* A name checkpoint_path gives: epochNNN.ckpt or stepNNNNNNNN.ckpt. */
static int is_ckpt_name(const char *name) { return ckpt_name(name, "epoch", 3) || ckpt_name(name, "step", 8); }

int checkpoint_name_position(const char *name, int64_t *epoch, int64_t *step) {
    const int is_epoch = ckpt_name(name, "epoch", 3);
    if (!is_epoch && !ckpt_name(name, "step", 8)) return 0;
    int64_t n = strtoll(name + (is_epoch ? 5 : 4), NULL, 10);
    *epoch = is_epoch ? n : -1, *step = is_epoch ? -1 : n;
    return 1;
}

int checkpoint_name_is_one(const char *name) {
    size_t n = strlen(name);
    char base[256];
    if (n >= sizeof base) return 0;
    memcpy(base, name, n + 1);
    if (n > 4 && !strcmp(base + n - 4, ".tmp")) base[n - 4] = 0;
    return ckpt_name(base, "epoch", 3) || ckpt_name(base, "step", 8);
}

int checkpoint_list(const char *dir, char **newest) {
    if (newest) *newest = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, len = (int)strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "ckpts/" → "ckpts/epoch003.ckpt", as checkpoint_path */
    struct timespec best = {0, 0};
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_ckpt_name(e->d_name)) continue;
        char *p = NULL;
        struct stat st;
        if (asprintf(&p, "%.*s/%s", len, dir, e->d_name) < 0)
            die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) { /* not a checkpoint (checkpoint_probe's concern) */
            free(p);
            continue;
        }
        n++;
        struct timespec t = st.st_mtim;
        if (newest && (!*newest || t.tv_sec > best.tv_sec || (t.tv_sec == best.tv_sec && t.tv_nsec > best.tv_nsec) ||
                       (t.tv_sec == best.tv_sec && t.tv_nsec == best.tv_nsec && strcmp(p, *newest) > 0))) {
            free(*newest);
            *newest = p, best = t;
        } else {
            free(p);
        }
    }
    closedir(d);
    return n;
}

int checkpoint_list_partial(const char *dir, char **first) {
    if (first) *first = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".tmp")) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(len - 4), e->d_name);
        if (!is_ckpt_name(name)) continue;
        if (n++ == 0 && first) *first = xstrdup(e->d_name);
    }
    closedir(d);
    return n;
}

/* A save opens NAME.tmp and renames it to NAME: anything but a file under either name — a directory,
 * or a FIFO that open() would wait on — fails that save, after the training before it. A resumed run
 * (resumed_from) finding a checkpoint file at NAME would write over a later checkpoint of its run. */
static void probe_name(const char *dir, char *name, const char *what, const char *resumed_from) {
    for (int tmp = 0; tmp < 2; tmp++) {
        char *p = NULL;
        struct stat st;
        if (asprintf(&p, "%s%s", name, tmp ? ".tmp" : "") < 0)
            die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
        if (lstat(p, &st) == 0 && !S_ISREG(st.st_mode))
            die_user("--save '%s': '%s' exists and is not a regular file; the checkpoint %s goes there — remove "
                     "it, or give --save another directory", dir, p, what);
        if (!tmp && resumed_from && lstat(p, &st) == 0)
            die_user("--save '%s' already holds %s, a later checkpoint than --resume '%s', which this run would "
                     "write over — resume from a later one (e.g. --resume %s), give --save another directory, or "
                     "move the later checkpoints away", dir, p, resumed_from, p);
        free(p);
    }
    free(name);
}

/* A resumed run's later step checkpoints: stepN.ckpt with first_step < N <= last_step. A stop on a
 * signal (Ctrl-C, SIGTERM, a scheduler's notice) saves stepN where it stops, which may be any of them. */
static void probe_later_steps(const char *dir, const char *resumed_from, int64_t first_step, int64_t last_step) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t epoch, n;
        if (!checkpoint_name_position(e->d_name, &epoch, &n) || n <= first_step || n > last_step) continue;
        char *p = checkpoint_path(dir, 0, n, 0);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            closedir(d);
            /* A resume that re-counts the steps (another batch size, world size or K at an epoch's end)
             * numbers its steps otherwise: stepN may be an earlier position of the resumed line */
            CheckpointMeta was, at;
            if (checkpoint_peek_meta(resumed_from, &was) && checkpoint_peek_meta(p, &at) &&
                (at.epoch < was.epoch || (at.epoch == was.epoch && at.batch_in_epoch <= was.batch_in_epoch)))
                die_user("--save '%s' already holds %s (epoch %lld, batch %lld of its run), an earlier checkpoint "
                         "than --resume '%s' whose name this run's step count reaches: a stop on a signal (Ctrl-C, "
                         "SIGTERM) at step %lld would write over it — give --save another directory, or move it away",
                         dir, p, (long long)at.epoch + 1, (long long)at.batch_in_epoch, resumed_from, (long long)n);
            die_user("--save '%s' already holds %s, a later checkpoint than --resume '%s': a stop on a signal "
                     "(Ctrl-C, SIGTERM) at step %lld would write over it — resume from a later one (e.g. --resume "
                     "%s), give --save another directory, or move the later checkpoints away",
                     dir, p, resumed_from, (long long)n, p);
        }
        free(p);
    }
    closedir(d);
}

void checkpoint_probe(const char *dir, int64_t first_epoch, int64_t last_epoch, int64_t stop_step,
                      const char *resumed_from, int64_t first_step, int64_t last_step) {
    char *path = checkpoint_path(dir, 0, 0, 0); /* creates dir, or fails naming the mkdir */
    char *probe = NULL, *moved = NULL, what[64];
    if (asprintf(&probe, "%s.probe%d", path, (int)getpid()) < 0 || asprintf(&moved, "%s.renamed", probe) < 0)
        die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
    /* a save's calls, in its order; the first to fail is named, with its own errno */
    const char *call = NULL, *file = probe;
    int err = 0, fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) call = "open", err = errno;
    else {
        ssize_t w = write(fd, "probe", 5);
        if (w != 5) call = "write", err = w < 0 ? errno : ENOSPC;
        else if (fsync(fd) != 0) call = "fsync", err = errno;
        if (close(fd) != 0 && !call) call = "close", err = errno;
        if (!call && rename(probe, moved) != 0) call = "rename", err = errno;
        else if (!call) file = moved;
        if (unlink(file) != 0 && !call) call = "unlink", err = errno;
    }
    if (call)
        die_user("--save '%s': cannot write a checkpoint there (%s('%s'): %s) — give --save a writable directory",
                 dir, call, file, strerror(err));
    free(probe), free(moved), free(path);
    for (int64_t e = first_epoch + 1; e <= last_epoch && e - first_epoch <= 100000; e++) {
        snprintf(what, sizeof what, "of epoch %lld", (long long)e);
        probe_name(dir, checkpoint_path(dir, e, 0, 1), what, resumed_from);
    }
    if (stop_step > 0) {
        snprintf(what, sizeof what, "of --steps %lld (inside an epoch)", (long long)stop_step);
        probe_name(dir, checkpoint_path(dir, 0, stop_step, 0), what, resumed_from);
    }
    if (resumed_from) probe_later_steps(dir, resumed_from, first_step, last_step);
}

char *checkpoint_path(const char *dir, int64_t epoch, int64_t step, int end_of_epoch) {
    if (!dir || !dir[0]) die_user("--save needs a directory");
    make_dirs("--save", dir);
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "ckpts/" → "ckpts/epoch003.ckpt" */
    char *out = NULL;
    int n = end_of_epoch ? asprintf(&out, "%.*s/epoch%03lld.ckpt", (int)len, dir, (long long)epoch)
                         : asprintf(&out, "%.*s/step%08lld.ckpt", (int)len, dir, (long long)step);
    if (n < 0) die_at(__FILE__, __LINE__, "asprintf", "out of host memory", NULL);
    if (len == 1 && dir[0] == '/') memmove(out, out + 1, strlen(out)); /* "/" → "/epoch003.ckpt" */
    return out;
}

/* ----------------------------------------------------------------------------------------------
 * the --save directory's lock (checkpoint.h) */

#define CKPT_LOCK_NAME ".lock"

static int lock_fd = -1; /* the lock this process holds, open until it ends */
static dev_t lock_dev;
static ino_t lock_ino;

static char *lock_path(const char *dir) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* as checkpoint_path */
    char *out = NULL;
    if (asprintf(&out, "%.*s%s" CKPT_LOCK_NAME, (int)len, dir, len == 1 && dir[0] == '/' ? "" : "/") < 0)
        die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
    return out;
}

/* fd is this process's own lock file (its own lock is no other run's). */
static int lock_is_ours(int fd) {
    struct stat st;
    return lock_fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == lock_dev && st.st_ino == lock_ino;
}

/* Another process holds the lock on fd's file: name it from what it wrote there. */
_Noreturn static void lock_taken(const char *dir, const char *path, int fd) {
    char who[256] = "", shown[4 * sizeof who + 8];
    ssize_t n = pread(fd, who, sizeof who - 1, 0);
    who[n > 0 ? n : 0] = 0;
    who[strcspn(who, "\n")] = 0;
    checkpoint_escape(who, sizeof who, shown, sizeof shown);
    die_user("--save '%s' is in use by another run: %s holds its lock (%s) — give each run its own --save "
             "directory, or wait for that run to finish", dir,
             shown[0] ? shown : "a process that has not written its name yet", path);
}

void checkpoint_lock(const char *dir) {
    make_dirs("--save", dir);
    char *path = lock_path(dir);
    /* O_NOFOLLOW | O_NONBLOCK: a symlink or FIFO put there is refused, not written through or waited on */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        die_user("--save '%s': cannot use its lock file '%s' (%s) — give --save a directory you can write, or "
                 "remove '%s' if it is not a file", dir, path, fd < 0 ? errno_string() : "not a regular file", path);
    if (lock_is_ours(fd)) { /* taken already (a second call for the same directory) */
        close(fd);
        free(path);
        return;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET}; /* the whole file */
    if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        if (errno == EAGAIN || errno == EACCES) lock_taken(dir, path, fd);
        die_user("--save '%s': cannot lock '%s' (%s) — give --save a directory on a filesystem that supports "
                 "locks (a local disk)", dir, path, errno_string());
    }
    ASSERT(lock_fd < 0); /* one --save directory per process */
    /* Who holds it, for the message of a run that finds it taken. Best effort: a write that fails
     * (a full disk) leaves the lock held and only its holder unnamed. */
    char host[256] = "", who[512];
    gethostname(host, sizeof host - 1);
    int len = snprintf(who, sizeof who, "%s (pid %d on host %s)\n", program_invocation_short_name, (int)getpid(), host);
    if (ftruncate(fd, 0) == 0) write_all(fd, who, (size_t)len, NULL);
    lock_fd = fd, lock_dev = st.st_dev, lock_ino = st.st_ino;
    free(path);
}

void checkpoint_lock_check(const char *dir) {
    char *path = lock_path(dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET}; /* could we take it? */
    if (fd >= 0 && !lock_is_ours(fd) && fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
        lock_taken(dir, path, fd);
    if (fd >= 0) close(fd);
    free(path);
}
