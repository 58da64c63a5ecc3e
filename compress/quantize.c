#include "compress/quantize.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/dtype.h"
#include "seqflow/error.h"

/* Bits of a float32 above which the magnitude is Inf or NaN (0x7F800000 and up). */
#define F32_MAX_FINITE_BITS 0x7F7FFFFFu
/* Smallest |x| bits that bf16 round-to-nearest-even sends to Inf (0x1.ffp127). */
#define BF16_OVERFLOW_BITS 0x7F7F8000u

static const char *kind_name(sf_quant_kind k)
{
    switch (k) {
    case SF_QUANT_F32: return "f32";
    case SF_QUANT_BF16: return "bf16";
    case SF_QUANT_INT8: return "int8";
    case SF_QUANT_INT4: return "int4";
    case SF_QUANT_FP8_E4M3: return "fp8_e4m3";
    }
    return "?";
}

int sf_quant_kind_parse(const char *text, sf_quant_kind *out)
{
    static const sf_quant_kind all[] = {SF_QUANT_F32, SF_QUANT_BF16, SF_QUANT_INT8, SF_QUANT_INT4,
                                        SF_QUANT_FP8_E4M3};
    for (size_t i = 0; text && out && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(text, kind_name(all[i])) == 0 || (all[i] == SF_QUANT_FP8_E4M3 && strcmp(text, "fp8") == 0)) {
            *out = all[i];
            return SF_OK;
        }
    return sf_error(SF_E_INVAL, "quantizer '%s' unknown (expected f32, bf16, int8, int4 or fp8)", text ? text : "(null)");
}

static int check_params(const sf_quant_params *p)
{
    if (!p) return sf_error(SF_E_INVAL, "quantize: NULL parameters");
    if ((unsigned)p->kind > (unsigned)SF_QUANT_FP8_E4M3)
        return sf_error(SF_E_INVAL, "quantize: unknown kind %d", (int)p->kind);
    if (p->group < 1)
        return sf_error(SF_E_INVAL, "quantize %s: group %d must be >= 1", kind_name(p->kind), p->group);
    if (p->kind == SF_QUANT_INT4 && (p->group & 1))
        return sf_error(SF_E_INVAL, "quantize int4: group %d must be even", p->group);
    return SF_OK;
}

static int qmax_of(sf_quant_kind k)
{
    return k == SF_QUANT_INT8 ? 127 : k == SF_QUANT_INT4 ? 7 : 448;
}

static size_t n_groups(size_t n, int group) { return n / (size_t)group + (n % (size_t)group != 0); }

/* Size without validating p; 0 on size_t overflow. */
static size_t encoded_size(const sf_quant_params *p, size_t n)
{
    size_t codes;
    switch (p->kind) {
    case SF_QUANT_F32: return n > SIZE_MAX / 4 ? 0 : 4 * n;
    case SF_QUANT_BF16: return n > SIZE_MAX / 2 ? 0 : 2 * n;
    case SF_QUANT_INT4: codes = n / 2 + (n & 1); break;
    default: codes = n; break;
    }
    size_t ng = n_groups(n, p->group);
    if (ng > SIZE_MAX / 4 || codes > SIZE_MAX - 4 * ng) return 0;
    return codes + 4 * ng;
}

