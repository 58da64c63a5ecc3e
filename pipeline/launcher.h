/* Which rank this process is, of how many, and where rank 0's rendezvous is, as told by the
 * launcher that started it: Slurm, Open MPI, PMIx, torchrun or a Kubernetes indexed Job. The
 * environment is passed in (`environ`, or a crafted array in tests): nothing here reads the process environment itself.
 *
 * Variables read (each a decimal integer >= 0; anything else is an error naming it):
 *   torchrun    RANK, WORLD_SIZE (both needed to count), LOCAL_RANK, MASTER_ADDR, MASTER_PORT
 *   openmpi     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
 *   pmix        PMIX_RANK; world from OMPI_COMM_WORLD_SIZE, else PMIX_SIZE, when present
 *   slurm       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 *   kubernetes  JOB_COMPLETION_INDEX (an indexed Job); world from the topology
 *
 * Precedence, innermost launcher first: torchrun > openmpi > pmix > slurm > kubernetes. The
 * first one present gives the answer (`which`). Every other one present is then compared:
 *   - when both know the world size and the sizes differ, the other one is an outer launcher
 *     describing other processes (srun starting one torchrun per node; mpirun inside an
 *     sbatch step) and is ignored;
 *   - otherwise both describe this process and must agree on the rank: a disagreement is
 *     SF_E_INVAL naming both launchers and both variables, e.g.
 *     "launchers disagree: torchrun says rank 3 (RANK=3) but slurm says rank 1 (SLURM_PROCID=1)".
 *     A world or local rank the first one lacks is taken from an agreeing one.
 *   - kubernetes counts only when no other launcher is present (a pod may run any of them, so
 *     its index is never compared).
 * Explicit options (--rank, --world, --local-rank) override all of this (sf_launcher_apply).
 * A variable given twice in envp counts once, the first (as the C library's lookup does). */
#ifndef SEQFLOW_PIPELINE_LAUNCHER_H
#define SEQFLOW_PIPELINE_LAUNCHER_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sf_launcher_kind {
    SF_LAUNCHER_NONE = 0,      /* nothing found: a single process, or explicit options only */
    SF_LAUNCHER_TORCHRUN,
    SF_LAUNCHER_OPENMPI,
    SF_LAUNCHER_PMIX,
    SF_LAUNCHER_SLURM,
    SF_LAUNCHER_KUBERNETES,
    SF_LAUNCHER_EXPLICIT       /* rank and world both from explicit options */
} sf_launcher_kind;

typedef struct sf_launch_info {
    sf_launcher_kind kind;
    const char *which;         /* "none", "torchrun", "openmpi", "pmix", "slurm", "kubernetes",
                                  "explicit": a static string */
    int rank;                  /* -1 when unknown */
    int world;                 /* -1 when unknown (kubernetes, pmix alone: the topology's) */
    int local_rank;            /* -1 when unknown */
    char rendezvous[300];      /* "tcp://MASTER_ADDR:MASTER_PORT" (torchrun; an IPv6 address
                                  in brackets), else "": the topology's then applies */
} sf_launch_info;

/* Reads envp (a NULL-terminated array of "NAME=value"; NULL reads as empty) into *out.
 * SF_OK also when no launcher is found (kind NONE, rank/world -1). Errors (SF_E_INVAL, *out
 * then describes nothing): a bad number, rank >= world, launchers that disagree. */
int sf_launcher_detect(const char *const *envp, sf_launch_info *out);

/* What the command line and the topology say; -1 = not given. */
typedef struct sf_launch_overrides {
    int rank, world, local_rank;
    int topology_world;        /* the topology's world size, checked against the launcher's */
} sf_launch_overrides;
#define SF_LAUNCH_OVERRIDES_NONE {-1, -1, -1, -1}

/* sf_launcher_detect, then the overrides: an explicit rank/world/local rank replaces the
 * environment's (when both rank and world are explicit, a launcher error in envp is ignored
 * and `which` is "explicit"); a missing world is the topology's; a world that differs from the
 * topology's is SF_E_INVAL naming both. Finally the rank must be known and < world (SF_E_INVAL
 * saying which option or variable to set). local_rank defaults to 0. */
int sf_launcher_resolve(const char *const *envp, const sf_launch_overrides *o, sf_launch_info *out);

#ifdef __cplusplus
}
#endif
#endif
