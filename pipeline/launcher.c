/* Rank discovery from a launcher's environment (pipeline/launcher.h). */
#include "pipeline/launcher.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "seqflow/error.h"

/* The value of name in envp (the first occurrence), or NULL. */
static const char *env_value(const char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

/* name's value as a decimal integer 0..INT_MAX into *out; -1 (and SF_OK) when unset. */
static int env_int(const char *const *envp, const char *name, int *out)
{
    *out = -1;
    const char *v = env_value(envp, name);
    if (!v) return SF_OK;
    long value = 0;
    const char *s = v;
    if (!*s) return sf_error(SF_E_INVAL, "launcher variable %s is empty: expected an integer >= 0", name);
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || value > INT_MAX / 10)
            return sf_error(SF_E_INVAL, "launcher variable %s=%s: expected an integer >= 0", name, v);
        value = value * 10 + (*s - '0');
        if (value > INT_MAX) return sf_error(SF_E_INVAL, "launcher variable %s=%s is too large", name, v);
    }
    *out = (int)value;
    return SF_OK;
}

/* What one launcher says about this process. */
typedef struct candidate {
    sf_launcher_kind kind;
    const char *which;
    const char *rank_var, *world_var, *local_var;
    int present;
    int rank, world, local_rank;
} candidate;

static const char *kind_name(sf_launcher_kind k)
{
    switch (k) {
    case SF_LAUNCHER_TORCHRUN: return "torchrun";
    case SF_LAUNCHER_OPENMPI: return "openmpi";
    case SF_LAUNCHER_PMIX: return "pmix";
    case SF_LAUNCHER_SLURM: return "slurm";
    case SF_LAUNCHER_KUBERNETES: return "kubernetes";
    case SF_LAUNCHER_EXPLICIT: return "explicit";
    default: return "none";
    }
}

static void info_clear(sf_launch_info *out)
{
    memset(out, 0, sizeof *out);
    out->kind = SF_LAUNCHER_NONE;
    out->which = kind_name(SF_LAUNCHER_NONE);
    out->rank = out->world = out->local_rank = -1;
}

static int read_candidate(const char *const *envp, candidate *c)
{
    int rc = env_int(envp, c->rank_var, &c->rank);
    if (rc == SF_OK && c->world_var) rc = env_int(envp, c->world_var, &c->world);
    if (rc == SF_OK && c->local_var) rc = env_int(envp, c->local_var, &c->local_rank);
    if (rc != SF_OK) return rc;
    if (!c->world_var) c->world = -1;
    if (!c->local_var) c->local_rank = -1;
    c->present = c->rank >= 0;
    if (c->present && c->world >= 0 && c->rank >= c->world)
        return sf_error(SF_E_INVAL, "%s: %s=%d is not below %s=%d", c->which, c->rank_var, c->rank, c->world_var,
                        c->world);
    return SF_OK;
}

