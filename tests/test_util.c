/* test_util.c — helpers shared by the test suites (see tests.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "device.h"
#include "rng.h"
#include "tests.h"

void test_fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = hash3(seed, 0x5eed, (uint64_t)i);
        x[i] = lo + (hi - lo) * (float)((double)(h >> 11) / 9007199254740992.0);
    }
}

void test_fill_uniform_f64(double *x, int64_t n, uint64_t seed, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = hash3(seed, 0x5eed, (uint64_t)i);
        x[i] = lo + (hi - lo) * ((double)(h >> 11) / 9007199254740992.0);
    }
}

double test_rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        if (d > num) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

int test_have_gpu(const char *what) {
    if (device_cuda_count() > 0) return 1;
    printf("SKIP: %s — no CUDA device visible (built %s CUDA)\n", what,
#ifdef USE_CUDA
           "with"
#else
           "without"
#endif
    );
    fflush(stdout);
    return 0;
}

const char *test_root(void) {
    const char *r = getenv("TEST_ROOT");
    return r && r[0] ? r : ".";
}

void test_run_ok(const char *cmd, const char *what, char **out) {
    char *o;
    int rc = test_run(cmd, &o);
    ck_assert_msg(rc == 0, "%s: exit %d\n%s\n%s", what, rc, cmd, o);
    if (out) *out = o;
    else free(o);
}

int test_run(const char *cmd, char **output) {
    char *full = NULL;
    if (asprintf(&full, "%s 2>&1", cmd) < 0) abort();
    FILE *p = popen(full, "r");
    free(full);
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 1024) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    int st = pclose(p);
    if (output) *output = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run fn(arg) in a child with stdout and stderr captured into *out (malloc'd). Returns its exit
 * status: 0 when fn returns, 128+signal when killed. */
int test_run_captured(void (*fn)(void *), void *arg, char **out) {
    fflush(stdout);
    fflush(stderr);
    FILE *cap = tmpfile();
    ck_assert_ptr_nonnull(cap);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fileno(cap), STDOUT_FILENO);
        dup2(fileno(cap), STDERR_FILENO);
        fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    fseek(cap, 0, SEEK_END);
    long n = ftell(cap);
    rewind(cap);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, cap);
    buf[got] = 0;
    fclose(cap);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

double test_time_scale(void) {
    const char *v = getenv("TEST_TIME_SCALE");
    double scale = v ? atof(v) : 1;
    return scale > 1 ? scale : 1;
}

/* A port pair (p, p+1) nobody listens on, below the kernel's ephemeral range (32768 and up), so
 * that no outgoing connection of another process can take it between this check and its use.
 * (p+1: under torchrun's variables, rank 0 hosts the store on MASTER_PORT + 1.) */
int test_free_port(void) {
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (;;) {
        seed = seed * 1103515245u + 12345u;
        int port = 20000 + (int)((seed >> 8) % 12000), ok = 1;
        for (int k = 0; k < 2 && ok; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + k)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
            close(fd);
        }
        if (ok) return port;
    }
}

/* The value after "key": in a report line: NAN for null (a non-finite number), as for a missing key. */
static double report_number(const char *line, const char *k) {
    const char *p = strstr(line, k);
    if (!p || !strncmp(p + strlen(k), "null", 4)) return NAN;
    return strtod(p + strlen(k), NULL);
}

int test_report_series(const char *path, const char *type, const char *key, double *out, int max) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "report %s not written", path);
    char line[8192], tag[80], k[96];
    snprintf(tag, sizeof tag, "\"type\":\"%s\"", type);
    snprintf(k, sizeof k, "\"%s\":", key);
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max)
        if (strstr(line, tag) && strstr(line, k)) out[n++] = report_number(line, k);
    fclose(f);
    return n;
}

double test_report_field(const char *path, const char *type, const char *key) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "report %s not written", path);
    char line[8192], tag[80], k[96];
    snprintf(tag, sizeof tag, "\"type\":\"%s\"", type);
    snprintf(k, sizeof k, "\"%s\":", key);
    double v = NAN;
    while (fgets(line, sizeof line, f))
        if (strstr(line, tag)) v = report_number(line, k);
    fclose(f);
    return v;
}

int test_read_losses(const char *path, double *loss, int max) { return test_report_series(path, "step", "loss", loss, max); }

int test_report_list(const char *path, const char *type, const char *key, double *out, int max) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "report %s not written", path);
    char line[8192], tag[80], k[96];
    snprintf(tag, sizeof tag, "\"type\":\"%s\"", type);
    snprintf(k, sizeof k, "\"%s\":[", key);
    int n = -1;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, tag) ? strstr(line, k) : NULL;
        if (!p) continue;
        p += strlen(k);
        for (n = 0; n < max && *p && *p != ']'; n++) {
            char *end;
            out[n] = strtod(p, &end);
            ck_assert_msg(end != p, "%s: %s: not a number at '%.20s'", path, key, p);
            p = end + (*end == ',');
        }
    }
    fclose(f);
    return n;
}

char *test_slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    if (len) *len = n;
    return b;
}

