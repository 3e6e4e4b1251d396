/* auth.h — the job's shared secret, and the challenge–response that proves a peer holds it.
 *
 * The rendezvous store (store.h) listens on a TCP port that any process on the machine — or on the
 * network, with a routable --master-addr — can reach. Without a check, any of them could read the
 * keys, claim a rank before the real one, or feed the ranks a forged NCCL id. So every job has a
 * secret, and a connection counts only once both ends have proved they know it, without sending it:
 *
 *   server → client   "RDZ1" + 32 random bytes (the server's nonce, sn)
 *   client → server   32 random bytes (cn) + HMAC-SHA256(secret, "client" sn cn)
 *   server → client   HMAC-SHA256(secret, "server" sn cn)       (or it closes the connection)
 *
 * Fresh nonces on both sides make a recorded exchange useless for another connection; the server's
 * answer proves to the client that it reached its own job's store, not a process squatting the port.
 * HMAC-SHA256 comes from OpenSSL's libcrypto (the usual C library for it). The host ring's
 * connections (comm_host.c) run the same exchange, with roles that name the two ranks.
 *
 * Where the secret comes from, in this order:
 *   STAGE_RDZV_SECRET       the secret itself (at least 16 characters)
 *   STAGE_RDZV_SECRET_FILE  a file holding it, owned by this user and readable by nobody else
 * Our launcher on one node makes a random one for its own workers, whether or not either is set (one
 * job's own: two jobs sharing an exported secret could join each other's rendezvous); several nodes,
 * or torchrun / srun / mpirun, need the user to give every rank the same one. */
#ifndef AUTH_H
#define AUTH_H

#include <stddef.h>
#include <stdint.h>

#define AUTH_NONCE 32
#define AUTH_MAC 32
#define AUTH_MIN_SECRET 16
#define AUTH_MAX_SECRET 1024
#define AUTH_HELLO 4 /* "RDZ1" */

/* The job's secret from the environment into buf (cap bytes); returns its length, 0 when neither
 * variable is set. A secret that is too short, or a file that others can read, is a user error. */
size_t auth_secret(uint8_t *buf, size_t cap);
/* A fresh random secret as 64 hex characters (+ NUL) for a launcher's own workers. */
void auth_new_secret(char out[65]);
/* n random bytes from the kernel. */
void auth_random(uint8_t *out, size_t n);
/* HMAC-SHA256(secret, role ‖ sn ‖ cn) into mac. role is "client" or "server" for the store; the host
 * ring's (comm_host.c) also names the two ranks, so a MAC made for one pair is no good for another.
 * Nonces have a fixed length, so distinct roles (at most AUTH_MAX_ROLE characters) never collide. */
#define AUTH_MAX_ROLE 64
void auth_mac(const uint8_t *secret, size_t len, const char *role, const uint8_t *sn, const uint8_t *cn,
              uint8_t mac[AUTH_MAC]);
/* Constant-time comparison of two MACs (1 if equal). */
int auth_equal(const uint8_t *a, const uint8_t *b);

#endif
