/* Dilated local attention, flash-style (SPEC 3 and 5).
 *
 * For head h, branch (w, r) with offset o = h mod r, the active rows of one window are
 * o, o+r, o+2r, ... : gathered into contiguous [m, d] blocks they form an ordinary dense
 * (causal) attention problem, because position order equals gathered order. Each is solved
 * tile by tile: S = Q_t K_t^T on sgemm, an online softmax over key tiles, O += P V_t on sgemm,
 * so no n x n or w x w matrix ever exists. Every (branch, window, query tile) leaves a partial
 * result (O unnormalized, running max m, sum l) that is merged into per-position accumulators
 * by their log-sum-exp; the global tokens are one more part. Merging partial softmaxes this way
 * is exactly softmax over the union of the keys (a key reached twice counts twice).
 * The softmax rows and the merges run on AVX2 + FMA where the CPU has them (vector_rows.h).
 * Heads run in parallel; each thread owns its head's accumulators and scratch:
 * O(TILE_Q * TILE_K + n * d) floats per thread. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_parts.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_rows.h"
#include "seqflow/error.h"

/* Query and key tile sizes: the score tile is TILE_Q x TILE_K floats. */
#ifndef TILE_Q
#define TILE_Q 64
#endif
#ifndef TILE_K
#define TILE_K 128
#endif

typedef struct head_work {
    /* per-position accumulators of this head */
    float *acc;  /* [n, d] */
    float *m, *l; /* [n] */
    /* gathered rows of one window and tile scratch */
    float *q, *k, *v;   /* [rows, d] */
    float *s;           /* [TILE_Q, TILE_K] */
    float *o;           /* [TILE_Q, d] */
    float *tm, *tl;     /* [TILE_Q] */
    int *pos;           /* [rows] position of each gathered row */
} head_work;

static void gather(const float *src, int ld, const int *pos, int rows, int d, float *dst)
{
    for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * d, src + (size_t)pos[i] * ld, (size_t)d * sizeof *dst);
}

static int all_finite(const float *x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
}

/* o[a] += sum over b < limit(a) of p[a][b] v[b], where limit(a) = first + a + 1 keys are visible
 * to row a. The tile product multiplies the masked keys' values by p = 0, and 0 times NaN or
 * infinity is NaN: a non-finite value at a later position would leak into earlier rows. Only
 * a diagonal tile whose values are not all finite takes this path, so finite inputs keep the
 * sgemm's exact sums. */
static void masked_pv(const float *p, int tq, int tk, const float *v, int d, int first, float *o)
{
    for (int a = 0; a < tq; a++) {
        int limit = first + a + 1 < tk ? first + a + 1 : tk;
        const float *prow = p + (size_t)a * TILE_K;
        float *orow = o + (size_t)a * d;
        for (int b = 0; b < limit; b++)
            for (int e = 0; e < d; e++) orow[e] += prow[b] * v[(size_t)b * d + e];
    }
}

/* Dense attention of rows q[0..nq) against keys k/v[0..nk). When `causal`, query a sees the keys
 * b <= a + q_offset (q_offset: position of the first query in key order); key tiles past a query
 * tile's last query are skipped, and only tiles crossing the diagonal are masked. Each query
 * tile's partial result is merged into the head's accumulators at positions pos[]. */
SF_CPU_DISPATCH static void attend_block(head_work *w, const float *q, int nq, const float *k, const float *v, int nk, int d,
                                         float scale, int causal, int q_offset, const int *pos)
{
    for (int q0 = 0; q0 < nq; q0 += TILE_Q) {
        int tq = nq - q0 < TILE_Q ? nq - q0 : TILE_Q;
        for (int a = 0; a < tq; a++) w->tm[a] = -INFINITY, w->tl[a] = 0;
        memset(w->o, 0, (size_t)tq * d * sizeof *w->o);
        int k_end = causal ? q_offset + q0 + tq : nk; /* keys past the last query are masked */
        if (k_end > nk) k_end = nk;
        for (int k0 = 0; k0 < k_end; k0 += TILE_K) {
            int tk = k_end - k0 < TILE_K ? k_end - k0 : TILE_K;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, tk, d, scale, q + (size_t)q0 * d, d,
                        k + (size_t)k0 * d, d, 0.0f, w->s, TILE_K);
            int diagonal = causal && k0 + tk - 1 > q_offset + q0;
            /* row a sees keys < q_offset + q0 + a - k0 + 1 of the tile on the diagonal, all off it */
            sf_cpu_softmax_tile(w->s, TILE_K, tq, tk, diagonal ? q_offset + q0 - k0 : tk, w->tm, w->tl, w->o, d);
            const float *vt = v + (size_t)k0 * d;
            if (diagonal && !all_finite(vt, (size_t)tk * d))
                masked_pv(w->s, tq, tk, vt, d, q_offset + q0 - k0, w->o);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, d, tk, 1.0f, w->s, TILE_K, vt, d, 1.0f,
                            w->o, d);
        }
        sf_cpu_merge_tile(tq, d, pos + q0, w->o, w->tm, w->tl, w->acc, w->m, w->l);
    }
}