void test_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f, "cannot write %s", path);
    ck_assert_msg(fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
}

void test_write_ckpt_header_only(const char *path) {
    unsigned char h[304] = "DPDDPCKP";
    h[8] = 9, h[12] = 304 & 0xff, h[13] = 304 >> 8; /* little-endian u32s: version, header size */
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f, "cannot write %s", path);
    ck_assert_msg(fwrite(h, 1, sizeof h, f) == sizeof h && fclose(f) == 0, "writing %s", path);
}

unsigned char *test_ckpt_as_version(int version, size_t header, const unsigned char *b, size_t n, size_t *n_old) {
    const size_t now = 304; /* version 9's header */
    ck_assert(n > now && b[8] == 9 && b[12] == (now & 0xff) && b[13] == now >> 8 && header <= now);
    *n_old = n - (now - header);
    unsigned char *old = malloc(*n_old);
    memcpy(old, b, header);
    memcpy(old + header, b + now, n - now);
    old[8] = (unsigned char)version, old[12] = (unsigned char)(header & 0xff), old[13] = (unsigned char)(header >> 8);
    return old;
}

char *test_tmpdir(void) {
    char *t = strdup("/tmp/tests_XXXXXX");
    ck_assert(mkdtemp(t));
    return t;
}

const char *test_unwritable_file(const char *dir, const char *name, char *path, size_t len, const char *what) {
    static const char drop[] = "setpriv --bounding-set -dac_override,-dac_read_search ";
    char probe[128];
    snprintf(probe, sizeof probe, "%strue > /dev/null 2>&1", drop); /* tried first: it needs CAP_SETPCAP */
    const int root = geteuid() == 0;
    if (root && system(probe) != 0) {
        printf("SKIP: %s — running as root, and setpriv is missing or may not drop root's power to write any file "
               "here (CAP_SETPCAP)\n", what);
        return NULL;
    }
    ck_assert_int_eq(chmod(dir, 01777), 0);
    snprintf(path, len, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0444);
    ck_assert(fd >= 0);
    close(fd);
    return root ? drop : "";
}

/* ---- PyTorch fixtures ------------------------------------------------------------------------ */

void *fx_keep(void *p) {
    static void **kept;
    static size_t n;
    kept = realloc(kept, (n + 1) * sizeof *kept);
    ck_assert_ptr_nonnull(kept);
    kept[n++] = p;
    return p;
}

Fx fx_open(const char *name, const char *maker) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", test_root(), name);
    Fx fx = {0};
    fx.buf = fx_keep(test_slurp(path, &fx.len));
    ck_assert_msg(fx.buf, "fixture %s missing — run `python3 %s` with PyTorch", path, maker);
    ck_assert_msg(fx.len >= 8 && !memcmp(fx.buf, "FIXT0001", 8), "%s is not a fixture file (no FIXT0001)", path);
    return fx;
}

const void *fx_get(const Fx *fx, const char *name, int64_t *count, int *dtype) {
    long off = 8;
    while (off < fx->len) {
        uint32_t nl, dt, nd, dims[8];
        memcpy(&nl, fx->buf + off, 4);
        const char *nm = fx->buf + off + 4;
        off += 4 + nl;
        memcpy(&dt, fx->buf + off, 4);
        memcpy(&nd, fx->buf + off + 4, 4);
        ck_assert(nd <= 8);
        memcpy(dims, fx->buf + off + 8, 4 * nd);
        off += 8 + 4 * nd;
        int64_t n = 1;
        for (uint32_t i = 0; i < nd; i++) n *= dims[i];
        int64_t esz = (dt == 1 || dt == 2) ? 8 : 4;
        if (nl == strlen(name) && !memcmp(nm, name, nl)) {
            *count = n;
            *dtype = (int)dt;
            return memcpy(fx_keep(malloc((size_t)(n * esz) + 1)), fx->buf + off, (size_t)(n * esz));
        }
        off += n * esz;
    }
    ck_abort_msg("fixture record '%s' not found", name);
    return NULL;
}

const void *fx_need(const Fx *fx, const char *cas, const char *field, int dtype, int64_t count) {
    char k[64];
    snprintf(k, sizeof k, "%s.%s", cas, field);
    int64_t n;
    int dt;
    const void *p = fx_get(fx, k, &n, &dt);
    ck_assert_msg(dt == dtype && n == count, "%s: dtype %d, %lld values", k, dt, (long long)n);
    return p;
}

int test_torch_schedule(const char *schedule, int total, double lr, double *out, int max) {
    char path[1200], head[128];
    snprintf(path, sizeof path, "%s/tests/fixtures/schedule.txt", test_root());
    char *text = test_slurp(path, NULL);
    if (!text) return -1;
    snprintf(head, sizeof head, "\n%s %d %g: ", schedule, total, lr); /* the script writes repr(lr) */
    char *p = strstr(text, head);
    int n = -1;
    if (p) {
        p += strlen(head);
        for (n = 0; n < max && *p && *p != '\n'; n++) {
            char *end;
            out[n] = strtod(p, &end);
            if (end == p) break;
            p = end;
        }
    }
    free(text);
    return n;
}
