/* net.c — see net.h. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"

static int resolve(const char *addr, int port, int passive, struct addrinfo **res) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = passive ? AI_PASSIVE : 0};
    return getaddrinfo(addr, ps, &hints, res);
}

int net_reserve_fds(long need, long *have) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0; /* cannot tell: let the calls say */
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)need) {
        struct rlimit want = rl;
        rlim_t ample = need < 1024 ? 1024 : (rlim_t)need * 4; /* room for CUDA, NCCL and the loader too */
        want.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > ample ? ample : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
    }
    *have = rl.rlim_cur == RLIM_INFINITY ? need : (long)rl.rlim_cur;
    return *have < need ? -1 : 0;
}

void net_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small requests go out at once */
}

void net_peer_name(int fd, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    const void *a = NULL;
    if (fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0)
        a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
            : ss.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr : NULL;
    if (!a || !inet_ntop(ss.ss_family, a, out, (socklen_t)cap)) snprintf(out, cap, "?");
}

int net_listen(const char *addr, int port, int *bound) {
    struct addrinfo *res;
    if (resolve(addr, port, 1, &res) != 0) {
        errno = ENOENT; /* no such name: not the same advice as an address of another machine */
        return -1;
    }
    int fd = -1, err = EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        /* REUSEADDR only skips TIME_WAIT leftovers of an earlier run; two live listeners on one
         * port are still refused (EADDRINUSE), which is the error we want to report. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
        /* Taken: the clients try the addresses in this same order (net_connect), so they would reach
         * whoever holds it — another job's store on ::1 while ours listened on 127.0.0.1, for a name
         * such as localhost that has both. Report it, rather than listen on the next address. */
        if (err == EADDRINUSE) break;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        errno = err;
        return -1;
    }
    if (bound) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) { /* the port the kernel gave us */
            err = errno;
            close(fd);
            errno = err;
            return -1;
        }
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    }
    return fd;
}

int net_take_listener(const char *env, int port) {
    const char *v = getenv(env);
    if (!v) return -1;
    char *end;
    long fd = strtol(v, &end, 10);
    int ok = *v && !*end && fd >= 0 && fd < 1 << 20, listening = 0;
    unsetenv(env); /* v points into the environment: read before this */
    socklen_t l = sizeof listening;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (!ok || getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l) != 0 || !listening ||
        getsockname((int)fd, (struct sockaddr *)&ss, &len) != 0 ||
        ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                       : ((struct sockaddr_in *)&ss)->sin_port) != port)
        return -1;
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    return (int)fd;
}

/* One non-blocking connect attempt, bounded by timeout_ms. */
static int connect_once(const struct addrinfo *ai, int timeout_ms, int *err) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        rc = poll(&p, 1, timeout_ms);
        if (rc == 1) {
            int e = 0;
            socklen_t l = sizeof e;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
            rc = e ? -1 : 0;
            errno = e;
        } else {
            errno = rc == 0 ? ETIMEDOUT : errno;
            rc = -1;
        }
    }
    if (rc < 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, flags); /* blocking again: every wait below goes through poll() anyway */
    net_nodelay(fd);
    return fd;
}

int net_connect(const char *addr, int port, double timeout_s) {
    double t_end = time_now() + timeout_s;
    int err = ETIMEDOUT, pause_ms = 20;
    for (;;) {
        struct addrinfo *res;
        if (resolve(addr, port, 0, &res) == 0) {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                double left = t_end - time_now();
                int ms = left > 1.0 ? 1000 : (left > 0 ? (int)(left * 1000) + 1 : 1);
                int fd = connect_once(ai, ms, &err);
                if (fd >= 0) {
                    freeaddrinfo(res);
                    return fd;
                }
            }
            freeaddrinfo(res);
        } else {
            err = ENOENT; /* the name does not resolve (yet): as net_listen says it, not "No route to host" */
        }
        /* The listener may simply not be up yet (rank 0 still starting): retry until the deadline. */
        if (time_now() + pause_ms * 1e-3 > t_end) break;
        usleep((useconds_t)pause_ms * 1000);
        if (pause_ms < 200) pause_ms *= 2;
    }
    errno = err;
    return -1;
}

/* Wait for fd to become readable / writable; 0 when ready, −1 with errno ETIMEDOUT or the error. */
static int wait_fd(int fd, short events, double t_end) {
    for (;;) {
        double left = t_end - time_now();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int rc = poll(&p, 1, ms);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

int net_send_all(int fd, const void *buf, size_t len, double timeout_s) {
    const char *p = buf;
    double t_end = time_now() + timeout_s;
    while (len > 0) {
        if (wait_fd(fd, POLLOUT, t_end) < 0) return -1;
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT); /* never SIGPIPE */
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            if (errno == EPIPE) errno = ECONNRESET;
            return -1;
        }
        p += n, len -= (size_t)n;
    }
    return 0;
}

int net_recv_all(int fd, void *buf, size_t len, double timeout_s) {
    char *p = buf;
    double t_end = time_now() + timeout_s;
    while (len > 0) {
        if (wait_fd(fd, POLLIN, t_end) < 0) return -1;
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            return -1;
        }
        p += n, len -= (size_t)n;
    }
    return 0;
}
