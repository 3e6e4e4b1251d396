/* precision.h — the floating-point types of mixed precision: fp32, fp16 and bf16.
 *
 * fp16 (IEEE binary16): 1 sign, 5 exponent, 10 mantissa bits. Largest finite 65504, smallest normal
 *   2^-14, subnormals down to 2^-24. Fine steps, narrow range: small gradients underflow to 0 and
 *   large ones overflow to inf — why fp16 training needs a loss scale (amp.h).
 * bf16 (bfloat16): 1 sign, 8 exponent, 7 mantissa bits: fp32's range with 8 bits of precision, so
 *   nothing that fits in fp32 under- or overflows; no scaler needed.
 *
 * Conversion fp32 → 16 bits rounds to nearest, ties to even (what cvt.rn does on the GPU, CUDA's
 * __float2half_rn / __float2bfloat16_rn, and torch's .half() / .bfloat16()):
 *  - fp16: |x| ≥ 65520 (the midpoint between 65504 and 2^16) becomes ±inf; values below 2^-14
 *    become subnormals (multiples of 2^-24), |x| ≤ 2^-25 becomes ±0; NaN stays NaN (torch's
 *    quiet NaN 0x7E00 with the sign; the GPU writes 0x7FFF — both are NaN, and that is all we test).
 *  - bf16: the top 16 bits of the float, rounded; NaN becomes 0x7FC0 (as torch's c10::BFloat16).
 * 16 → 32 bits is exact.
 *
 * The CPU backend emulates mixed precision by keeping low-precision tensors as float arrays whose
 * every value is exactly representable in the low type (precision_round): computing in fp32 and
 * rounding where the GPU stores a 16-bit value gives the GPU's values, overflow and underflow
 * included. On CUDA those tensors really are 16 bits per element. */
#ifndef PRECISION_H
#define PRECISION_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PREC_FP32 = 0, PREC_FP16 = 1, PREC_BF16 = 2 } Precision;

/* "fp32" | "fp16" | "bf16" */
const char *precision_name(Precision p);
/* "off" and "fp32" → PREC_FP32, "fp16", "bf16"; anything else is an internal error (flags are
 * validated by the CLI first). */
Precision precision_parse(const char *name);

uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);

/* x rounded to p and widened back (p == PREC_FP32: x itself). */
float precision_round(Precision p, float x);
/* In place, over an array (the CPU backend's "store in the low type"). */
void precision_round_array(Precision p, int64_t n, float *x);
/* Host arrays to and from real 16-bit storage (p is fp16 or bf16): for tests, and for a 16-bit
 * staging buffer on the host. */
void precision_pack(Precision p, int64_t n, const float *src, uint16_t *dst);
void precision_unpack(Precision p, int64_t n, const uint16_t *src, float *dst);
/* x = round_p(x · alpha) in place, x in p's own storage (floats, or packed 16-bit values), the
 * product taken in fp32: what PyTorch's CUDA tensor.div_(world) does to an fp16 / bf16 tensor (a
 * multiply by the fp32 reciprocal, then one rounding) — DDP's compression hooks' divide. */
void precision_scale_stored(Precision p, int64_t n, void *x, float alpha);

#endif
