/* The CUDA backend's plan cache (setting plan_cache, kernels/cuda/gemm_plan_cache.cu): a
 * process times a product shape's cuBLAS candidates and writes its choice when the backend is
 * freed; the next backend takes it from the file instead of timing, with the same bits out. A
 * damaged file (a foreign header, lines that do not parse, an algorithm cuBLASLt refuses) is
 * never an error: the shape is timed again. plan_cache=0 neither reads nor writes.
 * Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/gpu.h"

#ifndef SEQFLOW_HAVE_CUDA
int main(void) { return check_skip("no GPU (a build without CUDA)"); }
#else
#include "kernels/cuda/cuda_backend.h"

/* two product shapes of a layer: [n, in] x [out, in]^T */
enum { N = 512, IN = 256, OUT = 768, OUT2 = 256 };

static check_rng rng = {4242};

typedef struct run_result {
    float *y, *y2;
    sf_cuda_plans plans;
} run_result;

/* One backend (settings), two bf16 products of their own shapes, then freed (the cache is
 * written there). */
static run_result run(const char *settings, const float *x, const float *w, const float *w2)
{
    run_result r = {0};
    sf_backend *be = NULL;
    const sf_backend_options o = {.precision = SF_PRECISION_BF16, .settings = settings};
    CHECK_OK(sf_backend_create_opts("cuda", &o, &be));
    if (!be) return r;
    const sf_backend_ops *ops = be->ops;
    float *dx = ops->alloc(be, (size_t)N * IN * sizeof(float)), *dw = ops->alloc(be, (size_t)OUT * IN * sizeof(float));
    float *dw2 = ops->alloc(be, (size_t)OUT2 * IN * sizeof(float)), *dy = ops->alloc(be, (size_t)N * OUT * sizeof(float));
    CHECK_OK(ops->upload(be, dx, x, (size_t)N * IN * sizeof(float)));
    CHECK_OK(ops->upload(be, dw, w, (size_t)OUT * IN * sizeof(float)));
    CHECK_OK(ops->upload(be, dw2, w2, (size_t)OUT2 * IN * sizeof(float)));
    const float *one[1] = {dw}, *two[1] = {dw2};
    CHECK_OK(sf_be_prepare_weights(be, 1, one, OUT, IN));
    CHECK_OK(sf_be_prepare_weights(be, 1, two, OUT2, IN));
    r.y = malloc((size_t)N * OUT * sizeof(float));
    r.y2 = malloc((size_t)N * OUT2 * sizeof(float));
    CHECK_OK(ops->matmul(be, N, IN, OUT, dx, IN, dw, dy, OUT, 0));
    CHECK_OK(ops->download(be, r.y, dy, (size_t)N * OUT * sizeof(float)));
    CHECK_OK(ops->matmul(be, N, IN, OUT2, dx, IN, dw2, dy, OUT2, 0));
    CHECK_OK(ops->download(be, r.y2, dy, (size_t)N * OUT2 * sizeof(float)));
    CHECK_OK(sf_cuda_backend_plans(be, &r.plans));
    void *bufs[] = {dx, dw, dw2, dy};
    for (int i = 0; i < 4; i++) ops->free(be, bufs[i]);
    sf_backend_free(be);
    return r;
}

static int same(const run_result *a, const run_result *b)
{
    return a->y && b->y && memcmp(a->y, b->y, (size_t)N * OUT * sizeof(float)) == 0 &&
           memcmp(a->y2, b->y2, (size_t)N * OUT2 * sizeof(float)) == 0;
}

static void done(run_result *r) { free(r->y), free(r->y2); }

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECKF(f != NULL, "cannot write %s", path);
    if (f) fputs(text, f), fclose(f);
}