/* torchrun's MASTER_ADDR and MASTER_PORT as a ZeroMQ endpoint. */
static int torchrun_rendezvous(const char *const *envp, sf_launch_info *out)
{
    const char *addr = env_value(envp, "MASTER_ADDR");
    const char *port = env_value(envp, "MASTER_PORT");
    if (!addr && !port) return SF_OK;
    if (!addr || !*addr || !port || !*port)
        return sf_error(SF_E_INVAL, "torchrun: MASTER_ADDR and MASTER_PORT must both be set (got %s=%s)",
                        addr ? "MASTER_ADDR" : "MASTER_PORT", addr ? addr : port);
    int p;
    int rc = env_int(envp, "MASTER_PORT", &p);
    if (rc != SF_OK) return rc;
    if (p < 1 || p > 65535) return sf_error(SF_E_INVAL, "torchrun: MASTER_PORT=%s is not a port (1..65535)", port);
    int v6 = strchr(addr, ':') != NULL && addr[0] != '[';
    int n = snprintf(out->rendezvous, sizeof out->rendezvous, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", addr, p);
    if (n < 0 || (size_t)n >= sizeof out->rendezvous) {
        out->rendezvous[0] = '\0';
        return sf_error(SF_E_INVAL, "torchrun: MASTER_ADDR is longer than %zu characters", sizeof out->rendezvous - 16);
    }
    return SF_OK;
}

int sf_launcher_detect(const char *const *envp, sf_launch_info *out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_launcher_detect: NULL argument");
    info_clear(out);
    /* precedence order: the innermost launcher first (launcher.h) */
    candidate c[5] = {
        {SF_LAUNCHER_TORCHRUN, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", 0, -1, -1, -1},
        {SF_LAUNCHER_OPENMPI, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", 0, -1, -1, -1},
        {SF_LAUNCHER_PMIX, "pmix", "PMIX_RANK", NULL, NULL, 0, -1, -1, -1},
        {SF_LAUNCHER_SLURM, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", 0, -1, -1, -1},
        {SF_LAUNCHER_KUBERNETES, "kubernetes", "JOB_COMPLETION_INDEX", NULL, NULL, 0, -1, -1, -1},
    };
    /* PMIx itself names no world size in the environment: Open MPI's, else PMIX_SIZE */
    if (env_value(envp, "OMPI_COMM_WORLD_SIZE"))
        c[2].world_var = "OMPI_COMM_WORLD_SIZE";
    else if (env_value(envp, "PMIX_SIZE"))
        c[2].world_var = "PMIX_SIZE";
    for (int i = 0; i < 5; i++) {
        /* torchrun's variable names are generic: it counts only with both RANK and WORLD_SIZE */
        if (i == 0 && (!env_value(envp, "RANK") || !env_value(envp, "WORLD_SIZE"))) continue;
        int rc = read_candidate(envp, &c[i]);
        if (rc != SF_OK) return rc;
    }
    int first = -1;
    for (int i = 0; i < 5 && first < 0; i++)
        if (c[i].present) first = i;
    if (first < 0) return SF_OK;
    candidate *p = &c[first];
    int world = p->world, local = p->local_rank;
    for (int i = first + 1; i < 5; i++) {
        const candidate *o = &c[i];
        /* a pod's index is the outermost of all: a pod may run any other launcher inside */
        if (!o->present || o->kind == SF_LAUNCHER_KUBERNETES) continue;
        /* an outer launcher counts other processes (one task per node, say): not this one's */
        if (p->world >= 0 && o->world >= 0 && o->world != p->world) continue;
        if (o->rank != p->rank)
            return sf_error(SF_E_INVAL, "launchers disagree: %s says rank %d (%s=%d) but %s says rank %d (%s=%d)",
                            p->which, p->rank, p->rank_var, p->rank, o->which, o->rank, o->rank_var, o->rank);
        if (world < 0) world = o->world;
        if (local < 0) local = o->local_rank;
    }
    if (first == 0) {
        int rc = torchrun_rendezvous(envp, out);
        if (rc != SF_OK) return rc;
    }
    out->kind = p->kind;
    out->which = p->which;
    out->rank = p->rank;
    out->world = world;
    out->local_rank = local;
    return SF_OK;
}

int sf_launcher_resolve(const char *const *envp, const sf_launch_overrides *o, sf_launch_info *out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_launcher_resolve: NULL argument");
    static const sf_launch_overrides none = SF_LAUNCH_OVERRIDES_NONE;
    if (!o) o = &none;
    if (o->rank < -1 || o->world < -1 || o->world == 0 || o->local_rank < -1)
        return sf_error(SF_E_INVAL, "--rank, --world and --local-rank take integers >= 0 (--world >= 1)");
    int rc = sf_launcher_detect(envp, out);
    if (rc != SF_OK) {
        /* both given explicitly: the environment is not needed, whatever is wrong with it */
        if (o->rank < 0 || o->world < 0) return rc;
        sf_clear_error();
        info_clear(out);
    }
    const char *rank_from = out->rank >= 0 ? out->which : NULL;
    const char *world_from = out->world >= 0 ? out->which : NULL;
    if (o->rank >= 0) out->rank = o->rank, rank_from = "--rank";
    if (o->world >= 0) out->world = o->world, world_from = "--world";
    if (o->local_rank >= 0) out->local_rank = o->local_rank;
    if (o->rank >= 0 && o->world >= 0) {
        out->kind = SF_LAUNCHER_EXPLICIT;
        out->which = kind_name(SF_LAUNCHER_EXPLICIT);
    }
    if (o->topology_world >= 0) {
        if (out->world < 0) {
            out->world = o->topology_world;
            world_from = "the topology";
        } else if (out->world != o->topology_world) {
            return sf_error(SF_E_INVAL, "the topology has %d ranks but %s says the world is %d", o->topology_world,
                            world_from, out->world);
        }
    }
    if (out->rank < 0)
        return sf_error(SF_E_INVAL, "this process's rank is unknown: no launcher variable found (SLURM_PROCID, "
                                    "OMPI_COMM_WORLD_RANK, PMIX_RANK, RANK, JOB_COMPLETION_INDEX); give --rank");
    if (out->world < 0)
        return sf_error(SF_E_INVAL, "the world size is unknown (rank %d from %s): give --world or a topology",
                        out->rank, rank_from);
    if (out->rank >= out->world)
        return sf_error(SF_E_INVAL, "rank %d (from %s) is not below the world size %d (from %s)", out->rank, rank_from,
                        out->world, world_from);
    if (out->local_rank < 0) out->local_rank = 0;
    return SF_OK;
}
