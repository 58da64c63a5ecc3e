/* Model configuration: defaults, validation, the branch list's text form and branch coverage. */
#include "seqflow/error.h"
#include "seqflow/model.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Upper bounds keep every later size product (N*D, H*d*D, vocab*D, ...) far from overflow in
 * 64-bit arithmetic and reject files whose numbers are garbage rather than a real model. */
#define SF_MAX_WIDTH (1 << 16)
#define SF_MAX_HEAD_FEATURES (1 << 20)
#define SF_MAX_SEGMENT (1 << 24)
#define SF_MAX_LAYERS 4096
#define SF_MAX_VOCAB (1 << 26)
#define SF_MAX_MLP_HIDDEN (1 << 20)
#define SF_MAX_GLOBAL_TOKENS (1 << 24)

void sf_model_config_default(sf_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->dim = 128;
    cfg->heads = 4;
    cfg->head_dim = 32;
    cfg->vocab = 256;
    cfg->layers = 2;
    cfg->segment = 256;
    cfg->n_branches = 3;
    cfg->branches[0] = (sf_branch){64, 1};
    cfg->branches[1] = (sf_branch){128, 2};
    cfg->branches[2] = (sf_branch){256, 4};
    cfg->causal = 1;
    cfg->memory = SF_MEMORY_DELTA;
    cfg->global_tokens = 16;
    cfg->summary_tokens = 4;
    cfg->norm_eps = 1e-6f;
    cfg->mlp_hidden = 256;
    cfg->final_norm = 1;
}

static int check_size(const char *what, int value, int max)
{
    if (value <= 0 || value > max)
        return sf_error(SF_E_CONFIG, "%s is %d; it must be between 1 and %d", what, value, max);
    return SF_OK;
}

int sf_model_config_validate(const sf_model_config *cfg)
{
    if (!cfg) return sf_error(SF_E_INVAL, "model config is NULL");
    int rc;
    if ((rc = check_size("dim", cfg->dim, SF_MAX_WIDTH)) != SF_OK) return rc;
    if ((rc = check_size("heads", cfg->heads, SF_MAX_WIDTH)) != SF_OK) return rc;
    if ((rc = check_size("head_dim", cfg->head_dim, SF_MAX_WIDTH)) != SF_OK) return rc;
    if ((long long)cfg->heads * cfg->head_dim > SF_MAX_HEAD_FEATURES)
        return sf_error(SF_E_CONFIG, "heads*head_dim is %lld; it must be at most %d",
                        (long long)cfg->heads * cfg->head_dim, SF_MAX_HEAD_FEATURES);
    if ((rc = check_size("vocab", cfg->vocab, SF_MAX_VOCAB)) != SF_OK) return rc;
    if ((rc = check_size("layers", cfg->layers, SF_MAX_LAYERS)) != SF_OK) return rc;
    if ((rc = check_size("segment", cfg->segment, SF_MAX_SEGMENT)) != SF_OK) return rc;
    if (cfg->n_branches < 1 || cfg->n_branches > SF_MAX_BRANCHES)
        return sf_error(SF_E_CONFIG, "the model has %d branches; it must have 1 to %d",
                        cfg->n_branches, SF_MAX_BRANCHES);
    for (int b = 0; b < cfg->n_branches; b++) {
        int w = cfg->branches[b].window, r = cfg->branches[b].dilation;
        if (w <= 0)
            return sf_error(SF_E_CONFIG, "branch %d (window %d): window must be positive", b + 1, w);
        if (r <= 0)
            return sf_error(SF_E_CONFIG, "branch %d (window %d): dilation %d must be positive",
                            b + 1, w, r);
        if (cfg->segment % w != 0)
            return sf_error(SF_E_CONFIG,
                            "branch %d (window %d): window does not divide the segment length %d",
                            b + 1, w, cfg->segment);
        if (w % r != 0)
            return sf_error(SF_E_CONFIG,
                            "branch %d (window %d): dilation %d does not divide the window", b + 1,
                            w, r);
    }
    if (cfg->causal != 0 && cfg->causal != 1)
        return sf_error(SF_E_CONFIG, "causal is %d; it must be 0 or 1", cfg->causal);
    if (cfg->memory != SF_MEMORY_NONE && cfg->memory != SF_MEMORY_LINEAR &&
        cfg->memory != SF_MEMORY_DELTA)
        return sf_error(SF_E_CONFIG, "memory kind %d is not none, linear or delta", (int)cfg->memory);
    if (cfg->global_tokens < 0 || cfg->global_tokens > SF_MAX_GLOBAL_TOKENS)
        return sf_error(SF_E_CONFIG, "global_tokens is %d; it must be between 0 and %d",
                        cfg->global_tokens, SF_MAX_GLOBAL_TOKENS);
    if (cfg->summary_tokens < 0 || cfg->summary_tokens > cfg->segment)
        return sf_error(SF_E_CONFIG,
                        "summary_tokens is %d; it must be between 0 and the segment length %d",
                        cfg->summary_tokens, cfg->segment);
    if (!(cfg->norm_eps > 0.0f) || !isfinite(cfg->norm_eps))
        return sf_error(SF_E_CONFIG, "norm_eps is %g; it must be positive and finite",
                        (double)cfg->norm_eps);
    if (cfg->mlp_hidden < 0 || cfg->mlp_hidden > SF_MAX_MLP_HIDDEN)
        return sf_error(SF_E_CONFIG, "mlp_hidden is %d; it must be between 0 (no MLP) and %d",
                        cfg->mlp_hidden, SF_MAX_MLP_HIDDEN);
    if (cfg->final_norm != 0 && cfg->final_norm != 1)
        return sf_error(SF_E_CONFIG, "final_norm is %d; it must be 0 or 1", cfg->final_norm);
    return SF_OK;
}