static int count_lines(const char *path)
{
    size_t len = 0;
    unsigned char *data = check_read_file(path, &len);
    int n = 0;
    for (size_t i = 0; data && i < len; i++) n += data[i] == '\n';
    free(data);
    return n;
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    char dir[600], file[700], cmd[800];
    snprintf(dir, sizeof dir, "%s/plans-%ld/a/b", check_tmp_path("plan_cache"), (long)getpid());
    snprintf(file, sizeof file, "%s/gemm-plans", dir);
    setenv("SEQFLOW_CACHE_DIR", dir, 1); /* read when each backend is created */
    float *x = malloc((size_t)N * IN * sizeof *x), *w = malloc((size_t)OUT * IN * sizeof *w);
    float *w2 = malloc((size_t)OUT2 * IN * sizeof *w2);
    check_fill_normal(&rng, x, (size_t)N * IN, 1.0);
    check_fill_normal(&rng, w, (size_t)OUT * IN, 0.05);
    check_fill_normal(&rng, w2, (size_t)OUT2 * IN, 0.05);

    /* the first backend times both shapes and makes the folders and the file */
    run_result first = run("gemm=fastest", x, w, w2);
    CHECKF(first.plans.timed == 2 && first.plans.from_cache == 0, "first backend: %d timed, %d from the cache",
           first.plans.timed, first.plans.from_cache);
    CHECKF(check_path_exists(file), "no plan cache at %s", file);
    CHECKF(count_lines(file) == 3, "%s: %d lines (a header and two plans expected)", file, count_lines(file));
    /* the next takes both from it, and computes the same bits */
    run_result again = run("gemm=fastest", x, w, w2);
    CHECKF(again.plans.timed == 0 && again.plans.from_cache == 2, "second backend: %d timed, %d from the cache",
           again.plans.timed, again.plans.from_cache);
    CHECK(same(&first, &again));
    CHECKF(count_lines(file) == 3, "the file grew to %d lines with nothing new", count_lines(file));
    /* plan_cache=0 neither reads nor writes; another gemm setting is another key */
    run_result off = run("gemm=fastest,plan_cache=0", x, w, w2);
    CHECKF(off.plans.timed == 2 && off.plans.from_cache == 0, "plan_cache=0: %d timed, %d from the cache",
           off.plans.timed, off.plans.from_cache);
    CHECK(same(&first, &off));
    run_result lt = run("gemm=lt", x, w, w2);
    CHECKF(lt.plans.timed == 2 && lt.plans.from_cache == 0, "gemm=lt: %d timed, %d from the cache", lt.plans.timed,
           lt.plans.from_cache);
    CHECKF(count_lines(file) == 5, "after gemm=lt: %d lines (two more plans expected)", count_lines(file));

    /* damaged: every algorithm's bytes replaced, a line that does not parse: timed again, same bits */
    size_t len = 0;
    char *text = (char *)check_read_file(file, &len);
    CHECK(text != NULL);
    int damaged_lines = 0;
    for (char *line = text ? strchr(text, '\n') : NULL; line && line[1]; line = strchr(line + 1, '\n')) {
        char *end = strchr(line + 1, '\n'), *hex = end;
        while (hex && hex > line + 1 && hex[-1] != ' ') hex--;
        if (!end || hex <= line + 1) continue;
        for (char *h = hex; h < end; h++) *h = 'f';
        damaged_lines++;
    }
    CHECKF(damaged_lines == 4, "damaged %d plan lines of 4", damaged_lines);
    if (text) {
        char *damaged = malloc(len + 64);
        snprintf(damaged, len + 64, "%snot a plan at all\n", text);
        write_text(file, damaged);
        free(damaged);
    }
    free(text);
    run_result bad = run("gemm=fastest", x, w, w2);
    CHECKF(bad.plans.timed + bad.plans.from_cache == 2, "damaged file: %d timed, %d from the cache", bad.plans.timed,
           bad.plans.from_cache);
    CHECK(same(&first, &bad));
    printf("  damaged algorithms: %d of 2 shapes timed again (the rest still accepted by cuBLASLt)\n", bad.plans.timed);
    /* a foreign file: ignored, then replaced by a valid one */
    write_text(file, "something else entirely\n12 34 56\n");
    run_result foreign = run("gemm=fastest", x, w, w2);
    CHECKF(foreign.plans.timed == 2 && foreign.plans.from_cache == 0, "foreign file: %d timed, %d from the cache",
           foreign.plans.timed, foreign.plans.from_cache);
    CHECK(same(&first, &foreign));
    run_result healed = run("gemm=fastest", x, w, w2);
    CHECKF(healed.plans.from_cache == 2, "after the foreign file was replaced: %d from the cache",
           healed.plans.from_cache);
    /* an unwritable folder: no error, only timing */
    setenv("SEQFLOW_CACHE_DIR", "/proc/seqflow-cannot-be-made", 1);
    run_result nowhere = run("gemm=fastest", x, w, w2);
    CHECKF(nowhere.plans.timed == 2, "unwritable cache folder: %d timed", nowhere.plans.timed);
    CHECK(same(&first, &nowhere));
    printf("  plan cache at %s: first backend timed %d shapes, the second took %d from the file\n", file,
           first.plans.timed, again.plans.from_cache);

    run_result *all[] = {&first, &again, &off, &lt, &bad, &foreign, &healed, &nowhere};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) done(all[i]);
    free(x), free(w), free(w2);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/plans-%ld'", check_tmp_path("plan_cache"), (long)getpid());
    if (system(cmd) != 0) printf("  (could not remove the test's folder)\n");
    return check_finish("test_gpu_plan_cache");
}
#endif
