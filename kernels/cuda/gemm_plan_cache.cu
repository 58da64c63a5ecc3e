/* The product plans kept on disk between processes (setting plan_cache, default on): a shape's
 * first product times up to 17 candidates (gemm_plan.cu), each loading its kernel on first use;
 * for the reference model's shapes that was about 100 ms of the start-up. What one process chose
 * the next one takes, after cuBLASLt checks the algorithm against the shape again
 * (cublasLtMatmulAlgoCheck); an entry it refuses, or none, means timing as before.
 *
 * The file is `<cache_dir>/gemm-plans` (cuda_settings.h: SEQFLOW_CACHE_DIR, XDG_CACHE_HOME or
 * HOME), text: a header line, then one plan a line,
 *     <key> <use_lt> <workspace bytes> <the algorithm's 64 bytes in hex>
 * where the key names the GPU (compute capability and name), cuBLASLt's version, the cuBLAS
 * workspace, the gemm setting and every field of the shape, so a plan is only ever taken by a
 * product it was timed for. Lines that do not parse are skipped. The file is read at a shape's
 * first product, and rewritten when the backend is freed if this process timed something new:
 * the file as it is then, with the new plans appended (the oldest dropped past CACHE_MAX
 * lines), into a temporary file renamed over it, so processes writing at once lose at most
 * each other's newest plans, never the file. A plan changes no result: the candidates that
 * split K are never chosen, and the others sum in the same order (gemm_plan.cu). */
#include "kernels/cuda/cuda_backend.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_FILE "gemm-plans"
#define CACHE_HEADER "seqflow gemm plans 1"
#define CACHE_MAX 1024
#define KEY_BYTES 224

typedef struct cached_plan {
    char key[KEY_BYTES];
    int use_lt;
    unsigned long long workspace;
    cublasLtMatmulAlgo_t algo;
} cached_plan;

struct sf_cuda_plan_cache {
    char path[600];
    char device[128]; /* the key's first part: this GPU and this cuBLASLt */
    cached_plan *plans;
    int n, cap;
    int first_new; /* plans[first_new..n) were timed by this process */
};

static int hex_value(int ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* One line into *p; 0 when it does not parse. */
static int parse_line(const char *line, cached_plan *p)
{
    char hex[2 * sizeof p->algo + 2];
    if (sscanf(line, "%223s %d %llu %129s", p->key, &p->use_lt, &p->workspace, hex) != 4) return 0;
    if ((p->use_lt != 0 && p->use_lt != 1) || strlen(hex) != 2 * sizeof p->algo) return 0;
    unsigned char *bytes = (unsigned char *)&p->algo;
    for (size_t i = 0; i < sizeof p->algo; i++) {
        const int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        bytes[i] = (unsigned char)(hi << 4 | lo);
    }
    return 1;
}

static int append(sf_cuda_plan_cache *pc, const cached_plan *p)
{
    if (pc->n == pc->cap) {
        const int cap = pc->cap ? 2 * pc->cap : 64;
        cached_plan *grown = (cached_plan *)realloc(pc->plans, (size_t)cap * sizeof *grown);
        if (!grown) return 0;
        pc->plans = grown, pc->cap = cap;
    }
    pc->plans[pc->n++] = *p;
    return 1;
}

static const cached_plan *lookup(const cached_plan *plans, int n, const char *key)
{
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(plans[i].key, key) == 0) return &plans[i];
    return NULL;
}

/* The file's plans appended to *pc (every GPU's: the file is rewritten whole). */
static void read_file(sf_cuda_plan_cache *pc)
{
    FILE *f = fopen(pc->path, "r");
    if (!f) return;
    char line[512];
    if (fgets(line, sizeof line, f) && strncmp(line, CACHE_HEADER, strlen(CACHE_HEADER)) == 0) {
        cached_plan p;
        while (fgets(line, sizeof line, f))
            if (parse_line(line, &p) && !lookup(pc->plans, pc->n, p.key) && !append(pc, &p)) break;
    }
    fclose(f);
}

/* The cache of c, made and read at the first call; NULL when off or not possible. */
static sf_cuda_plan_cache *cache_of(sf_cuda *c)
{
    if (c->plan_cache || !c->settings.plan_cache || !c->settings.cache_dir[0] || c->plan_cache_failed)
        return c->plan_cache;
    sf_cuda_plan_cache *pc = (sf_cuda_plan_cache *)calloc(1, sizeof *pc);
    cudaDeviceProp prop;
    if (!pc || cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) {
        cudaGetLastError();
        free(pc);
        c->plan_cache_failed = 1;
        return NULL;
    }
    snprintf(pc->path, sizeof pc->path, "%s/%s", c->settings.cache_dir, CACHE_FILE);
    int n = snprintf(pc->device, sizeof pc->device, "sm%d%d-", prop.major, prop.minor);
    for (const char *s = prop.name; *s && n + 1 < (int)sizeof pc->device - 16; s++)
        pc->device[n++] = (*s == ' ' || *s == '|' || *s == ',') ? '_' : *s;
    snprintf(pc->device + n, sizeof pc->device - (size_t)n, "-lt%zu", cublasLtGetVersion());
    read_file(pc);
    pc->first_new = pc->n;
    c->plan_cache = pc;
    return pc;
}

