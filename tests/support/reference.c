#include "support/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ref_state {
    int layers, heads, d, width, G;
    double *M;          /* [L][H][d][d] */
    double *z;          /* [L][H][d] */
    double *gk, *gv;    /* [L][G][width], oldest first */
    int *g_count;       /* [L] */
};

ref_state *ref_state_new(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    ref_state *s = calloc(1, sizeof *s);
    s->layers = c->layers, s->heads = c->heads, s->d = c->head_dim, s->width = c->heads * c->head_dim;
    s->G = c->global_tokens;
    s->M = calloc((size_t)c->layers * c->heads * c->head_dim * c->head_dim, sizeof(double));
    s->z = calloc((size_t)c->layers * c->heads * c->head_dim, sizeof(double));
    s->gk = calloc((size_t)c->layers * (c->global_tokens + 1) * s->width, sizeof(double));
    s->gv = calloc((size_t)c->layers * (c->global_tokens + 1) * s->width, sizeof(double));
    s->g_count = calloc((size_t)c->layers, sizeof(int));
    return s;
}

void ref_state_free(ref_state *s)
{
    if (!s) return;
    free(s->M), free(s->z), free(s->gk), free(s->gv), free(s->g_count), free(s);
}

static void rmsnorm(const double *x, const float *w, int n, int D, double eps, double *y)
{
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += x[i * D + j] * x[i * D + j];
        double r = 1.0 / sqrt(ss / D + eps);
        for (int j = 0; j < D; j++) y[i * D + j] = x[i * D + j] * r * w[j];
    }
}

/* y[n, out] = x[n, in] W^T, W [out, in] */
static void linear(const double *x, const float *W, int n, int in, int out, double *y)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double acc = 0;
            for (int k = 0; k < in; k++) acc += x[i * in + k] * W[(size_t)o * in + k];
            y[i * out + o] = acc;
        }
}

static double sigma(double x) { return x > 0 ? x + 1.0 : exp(x); } /* ELU(x) + 1 */

/* Softmax attention of query i of head h over the union of every branch's keys and the
 * global tokens, keys reached twice counted twice. */
static void attend(const sf_model_config *c, const ref_state *s, int layer, const double *Q, const double *K,
                   const double *V, int n, int h, int i, double *out)
{
    const int d = c->head_dim, W = s->width;
    const double scale = 1.0 / sqrt((double)d);
    double *logits = malloc(((size_t)c->n_branches * n + s->G + 1) * sizeof(double));
    const double **values = malloc(((size_t)c->n_branches * n + s->G + 1) * sizeof(double *));
    int count = 0;
    for (int b = 0; b < c->n_branches; b++) {
        int w = c->branches[b].window, r = c->branches[b].dilation, o = h % r;
        if (i % r != o) continue;
        for (int j = 0; j < n; j++) {
            if (j % r != o || j / w != i / w || (c->causal && j > i)) continue;
            double dot = 0;
            for (int e = 0; e < d; e++) dot += Q[i * W + h * d + e] * K[j * W + h * d + e];
            logits[count] = dot * scale;
            values[count++] = V + j * W + h * d;
        }
    }
    if (s->G > 0) {
        const double *gk = s->gk + (size_t)layer * (s->G + 1) * W, *gv = s->gv + (size_t)layer * (s->G + 1) * W;
        for (int g = 0; g < s->g_count[layer]; g++) {
            double dot = 0;
            for (int e = 0; e < d; e++) dot += Q[i * W + h * d + e] * gk[g * W + h * d + e];
            logits[count] = dot * scale;
            values[count++] = gv + g * W + h * d;
        }
    }
    for (int e = 0; e < d; e++) out[e] = 0;
    if (count) {
        double mx = -INFINITY, sum = 0;
        for (int t = 0; t < count; t++) mx = logits[t] > mx ? logits[t] : mx;
        for (int t = 0; t < count; t++) sum += exp(logits[t] - mx);
        for (int t = 0; t < count; t++) {
            double p = exp(logits[t] - mx) / sum;
            for (int e = 0; e < d; e++) out[e] += p * values[t][e];
        }
    }
    free(logits);
    free(values);
}

/* sigma(q) M / (sigma(q) . z), 0 where the denominator is 0 */
static void retrieve(const double *M, const double *z, const double *q, int d, double *out)
{
    double den = 0;
    for (int a = 0; a < d; a++) den += sigma(q[a]) * z[a];
    for (int e = 0; e < d; e++) {
        double num = 0;
        for (int a = 0; a < d; a++) num += sigma(q[a]) * M[a * d + e];
        out[e] = den == 0 ? 0 : num / den;
    }
}

