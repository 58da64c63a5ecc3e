/* Quantizers for what a distributed tier exchanges (SPEC section 7): float32 (lossless),
 * bfloat16, int8 and int4 with symmetric per-group scales, and FP8 E4M3 with a per-group scale,
 * plus error feedback so that the receiver's running sum of dequantized messages never drifts
 * further from the exact sum than the last message's rounding.
 *
 * Encoding (little-endian, deterministic for a given input under the default FP environment):
 *   f32   n float32 values, 4n bytes, bit-exact.
 *   bf16  n bfloat16 values (upper half of float32), 2n bytes, round to nearest even.
 *   int8, int4, fp8: ceil(n/group) float32 scales first, then the codes:
 *   int8  one int8 per value, q = x/scale rounded to nearest even, in [-127, 127] (-128 is
 *         never written).
 *   int4  two values per byte, element 2i in the low nibble and 2i+1 in the high one, each a
 *         two's-complement nibble in [-7, 7]; for odd n the last high nibble is 0.
 *   fp8   one OCP FP8 E4M3 byte per value (bias 7, max 448, no infinities, 0x7F/0xFF are NaN
 *         and never written), value = e4m3(x/scale) * scale.
 * Scales: scale = max|x| / qmax over the group (qmax = 127, 7, 448), rounded up to the next
 * float32 when the division rounded down, so that |x|/scale <= qmax holds exactly and no value
 * is clipped; scale = 0 for an all-zero group (its codes are all 0).
 *
 * Non-finite values: int8, int4 and fp8 refuse NaN and +-Inf (SF_E_INVAL naming the first bad
 * index; out may then be partly written). f32 carries them bit for bit; bf16 carries +-Inf and
 * keeps a NaN a NaN (its quiet bit is forced on, the payload's top bits are kept).
 * A finite float32 above the largest bf16 (|x| >= 0x1.ffp127) rounds to +-Inf in bf16 as IEEE
 * round-to-nearest does; sf_quant_error_bound then reports INFINITY.
 *
 * Error bounds (sf_quant_error_bound), per element x with its group's stored scale s:
 *   f32   0.
 *   bf16  2^-8 |x| + 2^-134 (half an ulp with 8 significant bits; 2^-134 is half the bf16
 *         subnormal step 2^-133, where the relative bound stops holding).
 *   int8, int4  s * (1/2 + qmax * 2^-23): half a quantization step, plus float32 rounding of the
 *         decoded value (<= qmax*s*2^-24) and of x/s in double (<= qmax*2^-52), so that the bound
 *         holds for every input, not just for values away from the rounding midpoints.
 *   fp8   2^-4 |x| + 2^-10 s + 2^-150: half an ulp of a 3-bit mantissa is at most 2^-4 of the
 *         value in the normal range; in the E4M3 subnormal range (|x/s| < 2^-6) the step is
 *         2^-9 s, half of it 2^-10 s; 2^-150 is the float32 rounding of a decoded value that
 *         falls in float32's own subnormal range (only when s < 2^-117). The float32 and double
 *         rounding of x/s and of the decoded value stay below 2^-14 s, inside the 2^-10 s term in
 *         the normal range and inside 2^-4 |x| in the subnormal one.
 * Non-finite inputs: f32 and bf16 leave them out of the bound; for int8, int4 and fp8 (which
 * refuse them) and for invalid parameters the bound is NAN.
 */
#ifndef SEQFLOW_COMPRESS_QUANTIZE_H
#define SEQFLOW_COMPRESS_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SF_QUANT_F32 = 0,
    SF_QUANT_BF16 = 1,
    SF_QUANT_INT8 = 2,
    SF_QUANT_INT4 = 3,
    SF_QUANT_FP8_E4M3 = 4
} sf_quant_kind;

/* group: consecutive values sharing one float32 scale (group = row length gives per-row
 * scales). Must be >= 1 for every kind (f32 and bf16 ignore it) and even for int4, so that a
 * group starts on a byte. */
typedef struct {
    sf_quant_kind kind;
    int group;
} sf_quant_params;

/* "f32", "bf16", "int8", "int4", "fp8" (or "fp8_e4m3") to its kind; SF_E_INVAL naming the
 * text otherwise. */
int sf_quant_kind_parse(const char *text, sf_quant_kind *out);

/* Bytes of the encoding of n floats, scales included; 0 for invalid parameters or a size that
 * does not fit in size_t (and for n = 0). */
size_t sf_quant_encoded_size(const sf_quant_params *p, size_t n);

/* Encodes x[0..n) into out; out_size must be at least sf_quant_encoded_size(p, n).
 * SF_E_INVAL (with a message) for invalid parameters, a too-small out, or a non-finite value
 * for int8/int4/fp8. f32 and bf16 may encode in place (out == (uint8_t *)x): each value is
 * read before the bytes that hold it are written. */
int sf_quantize(const sf_quant_params *p, const float *x, size_t n, uint8_t *out, size_t out_size);

/* Decodes n floats; in_size must equal sf_quant_encoded_size(p, n) exactly (a mismatch means the
 * sender and receiver disagree). Rejects, with SF_E_INVAL, a scale that is negative or not
 * finite and an fp8 NaN code, which the encoder never writes; int8 -128 and int4 -8 decode to
 * q*scale like any other code. On error x may be partly written. */
int sf_dequantize(const sf_quant_params *p, const uint8_t *in, size_t in_size, float *x, size_t n);

/* The largest per-element absolute error bound (see above) over x[0..n) for these parameters:
 * every element of sf_dequantize(sf_quantize(x)) is within it. 0 for n = 0. */
double sf_quant_error_bound(const sf_quant_params *p, const float *x, size_t n);

/* Error feedback (SPEC 7): residual[i] carries what earlier messages failed to send. */
typedef struct sf_quant_feedback {
    float *residual;
    size_t n;
} sf_quant_feedback;

/* Zeroed residual of n floats. SF_E_INVAL for f == NULL, SF_E_NOMEM if allocation fails. */
int sf_quant_feedback_init(sf_quant_feedback *f, size_t n);
/* Frees the residual; NULL-safe and idempotent. */
void sf_quant_feedback_release(sf_quant_feedback *f);

/* Quantizes v = x + residual (float32 add) and sets residual = v - dequantized + (the rounding
 * error of that add, recovered exactly by TwoSum). v - dequantized is exact (Sterbenz: the
 * dequantized value is within a factor 2 of v, or 0), so the only float32 error left per message
 * is one rounding of the new residual, <= 2^-24 |residual|, unbiased; the receiver's running sum
 * of dequantized messages then differs from the exact sum of the x by the last residual, bounded
 * by sf_quant_error_bound(p, v, n), plus that accumulated rounding.
 * f->n must equal n. Refuses any non-finite x[i] + residual[i] for every kind (a NaN or Inf
 * cannot be carried in a residual), and for bf16 a value that would round to Inf; this check
 * runs before anything is written, so on error out and the residual are unchanged. */
int sf_quantize_with_feedback(const sf_quant_params *p, sf_quant_feedback *f, const float *x,
                              size_t n, uint8_t *out, size_t out_size);

#ifdef __cplusplus
}
#endif
#endif
