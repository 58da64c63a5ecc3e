/* Checks the CUDA compressive-memory ops (memory_mix, memory_update linear and delta) against
 * the CPU twin kernels/cpu/compressive_memory.c on fresh random inputs of several shapes, with q, k, v as
 * float32 and as bf16 (the CPU then gets the same values, rounded to bf16, as float32), then times
 * them at the reference shape (n=8192 rows, H=16 heads, d=64, ld=1024): median of many runs with
 * CUDA events after warm-up, against the bytes floor (each input row read once, a written once)
 * at 3.0 TB/s, twice each, with the tiled kernels' products on FP32 FMAs ("fma") and on the
 * tensor cores ("mma", 3xTF32), for float32 and bf16 inputs; and, for bf16 inputs, in precision
 * bf16 as the H100 pipeline runs: the tiled kernels with bf16 operands ("fma16", "mma16") and the
 * default choice ("dflt": the stream kernels for d = 64). (Earlier versions' numbers are in
 * bench/lab/MEMORY_NOTES.md.) The update's scratch is filled with NaN before each checked
 * call, so partials it fails to write show up as NaN; the delta update runs twice on the same
 * inputs and must give the same bits. Exit status 1 when any check fails.
 * Usage: bench_cuda_compressive_memory [reps] (0: the checks alone) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "kernels/backend_ext.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/compressive_memory_general.h"
#include "bench/cuda_check.h"
#include "seqflow/seqflow.h"

#define SF_OK_OR_DIE(x)                                                                             \
    do {                                                                                            \
        int rc_ = (x);                                                                              \
        if (rc_ != SF_OK) {                                                                         \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, sf_last_error());             \
            exit(2);                                                                                \
        }                                                                                           \
    } while (0)

#define TOL 1e-4
#define FLOOR_TBS 3.0

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static double uniform01(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static void fill_normal(std::vector<float> &x, double scale)
{
    for (size_t i = 0; i < x.size(); i++)
        x[i] = (float)(scale * sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}
static void fill_uniform(std::vector<float> &x, double lo, double hi)
{
    for (size_t i = 0; i < x.size(); i++) x[i] = (float)(lo + (hi - lo) * uniform01());
}

static double rel_err(const std::vector<float> &got, const std::vector<float> &want)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double d = (double)got[i] - want[i];
        num += d * d, den += (double)want[i] * want[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0); /* NaN in got stays NaN */
}

