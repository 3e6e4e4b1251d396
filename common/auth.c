/* auth.c — the job's secret and HMAC-SHA256 (OpenSSL's libcrypto) for the handshakes of the store and the
 * host ring (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"

static size_t checked(size_t n, const char *where) {
    if (n < AUTH_MIN_SECRET)
        die_user("the rendezvous secret in %s has %zu characters; use at least %d, e.g. "
                 "export STAGE_RDZV_SECRET=$(openssl rand -hex 32)", where, n, AUTH_MIN_SECRET);
    return n;
}

/* No libcrypto teardown at exit: rank 0's store thread may be checking a late rank's handshake while
 * the main thread exits with an error, and HMAC on a torn-down library crashes (SIGSEGV) instead of
 * the clean exit code the launcher reports. It takes effect only as the process's first libcrypto
 * call, so every entry here that leads to one makes it first (store_open reads the secret before any
 * handshake). */
static void crypto_init(void) { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL); }

size_t auth_secret(uint8_t *buf, size_t cap) {
    crypto_init();
    const char *v = getenv("STAGE_RDZV_SECRET"), *file = getenv("STAGE_RDZV_SECRET_FILE");
    if (v && v[0] && file && file[0]) /* which one the job uses would be a guess, and ranks may guess apart */
        die_user("both STAGE_RDZV_SECRET and STAGE_RDZV_SECRET_FILE are set: unset one of them");
    if (v && v[0]) {
        size_t n = strlen(v);
        if (n > cap) die_user("STAGE_RDZV_SECRET is longer than %zu characters", cap);
        memcpy(buf, v, n);
        return checked(n, "STAGE_RDZV_SECRET");
    }
    const char *path = getenv("STAGE_RDZV_SECRET_FILE");
    if (!path || !path[0]) return 0;
    /* O_NONBLOCK: a FIFO put there must not hang us; fstat then refuses anything but a file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) die_user("cannot open STAGE_RDZV_SECRET_FILE '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        die_user("STAGE_RDZV_SECRET_FILE '%s' is not a regular file", path);
    if (st.st_uid != getuid() || (st.st_mode & (S_IRWXG | S_IRWXO)))
        die_user("STAGE_RDZV_SECRET_FILE '%s' can be read by others (mode %03o, owner uid %d): the secret "
                 "must be yours alone — chmod 600 '%s'", path, (unsigned)(st.st_mode & 0777), (int)st.st_uid,
                 path);
    if (st.st_size > (off_t)cap + 2) /* + a line end ("\r\n"): cut, two files of one prefix would agree */
        die_user("STAGE_RDZV_SECRET_FILE '%s' holds %lld bytes, more than a secret's %zu", path,
                 (long long)st.st_size, cap);
    ssize_t n = read(fd, buf, cap);
    /* a file of cap bytes or more: what follows them may only be the line end, else they are a cut */
    char rest[2];
    ssize_t more = n == (ssize_t)cap ? read(fd, rest, sizeof rest) : 0;
    close(fd);
    if (n < 0 || more < 0) die_user("cannot read STAGE_RDZV_SECRET_FILE '%s': %s", path, strerror(errno));
    for (ssize_t i = 0; i < more; i++)
        if (rest[i] != '\n' && rest[i] != '\r')
            die_user("STAGE_RDZV_SECRET_FILE '%s' holds %lld bytes, more than a secret's %zu and a line end", path,
                     (long long)st.st_size, cap);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--; /* `echo secret > file` */
    return checked((size_t)n, "STAGE_RDZV_SECRET_FILE");
}

void auth_random(uint8_t *out, size_t n) {
    while (n > 0) {
        ssize_t got = getrandom(out, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            die_at(__FILE__, __LINE__, "getrandom", errno_string(), NULL);
        }
        out += got, n -= (size_t)got;
    }
}

void auth_new_secret(char out[65]) {
    uint8_t b[32];
    auth_random(b, sizeof b);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

void auth_mac(const uint8_t *secret, size_t len, const char *role, const uint8_t *sn, const uint8_t *cn,
              uint8_t mac[AUTH_MAC]) {
    size_t r = strlen(role);
    ASSERT(r <= AUTH_MAX_ROLE);
    uint8_t msg[AUTH_MAX_ROLE + 2 * AUTH_NONCE];
    memcpy(msg, role, r);
    memcpy(msg + r, sn, AUTH_NONCE);
    memcpy(msg + r + AUTH_NONCE, cn, AUTH_NONCE);
    unsigned int n = 0;
    crypto_init();
    if (!HMAC(EVP_sha256(), secret, (int)len, msg, r + 2 * AUTH_NONCE, mac, &n) || n != AUTH_MAC)
        die_at(__FILE__, __LINE__, "HMAC(EVP_sha256(), …)", "libcrypto failed", NULL);
}

int auth_equal(const uint8_t *a, const uint8_t *b) { return CRYPTO_memcmp(a, b, AUTH_MAC) == 0; }