static void block_forward(const sf_model *m, ref_state *s, int l, double *x, int n, int commit)
{
    const sf_model_config *c = sf_model_get_config(m);
    const sf_block_weights *w = sf_model_block(m, l);
    const int D = c->dim, H = c->heads, d = c->head_dim, W = H * d, F = c->mlp_hidden;
    double *u = malloc((size_t)n * D * sizeof *u);
    double *Q = malloc((size_t)n * W * sizeof *Q), *K = malloc((size_t)n * W * sizeof *K);
    double *V = malloc((size_t)n * W * sizeof *V), *A = malloc((size_t)n * W * sizeof *A);
    double *proj = malloc((size_t)n * D * sizeof *proj);
    double *mem = malloc((size_t)d * sizeof *mem);
    rmsnorm(x, w->attn_norm, n, D, c->norm_eps, u);
    linear(u, w->wq, n, D, W, Q);
    linear(u, w->wk, n, D, W, K);
    linear(u, w->wv, n, D, W, V);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            double *a = A + i * W + h * d;
            attend(c, s, l, Q, K, V, n, h, i, a);
            if (c->memory == SF_MEMORY_NONE) continue;
            const double *M = s->M + ((size_t)l * H + h) * d * d, *z = s->z + ((size_t)l * H + h) * d;
            retrieve(M, z, Q + i * W + h * d, d, mem);
            double g = 1.0 / (1.0 + exp(-(double)w->gate[h]));
            for (int e = 0; e < d; e++) a[e] = g * mem[e] + (1 - g) * a[e];
        }
    linear(A, w->wo, n, W, D, proj);
    for (int i = 0; i < n * D; i++) x[i] += proj[i];
    if (F) {
        double *h1 = malloc((size_t)n * F * sizeof *h1), *h3 = malloc((size_t)n * F * sizeof *h3);
        rmsnorm(x, w->mlp_norm, n, D, c->norm_eps, u);
        linear(u, w->w1, n, D, F, h1);
        linear(u, w->w3, n, D, F, h3);
        for (int i = 0; i < n * F; i++) h1[i] = h1[i] / (1 + exp(-h1[i])) * h3[i];
        linear(h1, w->w2, n, F, D, proj);
        for (int i = 0; i < n * D; i++) x[i] += proj[i];
        free(h1), free(h3);
    }
    if (commit && c->memory != SF_MEMORY_NONE) {
        for (int h = 0; h < H; h++) {
            double *M = s->M + ((size_t)l * H + h) * d * d, *z = s->z + ((size_t)l * H + h) * d;
            double *dM = calloc((size_t)d * d, sizeof *dM), *target = malloc((size_t)d * sizeof *target);
            for (int t = 0; t < n; t++) {
                const double *k = K + t * W + h * d, *v = V + t * W + h * d;
                for (int e = 0; e < d; e++) target[e] = v[e];
                if (c->memory == SF_MEMORY_DELTA) {
                    retrieve(M, z, k, d, mem); /* R(t) with M and z before this segment */
                    for (int e = 0; e < d; e++) target[e] -= mem[e];
                }
                for (int a = 0; a < d; a++)
                    for (int e = 0; e < d; e++) dM[a * d + e] += sigma(k[a]) * target[e];
            }
            for (int a = 0; a < d * d; a++) M[a] += dM[a];
            for (int t = 0; t < n; t++)
                for (int a = 0; a < d; a++) z[a] += sigma(K[t * W + h * d + a]);
            free(dM), free(target);
        }
    }
    if (commit && c->global_tokens > 0 && c->summary_tokens > 0) {
        const int S = c->summary_tokens, N = c->segment, G = c->global_tokens;
        double *gk = s->gk + (size_t)l * (G + 1) * W, *gv = s->gv + (size_t)l * (G + 1) * W;
        for (int j = 0; j < S; j++) {
            int lo = j * N / S, hi = (j + 1) * N / S;
            if (hi > n) hi = n;
            if (lo >= hi) continue;
            if (s->g_count[l] == G) { /* the oldest leaves */
                memmove(gk, gk + W, (size_t)(G - 1) * W * sizeof *gk);
                memmove(gv, gv + W, (size_t)(G - 1) * W * sizeof *gv);
                s->g_count[l]--;
            }
            double *nk = gk + (size_t)s->g_count[l] * W, *nv = gv + (size_t)s->g_count[l] * W;
            for (int f = 0; f < W; f++) {
                double sk = 0, sv = 0;
                for (int t = lo; t < hi; t++) sk += K[t * W + f], sv += V[t * W + f];
                nk[f] = sk / (hi - lo), nv[f] = sv / (hi - lo);
            }
            s->g_count[l]++;
        }
    }
    free(u), free(Q), free(K), free(V), free(A), free(proj), free(mem);
}

int ref_segment(const sf_model *m, ref_state *s, const uint32_t *tokens, int n, int commit, double *out)
{
    const sf_model_config *c = sf_model_get_config(m);
    const int D = c->dim;
    const float *E = sf_model_embedding(m);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) out[i * D + j] = E[(size_t)tokens[i] * D + j];
    for (int l = 0; l < c->layers; l++) block_forward(m, s, l, out, n, commit);
    const float *fn = sf_model_final_norm(m);
    if (fn) rmsnorm(out, fn, n, D, c->norm_eps, out);
    return 0;
}

int ref_stream(const sf_model *m, const uint32_t *tokens, size_t n_tokens, double *out)
{
    const sf_model_config *c = sf_model_get_config(m);
    ref_state *s = ref_state_new(m);
    for (size_t at = 0; at < n_tokens; at += (size_t)c->segment) {
        size_t n = n_tokens - at < (size_t)c->segment ? n_tokens - at : (size_t)c->segment;
        ref_segment(m, s, tokens + at, (int)n, 1, out + at * (size_t)c->dim);
    }
    ref_state_free(s);
    return 0;
}
