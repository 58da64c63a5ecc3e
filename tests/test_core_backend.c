/* A backend written against seqflow/backend.h alone (the core ops, supports_op NULL, ext NULL)
 * runs every built-in stage: the stages compose their fused steps from its core ops
 * (kernels/backend.c). Its ops are the CPU backend's, taken one by one into a table of its own
 * under another name, so the CPU's arithmetic is the same and the outputs must be bit-identical
 * to the CPU backend's; being no "cpu", it also takes the device-rows path of embed, block and
 * norm (rows kept in backend memory between stages), where norm dtype=bf16 finds no bf16 norm
 * and rounds on the host. Models: the binary's default model and small ones with global tokens,
 * every memory kind, no MLP, several layers split over stages, several streams batched.
 * Also: the CPU backend has no settings, so any given is SF_E_OPTION naming its key. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph_internal.h"
#include "seqflow/backend.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/small_model.h"

/* The core backend's table: filled from the CPU backend's core ops at the start of main. */
static sf_backend_ops core_ops;

static void make_core_ops(const sf_backend_ops *cpu)
{
    core_ops = (sf_backend_ops){
        .name = "core",
        .alloc = cpu->alloc,
        .free = cpu->free,
        .upload = cpu->upload,
        .download = cpu->download,
        .copy = cpu->copy,
        .zero = cpu->zero,
        .sync = cpu->sync,
        .matmul = cpu->matmul,
        .rmsnorm = cpu->rmsnorm,
        .embed = cpu->embed,
        .swiglu = cpu->swiglu,
        .attention = cpu->attention,
        .memory_mix = cpu->memory_mix,
        .memory_update = cpu->memory_update,
        .summary = cpu->summary,
        .destroy = cpu->destroy,
        .supports_op = NULL, /* float32 only */
        .ext = NULL,         /* no fusions, no side queue: everything composed */
    };
}

/* Every packet that left the graph, rows and identity, in order. */
typedef struct outputs {
    uint64_t *meta; /* stream, position, n, flags, dtype per packet */
    unsigned char *bytes;
    size_t packets, used, cap_packets, cap_bytes;
} outputs;

static void drain(sf_graph *g, outputs *o)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN) continue;
        const size_t bytes = p->n * p->width * (p->dtype == SF_DTYPE_BF16 ? 2 : sizeof(float));
        if (o->packets == o->cap_packets) {
            o->cap_packets = 2 * o->cap_packets + 16;
            o->meta = realloc(o->meta, o->cap_packets * 5 * sizeof *o->meta);
        }
        if (o->used + bytes > o->cap_bytes) {
            o->cap_bytes = 2 * (o->used + bytes) + 1024;
            o->bytes = realloc(o->bytes, o->cap_bytes);
        }
        CHECKF(p->dev == NULL, "a packet left the graph with its rows in backend memory");
        uint64_t *m = o->meta + 5 * o->packets++;
        m[0] = p->stream, m[1] = p->position, m[2] = p->n, m[3] = p->flags, m[4] = (uint64_t)p->dtype;
        const void *rows = p->dtype == SF_DTYPE_BF16 ? (const void *)p->x_bf16 : (const void *)p->x;
        CHECKF(bytes == 0 || rows != NULL, "a packet of %zu rows without rows", (size_t)p->n);
        if (bytes && rows) memcpy(o->bytes + o->used, rows, bytes);
        o->used += bytes;
    }
}

static uint32_t token(uint64_t stream, int chunk, int i, int vocab)
{
    return (uint32_t)((stream * 131 + (uint64_t)chunk * 29 + (uint64_t)i * 7 + (uint64_t)i * i) % (uint64_t)vocab);
}

/* `streams` streams in uneven interleaved chunks through `pipeline` on the CPU backend (core 0)
 * or on the core backend (core 1), with a provisional flush now and then and each stream ended
 * at the end; every packet into *o. */
static int run(const sf_model *m, const char *pipeline, int streams, int core, outputs *o)
{
    const sf_model_config *c = sf_model_get_config(m);
    sf_graph *g = NULL;
    int rc = sf_graph_create(m, NULL, &g);
    if (rc != SF_OK) return rc;
    /* in place of the CPU backend the graph made: stages reach the backend only at their init */
    if (core) g->backend->ops = &core_ops;
    rc = sf_graph_parse(g, pipeline);
    uint32_t tokens[1024];
    for (int chunk = 0; chunk < 9 && rc == SF_OK; chunk++)
        for (uint64_t s = 0; s < (uint64_t)streams && rc == SF_OK; s++) {
            int n = (int)((chunk * 37 + s * 11) % (uint64_t)(c->segment + c->segment / 2)) + 1;
            if (n > (int)(sizeof tokens / sizeof *tokens)) n = (int)(sizeof tokens / sizeof *tokens);
            for (int i = 0; i < n; i++) tokens[i] = token(s, chunk, i, c->vocab);
            rc = sf_graph_push(g, s, tokens, (size_t)n);
            if (rc == SF_OK && (chunk + (int)s) % 4 == 3) rc = sf_graph_flush(g, s);
            drain(g, o);
        }
    for (uint64_t s = 0; s < (uint64_t)streams && rc == SF_OK; s++) rc = sf_graph_end(g, s);
    drain(g, o);
    sf_graph_free(g);
    return rc;
}

static void outputs_free(outputs *o)
{
    free(o->meta);
    free(o->bytes);
}

