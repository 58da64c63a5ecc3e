/* Rank discovery from crafted launcher environments (pipeline/launcher.h). */
#include <string.h>

#include "pipeline/launcher.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

static int detected(const char *const *envp, const char *which, int rank, int world, int local)
{
    sf_launch_info info;
    int rc = sf_launcher_detect(envp, &info);
    int ok = rc == SF_OK && strcmp(info.which, which) == 0 && info.rank == rank && info.world == world &&
             info.local_rank == local;
    if (!ok)
        fprintf(stderr, "  rc %d '%s': %s rank %d world %d local %d\n", rc, sf_last_error(), info.which, info.rank,
                info.world, info.local_rank);
    return ok;
}

static int detect_fails(const char *const *envp, const char *mentions)
{
    sf_launch_info info;
    int rc = sf_launcher_detect(envp, &info);
    int ok = rc == SF_E_INVAL && strstr(sf_last_error(), mentions) != NULL;
    if (!ok) fprintf(stderr, "  rc %d '%s' (wanted '%s')\n", rc, sf_last_error(), mentions);
    return ok;
}

static void check_each_launcher(void)
{
    CHECK(detected(ENV("HOME=/root", "PATH=/bin"), "none", -1, -1, -1));
    CHECK(detected(NULL, "none", -1, -1, -1));
    CHECK(detected(ENV("SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=1"), "slurm", 3, 8, 1));
    CHECK(detected(ENV("OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=6", "OMPI_COMM_WORLD_LOCAL_RANK=2"), "openmpi", 5,
                   6, 2));
    CHECK(detected(ENV("PMIX_RANK=2"), "pmix", 2, -1, -1));
    CHECK(detected(ENV("PMIX_RANK=2", "PMIX_SIZE=4"), "pmix", 2, 4, -1));
    CHECK(detected(ENV("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=10.0.0.7", "MASTER_PORT=29500"),
                   "torchrun", 1, 2, 1));
    CHECK(detected(ENV("JOB_COMPLETION_INDEX=4"), "kubernetes", 4, -1, -1));
    /* RANK alone is too generic a name to mean torchrun */
    CHECK(detected(ENV("RANK=3"), "none", -1, -1, -1));

    sf_launch_info info;
    CHECK_OK(sf_launcher_detect(ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=head", "MASTER_PORT=29500"), &info));
    CHECK(strcmp(info.rendezvous, "tcp://head:29500") == 0);
    CHECK_OK(sf_launcher_detect(ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=fd00::1", "MASTER_PORT=29500"), &info));
    CHECK(strcmp(info.rendezvous, "tcp://[fd00::1]:29500") == 0);
    CHECK_OK(sf_launcher_detect(ENV("SLURM_PROCID=0", "MASTER_ADDR=head", "MASTER_PORT=1"), &info));
    CHECK(info.rendezvous[0] == '\0'); /* MASTER_* belong to torchrun only */
    /* the first of a variable given twice, as getenv */
    CHECK(detected(ENV("SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_PROCID=2"), "slurm", 1, 4, -1));
}

static void check_bad_values(void)
{
    CHECK(detect_fails(ENV("SLURM_PROCID=x"), "launcher variable SLURM_PROCID=x: expected an integer >= 0"));
    CHECK(detect_fails(ENV("SLURM_PROCID=-1"), "SLURM_PROCID=-1"));
    CHECK(detect_fails(ENV("SLURM_PROCID="), "SLURM_PROCID is empty"));
    CHECK(detect_fails(ENV("SLURM_PROCID=99999999999"), "SLURM_PROCID=99999999999"));
    CHECK(detect_fails(ENV("SLURM_PROCID=4", "SLURM_NTASKS=4"), "slurm: SLURM_PROCID=4 is not below SLURM_NTASKS=4"));
    CHECK(detect_fails(ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000"), "MASTER_PORT=70000"));
    CHECK(detect_fails(ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h"), "MASTER_ADDR and MASTER_PORT must both be set"));
}

/* Two launchers counting the same processes must agree; one counting others is an outer one. */
static void check_precedence(void)
{
    /* srun --mpi=pmix: both describe this process */
    CHECK(detected(ENV("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "PMIX_RANK=3"), "pmix", 3, 4, 1));
    CHECK(detect_fails(ENV("SLURM_PROCID=2", "SLURM_NTASKS=4", "PMIX_RANK=3"),
                       "launchers disagree: pmix says rank 3 (PMIX_RANK=3) but slurm says rank 2 (SLURM_PROCID=2)"));
    /* Open MPI and its PMIx agree, or it is an error naming both */
    CHECK(detected(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "PMIX_RANK=1"), "openmpi", 1, 2, -1));
    CHECK(detect_fails(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "PMIX_RANK=0"),
                       "openmpi says rank 1 (OMPI_COMM_WORLD_RANK=1) but pmix says rank 0 (PMIX_RANK=0)"));
    /* srun starting one torchrun per node: slurm counts 2 tasks, torchrun 16 workers */
    CHECK(detected(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "RANK=13", "WORLD_SIZE=16", "LOCAL_RANK=5"),
                   "torchrun", 13, 16, 5));
    /* the same world size but another rank: a real disagreement */
    CHECK(detect_fails(ENV("SLURM_PROCID=1", "SLURM_NTASKS=16", "RANK=13", "WORLD_SIZE=16"),
                       "torchrun says rank 13 (RANK=13) but slurm says rank 1 (SLURM_PROCID=1)"));
    /* torchrun in the pods of an indexed Job: the pod's index is not this worker's rank */
    CHECK(detected(ENV("JOB_COMPLETION_INDEX=2", "RANK=9", "WORLD_SIZE=16", "LOCAL_RANK=1"), "torchrun", 9, 16, 1));
}

static int resolved(const char *const *envp, sf_launch_overrides o, const char *which, int rank, int world, int local)
{
    sf_launch_info info;
    int rc = sf_launcher_resolve(envp, &o, &info);
    int ok = rc == SF_OK && strcmp(info.which, which) == 0 && info.rank == rank && info.world == world &&
             info.local_rank == local;
    if (!ok)
        fprintf(stderr, "  rc %d '%s': %s rank %d world %d local %d\n", rc, sf_last_error(), info.which, info.rank,
                info.world, info.local_rank);
    return ok;
}

static int resolve_fails(const char *const *envp, sf_launch_overrides o, const char *mentions)
{
    sf_launch_info info;
    int rc = sf_launcher_resolve(envp, &o, &info);
    int ok = rc == SF_E_INVAL && strstr(sf_last_error(), mentions) != NULL;
    if (!ok) fprintf(stderr, "  rc %d '%s' (wanted '%s')\n", rc, sf_last_error(), mentions);
    return ok;
}

static void check_overrides(void)
{
    const sf_launch_overrides none = SF_LAUNCH_OVERRIDES_NONE;
    sf_launch_overrides o = none;
    /* Kubernetes: the world is the topology's */
    o.topology_world = 6;
    CHECK(resolved(ENV("JOB_COMPLETION_INDEX=4"), o, "kubernetes", 4, 6, 0));
    CHECK(resolve_fails(ENV("JOB_COMPLETION_INDEX=6"), o, "rank 6 (from kubernetes) is not below the world size 6 (from the topology)"));
    CHECK(resolve_fails(ENV("SLURM_PROCID=1", "SLURM_NTASKS=4"), o, "the topology has 6 ranks but slurm says the world is 4"));
    CHECK(resolve_fails(ENV("PATH=/bin"), o, "this process's rank is unknown"));
    /* explicit options win, and make a broken environment irrelevant */
    o = none;
    o.rank = 2;
    CHECK(resolved(ENV("SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=1"), o, "slurm", 2, 4, 1));
    o.world = 3;
    CHECK(resolved(ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "PMIX_RANK=0"), o, "explicit", 2, 3, 0));
    o = none;
    o.rank = 2;
    CHECK(resolve_fails(ENV("SLURM_PROCID=x"), o, "SLURM_PROCID=x"));
    CHECK(resolve_fails(ENV("PATH=/bin"), o, "the world size is unknown (rank 2 from --rank)"));
    o.world = 2;
    CHECK(resolve_fails(NULL, o, "rank 2 (from --rank) is not below the world size 2 (from --world)"));
    o.world = 0;
    CHECK(resolve_fails(NULL, o, "--world >= 1"));
}

int main(void)
{
    check_each_launcher();
    check_bad_values();
    check_precedence();
    check_overrides();
    return check_finish("test_launcher");
}
