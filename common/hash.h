/* hash.h — FNV-1a, 64 bits: the one checksum and fingerprint of this project.
 *
 * It fingerprints a model's parameter names and shapes, checksums checkpoints, and lets DDP's ranks
 * compare their flags and models. Not cryptographic: it catches accidents (a truncated file, a
 * different model), not an attacker — the rendezvous's secret is proved with HMAC-SHA256 (auth.h). */
#ifndef HASH_H
#define HASH_H

#include <stddef.h>
#include <stdint.h>

#define FNV1A64_INIT 0xcbf29ce484222325ull

/* Continue hash h over len bytes (start from FNV1A64_INIT; chain calls to hash several pieces). */
uint64_t fnv1a64(uint64_t h, const void *data, size_t len);

#endif