static int head_work_alloc(head_work *w, int n, int d)
{
    memset(w, 0, sizeof *w);
    size_t nd = (size_t)n * d;
    w->acc = malloc(nd * sizeof(float));
    w->m = malloc((size_t)n * sizeof(float));
    w->l = malloc((size_t)n * sizeof(float));
    w->q = malloc(nd * sizeof(float));
    w->k = malloc(nd * sizeof(float));
    w->v = malloc(nd * sizeof(float));
    w->s = malloc((size_t)TILE_Q * TILE_K * sizeof(float));
    w->o = malloc((size_t)TILE_Q * d * sizeof(float));
    w->tm = malloc(TILE_Q * sizeof(float));
    w->tl = malloc(TILE_Q * sizeof(float));
    w->pos = malloc((size_t)n * sizeof(int));
    return w->acc && w->m && w->l && w->q && w->k && w->v && w->s && w->o && w->tm && w->tl && w->pos;
}

static void head_work_free(head_work *w)
{
    free(w->acc), free(w->m), free(w->l), free(w->q), free(w->k), free(w->v);
    free(w->s), free(w->o), free(w->tm), free(w->tl), free(w->pos);
}

/* Head h's branches (SPEC 3) into w's accumulators, from scratch. */
SF_CPU_DISPATCH static void attend_branches(head_work *w, const sf_attention_desc *dd, int h, const float *q,
                                            const float *k, const float *v)
{
    const int n = dd->n, d = dd->head_dim, ld = dd->ld;
    const float *qh = q + (size_t)h * d, *kh = k + (size_t)h * d, *vh = v + (size_t)h * d;
    for (int i = 0; i < n; i++) w->m[i] = -INFINITY, w->l[i] = 0;
    for (int b = 0; b < dd->n_branches; b++) {
        const int win = dd->branches[b].window, r = dd->branches[b].dilation, o = (dd->head_offset + h) % r;
        for (int start = 0; start < n; start += win) {
            int rows = 0;
            for (int i = start + o; i < start + win && i < n; i += r) w->pos[rows++] = i;
            if (!rows) continue;
            gather(qh, ld, w->pos, rows, d, w->q);
            gather(kh, ld, w->pos, rows, d, w->k);
            gather(vh, ld, w->pos, rows, d, w->v);
            attend_block(w, w->q, rows, w->k, w->v, rows, d, dd->scale, dd->causal, 0, w->pos);
        }
    }
}

/* Head h's global tokens (SPEC 5) merged into w's accumulators, then A_dot into out. */
SF_CPU_DISPATCH static void attend_global_and_finish(head_work *w, const sf_attention_desc *dd, int h,
                                                     const float *q, float *out)
{
    const int n = dd->n, d = dd->head_dim, ld = dd->ld;
    const float *qh = q + (size_t)h * d;
    if (dd->n_global > 0) {
        for (int i = 0; i < n; i++) w->pos[i] = i;
        gather(qh, ld, w->pos, n, d, w->q);
        int g = dd->n_global;
        for (int j = 0; j < g; j++) {
            memcpy(w->k + (size_t)j * d, dd->gk + (size_t)j * dd->global_ld + (size_t)h * d, (size_t)d * sizeof(float));
            memcpy(w->v + (size_t)j * d, dd->gv + (size_t)j * dd->global_ld + (size_t)h * d, (size_t)d * sizeof(float));
        }
        attend_block(w, w->q, n, w->k, w->v, g, d, dd->scale, 0, 0, w->pos);
    }
    for (int i = 0; i < n; i++) {
        float *dst = out + (size_t)i * ld + (size_t)h * d;
        if (w->l[i] == 0) {
            memset(dst, 0, (size_t)d * sizeof *dst);
            continue;
        }
        float inv = 1.0f / w->l[i];
        const float *acc = w->acc + (size_t)i * d;
        for (int e = 0; e < d; e++) dst[e] = acc[e] * inv;
    }
}

/* Head h's accumulators between the two halves: acc [n][ld] at column h*d (an unnormalized
 * output, laid out as out), ml [heads][2][n] (the running max, then the sum). */