/* Reads a positive decimal number without sign or spaces; strtol would accept " +12". */
static const char *parse_positive(const char *p, int *value)
{
    long long v = 0;
    if (*p < '0' || *p > '9') return NULL;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > INT_MAX) return NULL;
        p++;
    }
    if (v == 0) return NULL;
    *value = (int)v;
    return p;
}

int sf_branches_parse(const char *text, sf_model_config *cfg)
{
    if (!text || !cfg) return sf_error(SF_E_INVAL, "sf_branches_parse: NULL argument");
    sf_branch parsed[SF_MAX_BRANCHES];
    int n = 0;
    const char *p = text;
    for (;;) {
        if (n == SF_MAX_BRANCHES)
            return sf_error(SF_E_CONFIG, "branches \"%s\": more than %d branches", text,
                            SF_MAX_BRANCHES);
        int w, r;
        const char *q = parse_positive(p, &w);
        if (!q || *q != ':')
            return sf_error(SF_E_CONFIG,
                            "branches \"%s\": branch %d is not window:dilation with positive "
                            "integers",
                            text, n + 1);
        q = parse_positive(q + 1, &r);
        if (!q)
            return sf_error(SF_E_CONFIG,
                            "branches \"%s\": branch %d has no positive integer dilation", text,
                            n + 1);
        parsed[n++] = (sf_branch){w, r};
        if (*q == '\0') break;
        if (*q != ',')
            return sf_error(SF_E_CONFIG, "branches \"%s\": unexpected '%c' after branch %d", text,
                            *q, n);
        p = q + 1;
    }
    /* Only a fully parsed list replaces the old one, so a failed parse leaves cfg usable. */
    memcpy(cfg->branches, parsed, (size_t)n * sizeof parsed[0]);
    cfg->n_branches = n;
    return SF_OK;
}

void sf_branches_format(const sf_model_config *cfg, char *buf, size_t size)
{
    if (!buf || size == 0) return;
    buf[0] = '\0';
    if (!cfg) return;
    size_t used = 0;
    int n = cfg->n_branches < 0 ? 0 : cfg->n_branches > SF_MAX_BRANCHES ? SF_MAX_BRANCHES
                                                                          : cfg->n_branches;
    for (int b = 0; b < n && used < size; b++) {
        int k = snprintf(buf + used, size - used, "%s%d:%d", b ? "," : "",
                         cfg->branches[b].window, cfg->branches[b].dilation);
        if (k < 0) break;
        used += (size_t)k;
    }
}

static long long gcd_ll(long long a, long long b)
{
    while (b) {
        long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Counting directly would cost heads*segment steps, which a hostile model file could make
 * 2^40. Instead: (h, i) is covered by every branch of a set S exactly when i = h mod lcm(r_S),
 * and since every dilation divides the segment, each head has segment/lcm such positions. The
 * union over branches then follows by inclusion-exclusion over at most 2^16 subsets. */
long sf_model_config_uncovered(const sf_model_config *cfg)
{
    if (!cfg || cfg->n_branches < 1 || cfg->n_branches > SF_MAX_BRANCHES || cfg->heads <= 0 ||
        cfg->segment <= 0)
        return 0;
    int nb = cfg->n_branches;
    for (int b = 0; b < nb; b++) {
        int r = cfg->branches[b].dilation;
        if (r <= 0 || cfg->segment % r != 0) return 0; /* invalid; validation reports it */
    }
    long long total = (long long)cfg->heads * cfg->segment;
    long long covered = 0;
    for (unsigned subset = 1; subset < (1u << nb); subset++) {
        long long lcm = 1;
        int bits = 0;
        for (int b = 0; b < nb; b++) {
            if (!(subset & (1u << b))) continue;
            long long r = cfg->branches[b].dilation;
            lcm = lcm / gcd_ll(lcm, r) * r; /* divides the segment, so it stays small */
            bits++;
        }
        long long pairs = (long long)cfg->heads * (cfg->segment / lcm);
        covered += (bits & 1) ? pairs : -pairs;
    }
    return (long)(total - covered);
}
