/* net.h — the few TCP socket calls this project needs, each with a deadline.
 *
 * The rendezvous store (store.c) and the host ring (comm_host.c) both talk TCP: listen, connect
 * (retrying while the other side is still starting), and send or receive exactly N bytes. Every
 * call is bounded by a timeout, so a dead or stopped peer becomes an error instead of a hang, and
 * sends never raise SIGPIPE. Failures return −1 with errno set; the caller says what it was doing. */
#ifndef NET_H
#define NET_H

#include <stddef.h>

/* Listen on addr:port (port 0: any free port; the port chosen is returned in *bound). Returns the
 * socket, or −1 with errno set (EADDRINUSE, EADDRNOTAVAIL, ENOENT when addr does not resolve, …). */
int net_listen(const char *addr, int port, int *bound);
/* The listening socket a parent process handed down in the environment variable `env` (a descriptor
 * number), if it is one that listens on `port`: returned with close-on-exec set again, and `env` unset
 * so that nothing started later takes it too. −1 when env is unset or names no such socket (the
 * caller then binds the port itself, whose errors say what is wrong). */
int net_take_listener(const char *env, int port);
/* Connect to addr:port, retrying refused / unreachable attempts until timeout_s. Returns the
 * socket, or −1 with errno set (ETIMEDOUT when the time ran out, ENOENT when addr did not resolve). */
int net_connect(const char *addr, int port, double timeout_s);
/* Room for `need` open files: when the soft RLIMIT_NOFILE (ulimit -n) is below it, raise it — up to
 * the hard limit, which needs no privilege. 0 when there is room now; −1 when even the hard limit
 * is below need (*have gets the limit in force). Run out mid-setup, a job would fail far from the
 * cause: a store that cannot accept its ranks' connections looks like a network problem. */
int net_reserve_fds(long need, long *have);
/* Send / receive exactly len bytes. Return 0, or −1 on error, timeout (errno ETIMEDOUT) or a closed
 * peer (errno ECONNRESET). */
int net_send_all(int fd, const void *buf, size_t len, double timeout_s);
int net_recv_all(int fd, void *buf, size_t len, double timeout_s);
/* Small messages go out at once (TCP_NODELAY); for sockets from accept(). */
void net_nodelay(int fd);
/* The peer's IP address as text into out (cap bytes; "?" when unknown), for warnings about strangers. */
void net_peer_name(int fd, char *out, size_t cap);

#endif