static void part_store(const head_work *w, const sf_attention_desc *dd, int h, float *acc, float *ml)
{
    const int n = dd->n, d = dd->head_dim;
    for (int i = 0; i < n; i++) memcpy(acc + (size_t)i * dd->ld + (size_t)h * d, w->acc + (size_t)i * d, (size_t)d * sizeof *acc);
    memcpy(ml + (size_t)h * 2 * n, w->m, (size_t)n * sizeof *ml);
    memcpy(ml + ((size_t)h * 2 + 1) * n, w->l, (size_t)n * sizeof *ml);
}

static void part_load(head_work *w, const sf_attention_desc *dd, int h, const float *acc, const float *ml)
{
    const int n = dd->n, d = dd->head_dim;
    for (int i = 0; i < n; i++) memcpy(w->acc + (size_t)i * d, acc + (size_t)i * dd->ld + (size_t)h * d, (size_t)d * sizeof *acc);
    memcpy(w->m, ml + (size_t)h * 2 * n, (size_t)n * sizeof *ml);
    memcpy(w->l, ml + ((size_t)h * 2 + 1) * n, (size_t)n * sizeof *ml);
}

enum { WHOLE, LOCAL, FINISH };

/* The heads in parallel, each thread with its own scratch: the whole attention, its local half
 * (acc, ml written) or its finishing half (acc, ml read). */
static int attention_heads(sf_backend *be, const sf_attention_desc *dd, const float *q, const float *k, const float *v,
                           float *out, int what, float *acc, float *ml)
{
    if (dd->n <= 0) return SF_OK;
    /* the gathered K/V blocks also hold the global tokens */
    int rows = dd->n > dd->n_global ? dd->n : dd->n_global;
    int threads = sf_cpu_threads(be);
    if (threads > dd->heads) threads = dd->heads;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        head_work w;
        int ok = head_work_alloc(&w, rows, dd->head_dim);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int h = 0; h < dd->heads; h++) {
            if (!ok) continue;
            if (what != FINISH) attend_branches(&w, dd, h, q, k, v);
            if (what == LOCAL) part_store(&w, dd, h, acc, ml);
            if (what == FINISH) part_load(&w, dd, h, acc, ml);
            if (what != LOCAL) attend_global_and_finish(&w, dd, h, q, out);
        }
        head_work_free(&w);
    }
    return failed ? sf_error(SF_E_NOMEM, "out of memory in attention") : SF_OK;
}

int sf_cpu_attention(sf_backend *be, const sf_attention_desc *dd, const float *q, const float *k, const float *v,
                     float *out)
{
    return attention_heads(be, dd, q, k, v, out, WHOLE, NULL, NULL);
}

static int cpu_f32(const sf_backend *be, const sf_attention_desc *dd, const char *op)
{
    if (!be || !be->ops || strcmp(be->ops->name, "cpu") != 0)
        return sf_error(SF_E_UNSUPPORTED, "%s: the cpu backend only (not %s)", op, be && be->ops ? be->ops->name : "none");
    if (dd->qkv_type != SF_DTYPE_F32)
        return sf_error(SF_E_UNSUPPORTED, "%s: float32 q, k, v only (not type %d)", op, (int)dd->qkv_type);
    return SF_OK;
}

int sf_attention_local(sf_backend *be, const sf_attention_desc *dd, const float *q, const float *k, const float *v,
                       float *acc, float *ml)
{
    int rc = cpu_f32(be, dd, "sf_attention_local");
    return rc != SF_OK ? rc : attention_heads(be, dd, q, k, v, NULL, LOCAL, acc, ml);
}

int sf_attention_finish(sf_backend *be, const sf_attention_desc *dd, const float *q, const float *acc, const float *ml,
                        float *out)
{
    int rc = cpu_f32(be, dd, "sf_attention_finish");
    return rc != SF_OK ? rc : attention_heads(be, dd, q, NULL, NULL, out, FINISH, (float *)acc, (float *)ml);
}

double sf_attention_useful_flops(const sf_attention_desc *dd)
{
    double pairs = 0;
    for (int h = 0; h < dd->heads; h++) {
        for (int b = 0; b < dd->n_branches; b++) {
            const int win = dd->branches[b].window, r = dd->branches[b].dilation, o = (dd->head_offset + h) % r;
            for (int start = 0; start < dd->n; start += win) {
                double rows = 0;
                for (int i = start + o; i < start + win && i < dd->n; i += r) rows++;
                pairs += dd->causal ? rows * (rows + 1) / 2 : rows * rows;
            }
        }
        pairs += (double)dd->n * dd->n_global;
    }
    return 4.0 * dd->head_dim * pairs;
}
