/* The CUDA backend's warm-up (setting warmup=1, the default) changes no output: a block stage
 * runs one segment of made-up rows at start-up on a state that the first stream then takes,
 * reset to zero, so every row of every stream must equal, bit for bit, the rows of a graph that
 * set up without it (warmup=0). Three streams (the first takes the warm-up's state), partial
 * segments, a flush, in float32 and bf16, on shapes with delta and linear memory, global
 * tokens and an MLP, and with two block stages (each warms up its own layers). cuBLAS's own
 * algorithm choice on both sides (gemm=gemmex): the Lt plans are timed per graph and may differ.
 * Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <stdio.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"
#include "support/shard_runs.h"
#include "support/small_model.h"

/* Streams' committed rows (NaN where nothing came) and stream 0's provisional rows compared
 * bit for bit; returns 1 when identical. */
static int same_outputs(const shard_outputs *a, const shard_outputs *b, const shard_scenario *sc, size_t D)
{
    for (int s = 0; s < sc->streams; s++)
        if (memcmp(a->x[s], b->x[s], sc->tokens * D * sizeof(float)) != 0) return 0;
    if (a->prov_pos != b->prov_pos || a->prov_n != b->prov_n) return 0;
    return !a->prov_n || memcmp(a->provisional, b->provisional, a->prov_n * D * sizeof(float)) == 0;
}

static void compare(const check_model_variant *v, const sf_model *m, const shard_scenario *sc, uint64_t seed)
{
    const size_t D = (size_t)sf_model_get_config(m)->dim;
    uint32_t **tokens = shard_tokens(m, sc, seed);
    static const struct {
        sf_precision p;
        const char *label;
    } modes[] = {{SF_PRECISION_F32, "f32"}, {SF_PRECISION_BF16, "bf16"}};
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        const shard_device cold = {"cuda", modes[mi].p, "gemm=gemmex,warmup=0"};
        const shard_device warm = {"cuda", modes[mi].p, "gemm=gemmex,warmup=1"};
        shard_outputs a, b;
        const int ra = shard_run(m, &cold, sc, "", tokens, &a, 0, NULL);
        const int rb = shard_run(m, &warm, sc, "", tokens, &b, 0, NULL);
        CHECKF(ra == SF_OK && rb == SF_OK, "%s %s: runs returned %d, %d", v->name, modes[mi].label, ra, rb);
        if (ra == SF_OK && rb == SF_OK) {
            const int same = same_outputs(&a, &b, sc, D);
            CHECKF(same, "%s [%s, %s]: warmup=1 changed the output (worst relative error %.3g)", v->name, sc->pipeline,
                   modes[mi].label, shard_worst_error(v->name, modes[mi].label, &b, &a, sc, D));
            printf("  %-40s %-44s %-4s warmup=1 %s warmup=0\n", v->name, sc->pipeline, modes[mi].label,
                   same ? "==" : "!=");
        }
        shard_outputs_free(&a);
        shard_outputs_free(&b);
    }
    shard_tokens_free(tokens);
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    static const check_model_variant variants[] = {
        /* name, branches, D, H, d, layers, causal, MLP, globals, summary, final norm, segment, memory */
        {"d=64, causal delta, globals, MLP", "64:1,128:2,256:4", 128, 2, 64, 2, 1, 256, 16, 4, 1, 256, SF_MEMORY_DELTA},
        {"d=32, linear, globals, MLP", "32:1,64:2", 96, 3, 32, 2, 1, 128, 8, 2, 0, 64, SF_MEMORY_LINEAR},
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const check_model_variant *v = &variants[i];
        sf_model *m = NULL;
        CHECK_OK(check_variant_model(v, 4000 + i, &m));
        if (!m) continue;
        const size_t N = (size_t)v->segment;
        const shard_scenario streams = {"segment ! embed ! block ! norm", 3, 3 * N + 19, N + N / 2 + 1};
        compare(v, m, &streams, 10 + i);
        const shard_scenario split = {"segment ! embed ! block layers=0 ! block layers=1 ! norm", 1, 2 * N + 3, 0};
        compare(v, m, &split, 20 + i);
        sf_model_free(m);
    }
    return check_finish("test_gpu_warmup");
}
