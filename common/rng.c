/* rng.c — mt19937 (as in PyTorch's CPU generator), randperm, splitmix64. See rng.h. */
#include "rng.h"

#include <math.h>

void mt_seed(Mt19937 *g, uint64_t seed) {
    g->mt[0] = (uint32_t)(seed & 0xffffffffu);
    for (int i = 1; i < 624; i++)
        g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + (uint32_t)i;
    g->idx = 624;
}

uint32_t mt_next(Mt19937 *g) {
    if (g->idx >= 624) { /* regenerate the whole state at once, as the reference does */
        for (int i = 0; i < 624; i++) {
            uint32_t y = (g->mt[i] & 0x80000000u) | (g->mt[(i + 1) % 624] & 0x7fffffffu);
            g->mt[i] = g->mt[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        g->idx = 0;
    }
    uint32_t y = g->mt[g->idx++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double mt_uniform(Mt19937 *g) { return (double)(mt_next(g) & ((1u << 24) - 1)) / (double)(1u << 24); }

double mt_normal(Mt19937 *g) {
    double u1 = mt_uniform(g), u2 = mt_uniform(g);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void randperm_inside_out(int64_t n, uint64_t seed, int64_t *out) {
    Mt19937 g;
    mt_seed(&g, seed);
    /* random64() is two 32-bit outputs, the first the high half; a 32-bit draw modulo n would be
     * visibly non-uniform (and zero at n = 2^32) for n this large. */
    for (int64_t i = 0; i < n; i++) {
        uint64_t hi = mt_next(&g), lo = mt_next(&g);
        int64_t z = (int64_t)(((hi << 32) | lo) % (uint64_t)(i + 1));
        out[i] = out[z];
        out[z] = i;
    }
}

void randperm(int64_t n, uint64_t seed, int64_t *out) {
    /* --show-sampler's --dataset-size reaches far past this: the same order as PyTorch's there too */
    if (n >= RANDPERM_SWAP_MAX_N) {
        randperm_inside_out(n, seed, out);
        return;
    }
    Mt19937 g;
    mt_seed(&g, seed);
    for (int64_t i = 0; i < n; i++) out[i] = i;
    for (int64_t i = 0; i + 1 < n; i++) {
        int64_t z = (int64_t)(mt_next(&g) % (uint32_t)(n - i));
        int64_t t = out[i];
        out[i] = out[i + z];
        out[i + z] = t;
    }
}

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}