/* The core backend against the CPU backend on one pipeline: the same packets, bit for bit. */
static void compare(const char *name, const sf_model *m, const char *pipeline, int streams)
{
    outputs cpu = {0}, core = {0};
    const int cpu_rc = run(m, pipeline, streams, 0, &cpu);
    const int core_rc = run(m, pipeline, streams, 1, &core);
    CHECKF(cpu_rc == SF_OK, "%s [%s] on cpu: %s", name, pipeline, sf_last_error());
    CHECKF(core_rc == SF_OK, "%s [%s] on the core backend: %s", name, pipeline, sf_last_error());
    CHECKF(cpu.packets > 0, "%s [%s]: no output", name, pipeline);
    CHECKF(cpu.packets == core.packets && memcmp(cpu.meta, core.meta, cpu.packets * 5 * sizeof *cpu.meta) == 0,
           "%s [%s]: the packets differ (%zu against %zu)", name, pipeline, core.packets, cpu.packets);
    size_t first = cpu.used;
    for (size_t i = 0; i < cpu.used && i < core.used && first == cpu.used; i++)
        if (cpu.bytes[i] != core.bytes[i]) first = i;
    CHECKF(cpu.used == core.used && first == cpu.used,
           "%s [%s]: rows differ from the CPU backend's (%zu of %zu bytes; first difference at byte %zu)", name,
           pipeline, core.used, cpu.used, first);
    printf("  %-40s %-58s %zu packets, bit-identical\n", name, pipeline, cpu.packets);
    outputs_free(&cpu);
    outputs_free(&core);
}

static void check_settings(void)
{
    /* no settings, or empty ones: the defaults */
    const char *accepted[] = {NULL, "", ","};
    for (size_t i = 0; i < sizeof accepted / sizeof *accepted; i++) {
        sf_backend *be = NULL;
        const sf_backend_options opts = {.settings = accepted[i]};
        CHECK_OK(sf_backend_create_opts("cpu", &opts, &be));
        CHECK(be != NULL && be->precision == SF_PRECISION_F32);
        sf_backend_free(be);
    }
    /* anything else is refused by its key */
    static const struct {
        const char *settings, *key;
    } refused[] = {{"x=1", "'x'"}, {"gemm=lt,qkv=f32", "'gemm'"}, {"profile", "'profile'"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        sf_backend *be = (sf_backend *)&be; /* not NULL: the call must clear it */
        const sf_backend_options opts = {.settings = refused[i].settings};
        const int rc = sf_backend_create_opts("cpu", &opts, &be);
        CHECKF(rc == SF_E_OPTION && be == NULL, "cpu settings \"%s\": %d", refused[i].settings, rc);
        CHECKF(strstr(sf_last_error(), refused[i].key) != NULL, "cpu settings \"%s\": %s", refused[i].settings,
               sf_last_error());
    }
    /* NULL options are the defaults; threads pass through */
    sf_backend *be = NULL;
    CHECK_OK(sf_backend_create_opts("cpu", NULL, &be));
    sf_backend_free(be);
    const sf_backend_options two = {.threads = 2};
    CHECK_OK(sf_backend_create_opts("cpu", &two, &be));
    CHECK(be && be->threads == 2);
    sf_backend_free(be);
    /* through a graph */
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    sf_model *m = NULL;
    CHECK_OK(sf_model_create_random(&cfg, 7, &m));
    sf_graph *g = (sf_graph *)&g;
    const sf_graph_options gopts = {.backend_settings = "x=1"};
    CHECK(sf_graph_create(m, &gopts, &g) == SF_E_OPTION && g == NULL);
    CHECKF(strstr(sf_last_error(), "'x'") != NULL, "graph with cpu settings x=1: %s", sf_last_error());
    sf_model_free(m);
}

int main(void)
{
    sf_backend *cpu = NULL;
    CHECK_OK(sf_backend_create("cpu", 0, &cpu));
    if (!cpu) return check_finish("test_core_backend");
    make_core_ops(cpu->ops);
    sf_backend_free(cpu);

    check_settings();

    /* the binary's default model */
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    sf_model *m = NULL;
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &m));
    if (m) {
        compare("default model", m, "segment ! embed ! block ! norm", 1);
        compare("default model, bf16 out", m, "segment ! embed ! block ! norm dtype=bf16", 2);
        compare("default model, a stage per layer", m, "segment ! embed ! block layers=0 ! block layers=1 ! norm", 1);
        sf_model_free(m);
    }
    static const check_model_variant variants[] = {
        {"linear memory, globals, 2 layers, MLP", "8:1,32:2", 24, 3, 8, 2, 1, 40, 6, 2, 1, 32, SF_MEMORY_LINEAR},
        {"no memory, globals 4/4, MLP", "16:1,32:4", 16, 2, 8, 2, 1, 24, 4, 4, 0, 32, SF_MEMORY_NONE},
        {"delta, globals, 3 layers, non-causal", "8:1,16:2,32:4", 20, 2, 12, 3, 0, 28, 8, 4, 1, 32, SF_MEMORY_DELTA},
        {"delta, no MLP, uncovered heads", "16:2", 24, 3, 8, 1, 1, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const check_model_variant *v = &variants[i];
        CHECK_OK(check_variant_model(v, 900 + i, &m));
        if (!m) continue;
        compare(v->name, m, "segment ! embed ! block ! norm", 2);
        compare(v->name, m, "segment ! embed ! block batch=3 ! norm", 3);
        if (v->layers > 1)
            compare(v->name, m,
                    v->layers == 2 ? "segment ! embed ! block layers=0 ! block layers=1 ! norm"
                                   : "segment ! embed ! block layers=0 ! block layers=1-2 ! norm",
                    1);
        sf_model_free(m);
    }
    return check_finish("test_core_backend");
}