static void plan_key(const sf_cuda *c, const sf_cuda_plan_cache *pc, const sf_cuda_gemm_plan *p, char *key)
{
    snprintf(key, KEY_BYTES, "%s|ws%zu|g%d|%d,%d,%d,%d,%d,%d,%d,%lld,%lld,%d", pc->device, c->blas_workspace_bytes,
             c->settings.gemm, p->n, p->in, p->out, p->ldy, p->batch, p->accumulate, p->align, p->stride_w,
             p->stride_y, (int)p->ytype);
}

int sf_cuda_plan_cache_find(sf_cuda *c, sf_cuda_gemm_plan *p)
{
    sf_cuda_plan_cache *pc = cache_of(c);
    if (!pc) return 0;
    char key[KEY_BYTES];
    plan_key(c, pc, p, key);
    const cached_plan *hit = lookup(pc->plans, pc->n, key);
    if (!hit) return 0;
    if (!hit->use_lt) {
        p->use_lt = 0;
        return 1;
    }
    cublasLtMatmulHeuristicResult_t check;
    memset(&check, 0, sizeof check);
    if (cublasLtMatmulAlgoCheck((cublasLtHandle_t)c->blas, &p->op, &p->a, &p->b, &p->c, &p->c, &hit->algo, &check) !=
            CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > c->blas_workspace_bytes)
        return 0;
    p->use_lt = 1, p->algo = hit->algo, p->workspace_bytes = check.workspaceSize;
    return 1;
}

void sf_cuda_plan_cache_add(sf_cuda *c, const sf_cuda_gemm_plan *p)
{
    sf_cuda_plan_cache *pc = cache_of(c);
    if (!pc) return;
    cached_plan e;
    memset(&e, 0, sizeof e);
    plan_key(c, pc, p, e.key);
    e.use_lt = p->use_lt, e.workspace = p->workspace_bytes;
    if (p->use_lt) e.algo = p->algo;
    append(pc, &e);
}

/* mkdir -p of dir (made for the user only) */
static int make_dirs(const char *dir)
{
    char path[512];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return -1;
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(path, 0700) != 0 && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

static void write_file(const sf_cuda_plan_cache *pc, const char *dir)
{
    sf_cuda_plan_cache now;
    memset(&now, 0, sizeof now);
    snprintf(now.path, sizeof now.path, "%s", pc->path);
    read_file(&now);
    for (int i = pc->first_new; i < pc->n; i++)
        if (!lookup(now.plans, now.n, pc->plans[i].key) && !append(&now, &pc->plans[i])) break;
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.%ld.%p.tmp", pc->path, (long)getpid(), (const void *)pc);
    FILE *f = make_dirs(dir) == 0 ? fopen(tmp, "w") : NULL;
    int ok = f != NULL;
    if (ok) fprintf(f, "%s\n", CACHE_HEADER);
    for (int i = now.n > CACHE_MAX ? now.n - CACHE_MAX : 0; ok && i < now.n; i++) {
        const cached_plan *p = &now.plans[i];
        fprintf(f, "%s %d %llu ", p->key, p->use_lt, p->workspace);
        const unsigned char *bytes = (const unsigned char *)&p->algo;
        for (size_t j = 0; j < sizeof p->algo; j++) fprintf(f, "%02x", bytes[j]);
        fputc('\n', f);
    }
    if (f) ok = !ferror(f) & (fclose(f) == 0);
    /* a cache: a file that cannot be written is a slower next start, not an error */
    if (!ok || rename(tmp, pc->path) != 0) unlink(tmp);
    free(now.plans);
}

void sf_cuda_plan_cache_close(sf_cuda *c)
{
    sf_cuda_plan_cache *pc = c->plan_cache;
    if (!pc) return;
    if (pc->n > pc->first_new) write_file(pc, c->settings.cache_dir);
    free(pc->plans);
    free(pc);
    c->plan_cache = NULL;
}

extern "C" int sf_cuda_backend_plans(const sf_backend *be, sf_cuda_plans *out)
{
    if (!be || !out || strcmp(be->ops->name, "cuda") != 0) return sf_error(SF_E_INVAL, "sf_cuda_backend_plans: not a cuda backend");
    const sf_cuda *c = (const sf_cuda *)be->impl;
    out->timed = c->plans_timed;
    out->from_cache = c->plans_cached;
    return SF_OK;
}
