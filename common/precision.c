/* precision.c — fp16 / bf16 conversions in plain C (see precision.h). Bit manipulation only, no
 * floating-point tricks, so the rounding is exactly round-to-nearest-even on any host. */
#include "precision.h"

#include <string.h>

#include "errors.h"

const char *precision_name(Precision p) {
    return p == PREC_FP16 ? "fp16" : p == PREC_BF16 ? "bf16" : "fp32";
}

Precision precision_parse(const char *name) {
    if (!strcmp(name, "off") || !strcmp(name, "fp32")) return PREC_FP32;
    if (!strcmp(name, "fp16")) return PREC_FP16;
    if (!strcmp(name, "bf16")) return PREC_BF16;
    ASSERT(!"unknown precision name");
    return PREC_FP32;
}

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Shift m right by s (1 ≤ s ≤ 31), rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, int s) {
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

uint16_t f32_to_f16(float x) {
    uint32_t u = bits_of(x), ax = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (ax > 0x7f800000u) return sign | 0x7e00u; /* NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00u; /* ≥ 65520 (and inf): rounds to inf */
    if (ax < 0x38800000u) {                       /* below 2^-14: fp16 subnormal (or 0) */
        int e = (int)(ax >> 23);                  /* biased fp32 exponent; 0 = fp32 subnormal */
        if (e < 102) return sign;                 /* < 2^-25: rounds to 0 (2^-25 itself ties to 0) */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u; /* value = m · 2^(e−150); in units of 2^-24: */
        return sign | (uint16_t)shift_rne(m, 126 - e); /* m · 2^(e−126); may round up to 0x400 */
    }
    /* Normal: rebias the exponent (127 → 15) and round the 23-bit mantissa to 10. A carry out of
     * the mantissa correctly bumps the exponent; the inf case was handled above. */
    return sign | (uint16_t)shift_rne(ax - (112u << 23), 13);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13)); /* inf, NaN (payload kept) */
    if (e == 0) { /* zero or subnormal m · 2^-24: normalise into an fp32 normal */
        if (m == 0) return float_of(sign);
        int shift = 0;
        while (!(m & 0x400u)) m <<= 1, shift++;
        return float_of(sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3ffu) << 13));
    }
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t f32_to_bf16(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u; /* NaN */
    /* Add 0x7fff (+1 when the kept part is odd) and truncate: round to nearest, ties to even. A
     * carry into the exponent is right, up to and including rounding to inf. */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

float precision_round(Precision p, float x) {
    if (p == PREC_FP16) return f16_to_f32(f32_to_f16(x));
    if (p == PREC_BF16) return bf16_to_f32(f32_to_bf16(x));
    return x;
}

/* The CPU backend rounds every stored activation, so this is its hot loop. Without leaving fp32:
 * rounding the mantissa to fp16's 10 bits (or bf16's 7) is "add half an ulp minus one, plus the
 * kept lowest bit, then clear the dropped bits" — the same integer trick as f32_to_bf16, and a
 * carry into the exponent is right. That is fp16 rounding wherever fp16 is normal, 2^-14 ≤ |x| <
 * 65520; outside that range (subnormals, zero, overflow, NaN) the full conversion does it. The
 * tests compare both paths on every exponent. */
static inline float round_f16_fast(float x) {
    uint32_t u = bits_of(x), ax = u & 0x7fffffffu;
    if (ax < 0x38800000u || ax >= 0x477ff000u) return f16_to_f32(f32_to_f16(x));
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    return float_of(u);
}

static inline float round_bf16_fast(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_to_f32(0x7fc0u);
    return float_of(((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16);
}

void precision_round_array(Precision p, int64_t n, float *x) {
    if (p == PREC_FP16)
        for (int64_t i = 0; i < n; i++) x[i] = round_f16_fast(x[i]);
    else if (p == PREC_BF16)
        for (int64_t i = 0; i < n; i++) x[i] = round_bf16_fast(x[i]);
}

void precision_pack(Precision p, int64_t n, const float *src, uint16_t *dst) {
    ASSERT(p == PREC_FP16 || p == PREC_BF16);
    for (int64_t i = 0; i < n; i++) dst[i] = p == PREC_FP16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}

void precision_unpack(Precision p, int64_t n, const uint16_t *src, float *dst) {
    ASSERT(p == PREC_FP16 || p == PREC_BF16);
    for (int64_t i = 0; i < n; i++) dst[i] = p == PREC_FP16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
}

void precision_scale_stored(Precision p, int64_t n, void *x, float alpha) {
    uint16_t *h = x;
    if (p == PREC_FP32)
        for (int64_t i = 0; i < n; i++) ((float *)x)[i] *= alpha;
    else if (p == PREC_FP16)
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_f16(f16_to_f32(h[i]) * alpha);
    else
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(bf16_to_f32(h[i]) * alpha);
}