size_t sf_quant_encoded_size(const sf_quant_params *p, size_t n)
{
    if (!p || (unsigned)p->kind > (unsigned)SF_QUANT_FP8_E4M3 || p->group < 1 ||
        (p->kind == SF_QUANT_INT4 && (p->group & 1)))
        return 0;
    return encoded_size(p, n);
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Byte shifts rather than memcpy keep the wire little-endian on any host. */
static void put_u32(uint8_t *b, uint32_t u)
{
    b[0] = (uint8_t)u;
    b[1] = (uint8_t)(u >> 8);
    b[2] = (uint8_t)(u >> 16);
    b[3] = (uint8_t)(u >> 24);
}

static uint32_t get_u32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Integer max of the magnitude bits: for non-negative floats integer order is float order,
 * and NaN/Inf land above F32_MAX_FINITE_BITS, so one vectorizable pass finds both. */
static uint32_t amax_bits(const float *x, size_t len)
{
    uint32_t m = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t a = f2u(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

static size_t first_nonfinite(const float *x, size_t len)
{
    size_t i = 0;
    while (i < len && isfinite(x[i])) i++;
    return i;
}

/* Rounded up when the division rounded down so that |x|/scale <= qmax holds exactly: no value
 * is ever clipped, and the clamp in encode only absorbs double rounding. */
static float group_scale(uint32_t amax, int qmax)
{
    if (amax == 0) return 0.0f;
    double a = (double)u2f(amax);
    float s = (float)(a / qmax);
    while ((double)s * qmax < a) s = nextafterf(s, INFINITY);
    return s;
}

static double inverse(float s) { return s > 0.0f ? 1.0 / (double)s : 0.0; }

static int enc_int(float x, double inv, int qmax)
{
    double r = nearbyint((double)x * inv);
    if (r > qmax) r = qmax;
    if (r < -qmax) r = -qmax;
    return (int)r;
}

/* OCP E4M3: rounds the float32 y = x/scale to nearest even with 3 mantissa bits. */
static uint8_t enc_fp8(float x, double inv)
{
    uint32_t b = f2u((float)((double)x * inv));
    uint32_t sign = (b >> 24) & 0x80u, a = b & 0x7FFFFFFFu, code;
    if (a >= 0x3C800000u) { /* |y| >= 2^-6, E4M3 normal range */
        uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
        code = (r >> 20) - ((127u - 7u) << 3); /* rebias; a mantissa carry bumps the exponent */
        if (code > 0x7Eu) code = 0x7Eu;        /* 448; 0x7F is NaN */
    } else {
        code = (uint32_t)nearbyintf(u2f(a) * 512.0f); /* multiples of 2^-9; 8 is 2^-6 = 0x08 */
    }
    return (uint8_t)(sign | code);
}

static float fp8_value(unsigned c)
{
    unsigned e = (c >> 3) & 15u, m = c & 7u;
    float v = e ? u2f(((e + 120u) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    return (c & 0x80u) ? -v : v;
}

/* q*s is exact in double (q has at most 9 significant bits); clamping to FLT_MAX can only move
 * the value towards the finite x it came from. */
static float dec(double q, float s)
{
    double v = q * (double)s;
    if (v > FLT_MAX) v = FLT_MAX;
    if (v < -FLT_MAX) v = -FLT_MAX;
    return (float)v;
}

static float bf2f(uint16_t h) { return u2f((uint32_t)h << 16); }

static int check_sizes(const sf_quant_params *p, const void *x, size_t n, const void *buf,
                       size_t buf_size, int exact, const char *what, size_t *need)
{
    *need = encoded_size(p, n);
    if (n && !*need)
        return sf_error(SF_E_INVAL, "%s %s: %zu values overflow size_t", what, kind_name(p->kind), n);
    if (n && !x) return sf_error(SF_E_INVAL, "%s %s: NULL values", what, kind_name(p->kind));
    if (*need && !buf) return sf_error(SF_E_INVAL, "%s %s: NULL buffer", what, kind_name(p->kind));
    if (exact ? buf_size != *need : buf_size < *need)
        return sf_error(SF_E_INVAL, "%s %s: buffer of %zu bytes, %zu values need %s%zu", what,
                        kind_name(p->kind), buf_size, n, exact ? "" : "at least ", *need);
    return SF_OK;
}

static void put_codes(sf_quant_kind k, uint8_t *codes, const float *x, size_t len, double inv)
{
    if (k == SF_QUANT_INT8) {
        for (size_t i = 0; i < len; i++) codes[i] = (uint8_t)(int8_t)enc_int(x[i], inv, 127);
    } else if (k == SF_QUANT_INT4) {
        for (size_t i = 0; i < len; i += 2) {
            int lo = enc_int(x[i], inv, 7), hi = i + 1 < len ? enc_int(x[i + 1], inv, 7) : 0;
            codes[i / 2] = (uint8_t)((lo & 15) | (hi & 15) << 4);
        }
    } else {
        for (size_t i = 0; i < len; i++) codes[i] = enc_fp8(x[i], inv);
    }
}

int sf_quantize(const sf_quant_params *p, const float *x, size_t n, uint8_t *out, size_t out_size)
{
    int rc = check_params(p);
    size_t need;
    if (rc) return rc;
    if ((rc = check_sizes(p, x, n, out, out_size, 0, "quantize", &need))) return rc;

    switch (p->kind) {
    case SF_QUANT_F32:
        for (size_t i = 0; i < n; i++) put_u32(out + 4 * i, f2u(x[i]));
        return SF_OK;
    case SF_QUANT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = sf_bf16_round(x[i]);
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return SF_OK;
    default: break;
    }

    size_t group = (size_t)p->group, ng = n_groups(n, p->group);
    int qmax = qmax_of(p->kind);
    uint8_t *codes = out + 4 * ng;
    for (size_t g = 0; g < ng; g++) {
        size_t start = g * group, len = n - start < group ? n - start : group;
        uint32_t am = amax_bits(x + start, len);
        if (am > F32_MAX_FINITE_BITS) {
            size_t i = start + first_nonfinite(x + start, len);
            return sf_error(SF_E_INVAL, "quantize %s: non-finite value %g at index %zu",
                            kind_name(p->kind), (double)x[i], i);
        }
        float s = group_scale(am, qmax);
        put_u32(out + 4 * g, f2u(s));
        uint8_t *c = p->kind == SF_QUANT_INT4 ? codes + start / 2 : codes + start;
        put_codes(p->kind, c, x + start, len, inverse(s));
    }
    return SF_OK;
}

int sf_dequantize(const sf_quant_params *p, const uint8_t *in, size_t in_size, float *x, size_t n)
{
    int rc = check_params(p);
    size_t need;
    if (rc) return rc;
    if ((rc = check_sizes(p, x, n, in, in_size, 1, "dequantize", &need))) return rc;

    switch (p->kind) {
    case SF_QUANT_F32:
        for (size_t i = 0; i < n; i++) x[i] = u2f(get_u32(in + 4 * i));
        return SF_OK;
    case SF_QUANT_BF16:
        for (size_t i = 0; i < n; i++) x[i] = bf2f((uint16_t)(in[2 * i] | in[2 * i + 1] << 8));
        return SF_OK;
    default: break;
    }

    size_t group = (size_t)p->group, ng = n_groups(n, p->group);
    const uint8_t *codes = in + 4 * ng;
    float table[256];
    if (p->kind == SF_QUANT_FP8_E4M3)
        for (unsigned c = 0; c < 256; c++) table[c] = fp8_value(c);
    for (size_t g = 0; g < ng; g++) {
        size_t start = g * group, len = n - start < group ? n - start : group;
        float s = u2f(get_u32(in + 4 * g));
        if (!(s >= 0.0f && s <= FLT_MAX))
            return sf_error(SF_E_INVAL, "dequantize %s: scale %g of group %zu is not a finite value >= 0",
                            kind_name(p->kind), (double)s, g);
        float *y = x + start;
        if (p->kind == SF_QUANT_INT8) {
            const uint8_t *c = codes + start;
            for (size_t i = 0; i < len; i++) y[i] = dec((double)(int8_t)c[i], s);
        } else if (p->kind == SF_QUANT_INT4) {
            const uint8_t *c = codes + start / 2;
            for (size_t i = 0; i < len; i++) {
                int nib = (c[i / 2] >> (4 * (i & 1))) & 15;
                y[i] = dec((double)((nib ^ 8) - 8), s);
            }
        } else {
            const uint8_t *c = codes + start;
            unsigned nan = 0; /* checked after the loop so that the loop has no early exit */
            for (size_t i = 0; i < len; i++) {
                nan |= (c[i] & 0x7Fu) == 0x7Fu;
                y[i] = dec((double)table[c[i]], s);
            }
            if (nan) {
                size_t i = 0;
                while ((c[i] & 0x7Fu) != 0x7Fu) i++;
                return sf_error(SF_E_INVAL, "dequantize fp8_e4m3: NaN code 0x%02x at index %zu",
                                c[i], start + i);
            }
        }
    }
    return SF_OK;
}

double sf_quant_error_bound(const sf_quant_params *p, const float *x, size_t n)
{
    if (!p || (unsigned)p->kind > (unsigned)SF_QUANT_FP8_E4M3 || p->group < 1 ||
        (p->kind == SF_QUANT_INT4 && (p->group & 1)) || (n && !x))
        return NAN;
    if (p->kind == SF_QUANT_F32) return 0.0;
    double bound = 0.0;
    if (p->kind == SF_QUANT_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint32_t a = f2u(x[i]) & 0x7FFFFFFFu;
            if (a > F32_MAX_FINITE_BITS) continue;
            if (a >= BF16_OVERFLOW_BITS) return INFINITY;
            double b = 0x1p-8 * fabs((double)x[i]) + 0x1p-134;
            if (b > bound) bound = b;
        }
        return bound;
    }
    size_t group = (size_t)p->group, ng = n_groups(n, p->group);
    int qmax = qmax_of(p->kind);
    for (size_t g = 0; g < ng; g++) {
        size_t start = g * group, len = n - start < group ? n - start : group;
        uint32_t am = amax_bits(x + start, len);
        if (am > F32_MAX_FINITE_BITS) return NAN;
        double s = (double)group_scale(am, qmax), b;
        if (p->kind == SF_QUANT_FP8_E4M3)
            b = 0x1p-4 * (double)u2f(am) + 0x1p-10 * s + 0x1p-150;
        else
            b = s * (0.5 + qmax * 0x1p-23);
        if (b > bound) bound = b;
    }
    return bound;
}

int sf_quant_feedback_init(sf_quant_feedback *f, size_t n)
{
    if (!f) return sf_error(SF_E_INVAL, "quantize feedback: NULL state");
    f->residual = NULL;
    f->n = 0;
    if (n > SIZE_MAX / sizeof(float)) return sf_error(SF_E_NOMEM, "quantize feedback: %zu values", n);
    f->residual = calloc(n ? n : 1, sizeof(float));
    if (!f->residual) return sf_error(SF_E_NOMEM, "quantize feedback: out of memory for %zu values", n);
    f->n = n;
    return SF_OK;
}

void sf_quant_feedback_release(sf_quant_feedback *f)
{
    if (!f) return;
    free(f->residual);
    f->residual = NULL;
    f->n = 0;
}

/* The exact rounding error of s = a + b (Knuth's TwoSum; no magnitude ordering needed). */
static float two_sum_err(float a, float b, float s)
{
    float bb = s - a;
    return (a - (s - bb)) + (b - bb);
}

int sf_quantize_with_feedback(const sf_quant_params *p, sf_quant_feedback *f, const float *x,
                              size_t n, uint8_t *out, size_t out_size)
{
    int rc = check_params(p);
    size_t need;
    if (rc) return rc;
    if (!f || (n && !f->residual)) return sf_error(SF_E_INVAL, "quantize feedback: no state");
    if (f->n != n)
        return sf_error(SF_E_INVAL, "quantize feedback: state holds %zu values, message has %zu", f->n, n);
    if ((rc = check_sizes(p, x, n, out, out_size, 0, "quantize", &need))) return rc;
    float *r = f->residual;

    /* All checks before any write, so that a refused message leaves the residual intact. */
    uint32_t limit = p->kind == SF_QUANT_BF16 ? BF16_OVERFLOW_BITS - 1 : F32_MAX_FINITE_BITS;
    for (size_t i = 0; i < n; i++) {
        float v = x[i] + r[i];
        if ((f2u(v) & 0x7FFFFFFFu) > limit)
            return sf_error(SF_E_INVAL, "quantize %s with feedback: x[%zu] + residual = %g %s",
                            kind_name(p->kind), i, (double)v,
                            isfinite(v) ? "overflows bf16" : "is not finite");
    }

    if (p->kind == SF_QUANT_F32 || p->kind == SF_QUANT_BF16) {
        for (size_t i = 0; i < n; i++) {
            float v = x[i] + r[i], e = two_sum_err(x[i], r[i], v), d;
            if (p->kind == SF_QUANT_F32) {
                put_u32(out + 4 * i, f2u(v));
                d = v;
            } else {
                uint16_t h = sf_bf16_round(v);
                out[2 * i] = (uint8_t)h;
                out[2 * i + 1] = (uint8_t)(h >> 8);
                d = bf2f(h);
            }
            r[i] = (v - d) + e;
        }
        return SF_OK;
    }

    size_t group = (size_t)p->group, ng = n_groups(n, p->group);
    int qmax = qmax_of(p->kind);
    uint8_t *codes = out + 4 * ng;
    for (size_t g = 0; g < ng; g++) {
        size_t start = g * group, len = n - start < group ? n - start : group;
        uint32_t am = 0;
        for (size_t i = start; i < start + len; i++) {
            uint32_t a = f2u(x[i] + r[i]) & 0x7FFFFFFFu;
            am = a > am ? a : am;
        }
        float s = group_scale(am, qmax);
        double inv = inverse(s);
        put_u32(out + 4 * g, f2u(s));
        for (size_t i = start; i < start + len; i++) {
            float v = x[i] + r[i], e = two_sum_err(x[i], r[i], v), d;
            if (p->kind == SF_QUANT_INT8) {
                int q = enc_int(v, inv, 127);
                codes[i] = (uint8_t)(int8_t)q;
                d = dec((double)q, s);
            } else if (p->kind == SF_QUANT_INT4) {
                int q = enc_int(v, inv, 7);
                uint8_t *c = codes + start / 2 + (i - start) / 2;
                if (((i - start) & 1) == 0)
                    *c = (uint8_t)(q & 15); /* also zeroes the pad nibble of an odd tail */
                else
                    *c = (uint8_t)(*c | (q & 15) << 4);
                d = dec((double)q, s);
            } else {
                uint8_t c = enc_fp8(v, inv);
                codes[i] = c;
                d = dec((double)fp8_value(c), s);
            }
            /* v - d is exact (Sterbenz: d is 0 or within a factor 2 of v); adding e puts back
             * what the float32 add x + r lost, leaving one rounding per message. */
            r[i] = (v - d) + e;
        }
    }
    return SF_OK;
}