static float *upload(const std::vector<float> &h)
{
    float *d;
    CUDA_OK(cudaMalloc(&d, h.size() * sizeof(float) + 16));
    CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
/* x rounded to bf16 (to nearest, ties to even; x finite): its bits, and x replaced by their value */
static std::vector<uint16_t> round_to_bf16(std::vector<float> &x)
{
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u += 0x7fffu + ((u >> 16) & 1);
        bits[i] = (uint16_t)(u >> 16);
        u = (uint32_t)bits[i] << 16;
        memcpy(&x[i], &u, 4);
    }
    return bits;
}
/* q, k or v on the device as `type` (bf16 rounds x in place first) */
static void *upload_as(sf_dtype type, std::vector<float> &x)
{
    if (type == SF_DTYPE_F32) return upload(x);
    const std::vector<uint16_t> bits = round_to_bf16(x);
    void *d;
    CUDA_OK(cudaMalloc(&d, bits.size() * 2 + 16));
    CUDA_OK(cudaMemcpy(d, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    return d;
}
/* element `offset` of a device buffer of type */
static const void *at(const void *d, sf_dtype type, size_t offset)
{
    return (const char *)d + offset * (type == SF_DTYPE_BF16 ? 2 : 4);
}
static std::vector<float> download(const float *d, size_t count)
{
    std::vector<float> h(count);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

/* The tiled kernels with their products on FP32 FMAs and on the tensor cores (3xTF32), each on a
 * backend of its own created with the setting memory=fma or memory=mma (d = 128 and the general
 * head sizes run the same kernels under both names); then, for bf16 q/k/v only, a backend in precision bf16 as the
 * H100 pipeline runs it: the tiled kernels with bf16 operands ("fma16", "mma16") and the default
 * choice ("dflt": the stream kernels of memory_stream*.cuh for d = 64), the mix writing bf16 into
 * the output product's input (memory_mix_to). */
struct impl {
    const char *name;
    const char *settings; /* the backend's settings (NULL: the default choice) */
    bool bf16;            /* precision bf16, bf16 inputs only, the mix into a bf16 out */
};
static const impl impls[] = {{"fma", "memory=fma", false},
                             {"mma", "memory=mma", false},
                             {"fma16", "memory=fma", true},
                             {"mma16", "memory=mma", true},
                             {"dflt", NULL, true}};
#define N_IMPLS (int)(sizeof impls / sizeof impls[0])
#define TOL_BF16 4e-3 /* test_backend_ops's for bf16 products and a bf16 mix output */

static sf_backend *cpu, *backends[N_IMPLS]; /* one a row of impls */
static int failures;

static sf_backend *backend_of(const impl &im) { return backends[&im - impls]; }

static void poison_scratch(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (c->scratch) CUDA_OK(cudaMemsetAsync(c->scratch, 0xff, c->scratch_bytes, c->stream)); /* NaN floats and doubles */
}

/* the mix of one implementation: in place into a, or (bf16) into out16 */
static int run_mix(const impl &im, int n, int H, int d, int ld, sf_dtype type, const void *q, const float *M,
                   const float *z, const float *g, float *a, uint16_t *out16)
{
    if (!im.bf16) return sf_cuda_memory_mix(backend_of(im), n, H, d, ld, type, q, M, z, g, a);
    return sf_cuda_memory_mix_to(backend_of(im), n, H, d, ld, type, q, M, z, g, a, SF_DTYPE_BF16, out16);
}

static const char *type_name(sf_dtype type) { return type == SF_DTYPE_BF16 ? "bf16" : "f32"; }

static void report(const char *impl_name, sf_dtype type, const char *what, int n, int H, int d, int ld, double err,
                   double tol = TOL)
{
    const bool ok = err <= tol; /* NaN fails */
    printf("  %-5s %-4s %-22s n=%5d H=%2d d=%3d ld=%4d  rel err %.3e  %s\n", impl_name, type_name(type), what, n, H,
           d, ld, err, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

/* One shape and input type: the CPU twin once, then every implementation on the same inputs. */
static void check_shape_as(sf_dtype type, int n, int H, int d, int ld, int ld_offset)
{
    const size_t rows = (size_t)n * ld + ld_offset, hdd = (size_t)H * d * d, hd = (size_t)H * d;
    std::vector<float> q(rows), k(rows), v(rows), a(rows), M(hdd), z(hd), g(H);
    fill_normal(q, 1), fill_normal(k, 1), fill_normal(v, 1), fill_normal(a, 1);
    /* a memory that has seen a few segments: z positive and large, M of matching scale */
    fill_normal(M, 3), fill_uniform(z, 20, 60), fill_normal(g, 1);
    /* (bf16: q, k, v rounded here, before the CPU twin reads them) */
    void *dq = upload_as(type, q), *dk = upload_as(type, k), *dv = upload_as(type, v);
    const float *cq = q.data() + ld_offset, *ck = k.data() + ld_offset, *cv = v.data() + ld_offset;
    std::vector<float> want_a = a;
    SF_OK_OR_DIE(cpu->ops->memory_mix(cpu, n, H, d, ld, SF_DTYPE_F32, cq, M.data(), z.data(), g.data(),
                                      want_a.data() + ld_offset));
    std::vector<float> want_M[2] = {M, M}, want_z[2] = {z, z};
    for (int kind = 0; kind < 2; kind++)
        SF_OK_OR_DIE(cpu->ops->memory_update(cpu, kind ? SF_MEMORY_DELTA : SF_MEMORY_LINEAR, n, H, d, ld, SF_DTYPE_F32,
                                             ck, cv, want_M[kind].data(), want_z[kind].data()));
    float *dg = upload(g), *dM = upload(M), *dz = upload(z);
    for (const impl &im : impls) {
        if (im.bf16 && type != SF_DTYPE_BF16) continue;
        sf_backend *be = backend_of(im);
        const double tol = im.bf16 ? TOL_BF16 : TOL;
        float *da = upload(a);
        uint16_t *out16;
        CUDA_OK(cudaMalloc(&out16, rows * 2 + 16));
        CUDA_OK(cudaMemset(out16, 0xff, rows * 2)); /* NaN: rows the mix leaves out fail */
        poison_scratch(be);
        SF_OK_OR_DIE(run_mix(im, n, H, d, ld, type, at(dq, type, ld_offset), dM, dz, dg, da + ld_offset,
                             out16 + ld_offset));
        std::vector<float> got_a = download(da, rows);
        if (im.bf16) { /* out16 widened; the padding between rows is not the op's to write */
            std::vector<uint16_t> bits(rows);
            CUDA_OK(cudaMemcpy(bits.data(), out16, rows * 2, cudaMemcpyDeviceToHost));
            for (size_t i = ld_offset; i < rows; i++)
                if ((i - ld_offset) % ld < (size_t)H * d) {
                    const uint32_t u = (uint32_t)bits[i] << 16;
                    memcpy(&got_a[i], &u, 4);
                }
        }
        report(im.name, type, "memory_mix", n, H, d, ld, rel_err(got_a, want_a), tol);
        CUDA_OK(cudaFree(da));
        CUDA_OK(cudaFree(out16));
        for (int kind = 0; kind < 2; kind++) {
            const sf_memory_kind mk = kind ? SF_MEMORY_DELTA : SF_MEMORY_LINEAR;
            std::vector<float> first_M, first_z;
            for (int rep = 0; rep < 2; rep++) { /* twice on the same inputs: the same bits */
                float *uM = upload(M), *uz = upload(z);
                poison_scratch(be);
                SF_OK_OR_DIE(sf_cuda_memory_update(be, mk, n, H, d, ld, type, at(dk, type, ld_offset),
                                                   at(dv, type, ld_offset), uM, uz));
                std::vector<float> got_M = download(uM, hdd), got_z = download(uz, hd);
                CUDA_OK(cudaFree(uM));
                CUDA_OK(cudaFree(uz));
                if (rep == 0) {
                    report(im.name, type, kind ? "memory_update delta: M" : "memory_update linear: M", n, H, d, ld,
                           rel_err(got_M, want_M[kind]), tol);
                    report(im.name, type, kind ? "memory_update delta: z" : "memory_update linear: z", n, H, d, ld,
                           rel_err(got_z, want_z[kind]), tol);
                    first_M = got_M, first_z = got_z;
                } else if (memcmp(first_M.data(), got_M.data(), hdd * 4) || memcmp(first_z.data(), got_z.data(), hd * 4)) {
                    printf("  %-5s %-4s memory_update %s n=%d H=%d d=%d: two runs differ  FAIL\n", im.name,
                           type_name(type), kind ? "delta" : "linear", n, H, d);
                    failures++;
                }
            }
        }
    }
    for (void *p : {(void *)dg, (void *)dM, (void *)dz, dq, dk, dv}) CUDA_OK(cudaFree(p));
}

static void check_shape(int n, int H, int d, int ld, int ld_offset)
{
    check_shape_as(SF_DTYPE_F32, n, H, d, ld, ld_offset);
    check_shape_as(SF_DTYPE_BF16, n, H, d, ld, ld_offset);
}

static double median(std::vector<float> t)
{
    std::sort(t.begin(), t.end());
    return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

/* Times op (0 mix, 1 linear, 2 delta) of one implementation with q/k (x) and v (y) of `type`:
 * `sets` input sets in rotation (more than L2 holds), M and z restored before each run outside
 * the timed region. */
static void time_op(const impl &im, int op, sf_dtype type, int reps, int n, int H, int d, int sets, void *const *x,
                    void *const *y, float *const *a, const float *M0, const float *z0, float *M, float *z,
                    const float *gate, uint16_t *out16)
{
    sf_cuda *c = sf_cuda_of(backend_of(im));
    const int ld = H * d, warm = 5;
    const size_t mbytes = (size_t)H * d * d * 4, zbytes = (size_t)H * d * 4;
    std::vector<cudaEvent_t> ev(2 * (size_t)reps);
    for (cudaEvent_t &e : ev) CUDA_OK(cudaEventCreate(&e));
    for (int r = -warm; r < reps; r++) {
        const int s = (r + warm) % sets;
        if (op) {
            CUDA_OK(cudaMemcpyAsync(M, M0, mbytes, cudaMemcpyDeviceToDevice, c->stream));
            CUDA_OK(cudaMemcpyAsync(z, z0, zbytes, cudaMemcpyDeviceToDevice, c->stream));
        }
        if (r >= 0) CUDA_OK(cudaEventRecord(ev[2 * r], c->stream));
        if (op == 0)
            SF_OK_OR_DIE(run_mix(im, n, H, d, ld, type, x[s], M0, z0, gate, a[s], out16));
        else
            SF_OK_OR_DIE(sf_cuda_memory_update(backend_of(im), op == 2 ? SF_MEMORY_DELTA : SF_MEMORY_LINEAR, n, H,
                                               d, ld, type, x[s], y[s], M, z));
        if (r >= 0) CUDA_OK(cudaEventRecord(ev[2 * r + 1], c->stream));
    }
    CUDA_OK(cudaStreamSynchronize(c->stream));
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; r++) CUDA_OK(cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]));
    for (cudaEvent_t &e : ev) CUDA_OK(cudaEventDestroy(e));
    const double med = median(ms), lo = *std::min_element(ms.begin(), ms.end());
    /* mix: q read, a read and written (bf16 impls: into a bf16 out); update: k and v read */
    const double elems = (double)n * ld, in_bytes = type == SF_DTYPE_BF16 ? 2 : 4;
    const double bytes = op == 0 ? elems * (in_bytes + (im.bf16 ? 6 : 8)) : 2 * elems * in_bytes;
    const double flops = (op == 2 ? 4.0 : 2.0) * n * H * (double)d * d;
    const double gbs = bytes / (med * 1e-3) / 1e9;
    printf("| %-13s | %-4s | %-5s | %8.4f | %8.4f | %7.1f | %5.1f%% | %7.4f | %6.1f |\n",
           op == 0 ? "memory_mix" : op == 1 ? "update linear" : "update delta", type_name(type), im.name, med, lo,
           gbs, 100 * gbs / (FLOOR_TBS * 1000), bytes / (FLOOR_TBS * 1e12) * 1e3, flops / (med * 1e-3) / 1e12);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    SF_OK_OR_DIE(sf_backend_create("cpu", 0, &cpu));
    const int n = 8192, H = 16, d = 64, ld = H * d, sets = 3;
    for (int i = 0; i < N_IMPLS; i++) {
        sf_backend_options opts = {};
        opts.precision = impls[i].bf16 ? SF_PRECISION_BF16 : SF_PRECISION_F32;
        opts.settings = impls[i].settings;
        SF_OK_OR_DIE(sf_backend_create_opts("cuda", &opts, &backends[i]));
        /* as the pipeline does: reserve sizes the scratch for the reference shape */
        SF_OK_OR_DIE(sf_be_reserve(backends[i], n, ld, H, d));
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    printf("checks against the CPU twin (tolerance %.0e):\n", TOL);
    check_shape(n, H, d, ld, 0);          /* the reference shape */
    check_shape(256, 4, 64, 260, 0);      /* test_backend_ops's d=64 shape */
    check_shape(5000, 16, 64, 1028, 0);   /* d=64 chunks of several tiles, the last ones partial */
    check_shape(1000, 5, 64, 324, 0);
    check_shape(1, 3, 64, 196, 0);
    check_shape(1000, 3, 128, 388, 0);
    check_shape(77, 5, 32, 164, 0);
    check_shape(3000, 32, 32, 1024, 0);
    check_shape(300, 4, 48, 196, 0);      /* a general head size */
    check_shape(100, 2, 64, 129, 0);      /* rows not 16-byte aligned: the general kernels */
    check_shape(100, 2, 64, 128, 1);      /* base not 16-byte aligned: the general kernels */
    /* ld % 8 == 0: the tiled kernels for bf16 too (the odd multiples of 4 above take the general) */
    check_shape(5000, 16, 64, 1032, 0);
    check_shape(1000, 3, 128, 392, 0);
    check_shape(77, 5, 32, 168, 0);
    check_shape(1, 3, 64, 200, 0);
    check_shape(100, 2, 64, 128, 4);      /* bf16 base 8 bytes off 16: the general kernels */

    if (reps <= 0) { /* checks only (e.g. under a profiler) */
        for (sf_backend *be : backends) sf_backend_free(be);
        sf_backend_free(cpu);
        printf("\nbench_cuda_compressive_memory: %s (%d failed checks)\n", failures ? "FAILED" : "all checks passed", failures);
        return failures ? 1 : 0;
    }
    /* timing: `sets` input sets of q/k (x), v (y) (32 MiB each, 16 as bf16) and a (32 MiB) */
    std::vector<float> h((size_t)n * ld), M0h((size_t)H * d * d), z0h((size_t)H * d), gh(H);
    void *x[2][sets], *y[2][sets];
    float *a[sets];
    for (int s = 0; s < sets; s++) {
        for (int t = 0; t < 2; t++) {
            fill_normal(h, 1), x[t][s] = upload_as(t ? SF_DTYPE_BF16 : SF_DTYPE_F32, h);
            fill_normal(h, 1), y[t][s] = upload_as(t ? SF_DTYPE_BF16 : SF_DTYPE_F32, h);
        }
        fill_normal(h, 1), a[s] = upload(h);
    }
    fill_normal(M0h, 3), fill_uniform(z0h, 20, 60), fill_normal(gh, 1);
    float *M0 = upload(M0h), *z0 = upload(z0h), *M = upload(M0h), *z = upload(z0h), *gate = upload(gh);
    uint16_t *out16;
    CUDA_OK(cudaMalloc(&out16, (size_t)n * ld * 2));
    printf("\ntimes at n=%d H=%d d=%d ld=%d, median of %d after 5 warm-up, %d input sets in rotation\n", n, H, d, ld,
           reps, sets);
    printf("| op            | q/k/v | ver   | median ms | min ms | GB/s | of %.1f TB/s | floor ms | TFLOP/s |\n",
           FLOOR_TBS);
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    /* two rounds: the spread between a version's two rows is the noise a difference must exceed */
    for (int op = 0; op < 3; op++)
        for (int t = 0; t < 2; t++)
            for (int round = 0; round < 2; round++)
                for (const impl &im : impls)
                    if (t || !im.bf16)
                        time_op(im, op, t ? SF_DTYPE_BF16 : SF_DTYPE_F32, reps, n, H, d, sets, x[t], y[t], a, M0, z0,
                                M, z, gate, out16);
    for (int s = 0; s < sets; s++) {
        for (int t = 0; t < 2; t++) {
            CUDA_OK(cudaFree(x[t][s]));
            CUDA_OK(cudaFree(y[t][s]));
        }
        CUDA_OK(cudaFree(a[s]));
    }
    for (float *p : {M0, z0, M, z, gate}) CUDA_OK(cudaFree(p));
    CUDA_OK(cudaFree(out16));
    for (sf_backend *be : backends) sf_backend_free(be);
    sf_backend_free(cpu);
    printf("\nbench_cuda_compressive_memory: %s (%d failed checks)\n", failures ? "FAILED" : "all checks passed", failures);
    return failures ? 1 : 0;
}
