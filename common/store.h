/* store.h — a small TCP key-value store for rendezvous (PyTorch's TCPStore, reduced to what we need).
 *
 * Before any communicator exists, the processes of a job must find each other. Rank 0 hosts the
 * store: a server thread listening on --master-addr:--master-port (that address only) that answers
 * every rank, rank 0 included. Over it the ranks check that everyone has arrived (rendezvous), pass
 * NCCL's unique id from rank 0 to the others, publish the host ring's socket addresses, and meet in
 * barriers. Messages are bounded (STORE_MAX_KEY, STORE_MAX_VALUE); anything larger closes the
 * connection instead of growing a buffer without limit.
 *
 * Protocol, one request then one response per connection at a time (integers big-endian):
 *   request  = op:u8 pad:u8[3] key_len:u32 val_len:u32 key val
 *   response = status:u8 pad:u8[3] val_len:u32 val
 *   ops: SET (store), GET (answered once the key exists), ADD (int64 counter; returns the new
 *   value), CHECK (status 1 if the key exists).
 *
 * Before the first request, client and server prove to each other that they know the job's secret
 * (a challenge–response with HMAC-SHA256: auth.h); the server closes connections that do not, that
 * stall, or that send more than one request at a time, and never waits on a client (server limits
 * in store.c).
 *
 * Every wait has a timeout, and every failure says which rank, what, and which flag to check. */
#ifndef STORE_H
#define STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_MAX_KEY 256
#define STORE_MAX_VALUE (1 << 20) /* 1 MiB: NCCL's unique id is 128 bytes, a ring address ~60 */
/* The most ranks a job may have: rank 0's store keeps a connection per rank, and refuses more (a
 * rank past them read "did not send the store's greeting"). Launchers refuse a larger world first. */
#define STORE_MAX_WORLD 4096

typedef struct Store Store;

/* Join the job's rendezvous at addr:port as `rank` of `world`. Rank 0 first starts the server there
 * (a port in use or an address that is not this machine's is a user error). Every rank connects,
 * retrying until timeout_s, claims its rank (two processes with one rank is an error) and waits
 * until all `world` ranks have joined; a rank missing after timeout_s is named in the error. */
Store *store_open(const char *addr, int port, int rank, int world, double timeout_s);
/* How to choose another port, in the words of whoever chose this one: "pick a free one with
 * --master-port" unless the worker's launcher set it (launch.c), where --master-port is refused —
 * then the MASTER_PORT to export, or torchrun's --master-port. Ends the port-in-use errors. */
extern char store_port_fix[320];
/* What names the store's address in its errors: "--master-addr", or MASTER_ADDR and who exported it
 * when another launcher or a script did (launch.c): --master-addr cannot override that. */
extern char store_addr_name[96];
/* …the address and port together ("--master-addr and --master-port", or the variables and who set
 * them), and what to check on the node of a rank that did not join: our launcher's flags, or the
 * other launcher's address and port. */
extern char store_endpoint[256];
extern char store_join_check[256];
/* …and what sets the world size and the ranks (our launcher's flags by default; launch.c says
 * WORLD_SIZE and RANK, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE for a job another launcher started). */
extern char store_world_fix[200];
extern char store_rank_fix[200];
/* Rank 0 waits (bounded) until every other rank has disconnected, then stops the server. */
void store_close(Store *s);
/* Timeout for later gets and barriers (the job's collective timeout once training runs). */
void store_set_timeout(Store *s, double timeout_s);

void store_set(Store *s, const char *key, const void *val, size_t len);
/* Wait until `key` exists, copy its value into val (at most cap bytes), return its length.
 * Dies naming the key if it does not appear within the timeout. */
size_t store_get(Store *s, const char *key, void *val, size_t cap);
/* Wait until `key` exists (the same timeout and error as store_get). */
void store_wait(Store *s, const char *key);
int64_t store_add(Store *s, const char *key, int64_t delta); /* atomic; returns the new value */
int store_check(Store *s, const char *key);                   /* 1 if the key exists now */
/* Every rank calls it; returns once all have. A rank missing after the timeout is named. */
void store_barrier(Store *s, const char *what);

/* The local IP address this rank uses to reach the store — the interface its peers can reach too
 * (the host ring listens there). */
const char *store_local_ip(const Store *s);
/* The job's secret (auth.h) this rank proved to the store; the host ring's handshake uses it too.
 * Never empty: store_open refuses to start without one. */
const uint8_t *store_secret(const Store *s, size_t *len);
/* 0, 1, 2, … on successive calls: ranks that call it in the same order get the same numbers
 * (communicators name their keys with it). */
int store_sequence(Store *s);
int store_rank(const Store *s);
int store_world(const Store *s);

/* A raw connection to the store that has passed the handshake with this secret (tests and tools);
 * -1 with *why set when it cannot connect or the handshake fails. */
int store_dial(const char *addr, int port, const uint8_t *secret, size_t len, double timeout_s,
               const char **why);
/* Test-only: feed bytes to the server's request handling without sockets (tests/fuzz/). */
int store_fuzz_input(const uint8_t *data, size_t n);

#endif
