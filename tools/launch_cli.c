/* `seqflow launch`: N local `seqflow worker` processes with a generated topology, their signals
 * passed on, a worker that died started again when --restart allows it (docs/DISTRIBUTED.md,
 * "Starting a job" and "Checkpoints and faults"). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/process_stats.h"
#include "pipeline/distributed.h"
#include "pipeline/topology.h"
#include "tools/distributed_cli.h"
#include "tools/run_common.h"

static void launch_usage(FILE *f)
{
    fputs("usage: seqflow launch -n N [launch options] [--] [worker and run options] [PIPELINE]\n"
          "\n"
          "Starts N `seqflow worker` processes on this machine (ranks 0..N-1, RANK, WORLD_SIZE and\n"
          "LOCAL_RANK set) and waits for them. Without --topology it writes a topology of its own\n"
          "(ipc:// endpoints and fresh CURVE keys in a private temporary folder, removed at the\n"
          "end). The output is the one `seqflow run` gives for the pipeline without placements.\n"
          "\n"
          "launch options:\n"
          "  -n, --ranks N           processes to start (1..256)\n"
          "      --topology FILE     use this topology (its world must be N); give --key too\n"
          "      --timeout-ms MS     a generated topology's silent-peer timeout (default 3000)\n"
          "      --write-topology DIR  write a generated topology and keys into DIR (created, mode\n"
          "                          0700) and exit: for mpirun, srun or torchrun to start the\n"
          "                          workers (--topology DIR/topology.json --key DIR/rank{rank}.key)\n"
          "      --restart N         start a worker (rank 1..N-1) that died again, at most N times\n"
          "                          per rank (default 0), while the driver runs. With --checkpoint\n"
          "                          it rejoins the job, every rank rolls back to the newest\n"
          "                          checkpoint and the job goes on (--rejoin-timeout, seqflow worker\n"
          "                          --help); a dead driver (rank 0) still ends the job (--resume)\n"
          "\n"
          "Signals (SIGINT, SIGTERM, SIGHUP) are passed on to every worker. When a worker fails and\n"
          "is not started again, the driver is given the heartbeat timeout (plus the rejoin timeout\n"
          "and 5 s) to report it, then every worker still running is stopped. Without --restart,\n"
          "nothing would come back: the workers get --rejoin-timeout 0 unless it is given. The exit\n"
          "status is the driver's when it failed, else the first failed worker's (128+N for signal\n"
          "N), else 0.\n",
          f);
}

/* ---- seqflow launch ------------------------------------------------------------------------ */

#define LAUNCH_MAX 256

static pid_t children[LAUNCH_MAX];
static int n_children;
static volatile sig_atomic_t launch_signal;

/* Passes the signal on to every worker; they stop as `seqflow run` does. */
static void on_launch_signal(int sig)
{
    launch_signal = sig;
    for (int i = 0; i < n_children; i++)
        if (children[i] > 0) kill(children[i], sig);
}

static int write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return sf_error(SF_E_IO, "cannot write '%s': %s", path, strerror(errno));
    size_t len = strlen(text), at = 0;
    while (at < len) {
        ssize_t n = write(fd, text + at, len - at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            return sf_error(SF_E_IO, "cannot write '%s': %s", path, strerror(errno));
        }
        at += (size_t)n;
    }
    return close(fd) == 0 ? SF_OK : sf_error(SF_E_IO, "cannot write '%s': %s", path, strerror(errno));
}

/* DIR/topology.json (ipc:// endpoints in DIR, CURVE) and DIR/rankR.key for n ranks. */
static int write_topology(const char *dir, int n, int timeout_ms)
{
    size_t size = 1024 + (size_t)n * (2 * strlen(dir) + 200);
    char *json = malloc(size);
    if (!json) return sf_error(SF_E_NOMEM, "out of memory");
    size_t used = (size_t)snprintf(json, size,
                                   "{\n  \"version\": 1,\n  \"security\": \"curve\",\n  \"rendezvous\": \"ipc://%s/rendezvous\",\n"
                                   "  \"timeout_ms\": %d,\n  \"datacenters\": [{\"name\": \"local\", \"nodes\": [{\"name\": "
                                   "\"localhost\", \"ranks\": [\n",
                                   dir, timeout_ms);
    int rc = SF_OK;
    for (int r = 0; r < n && rc == SF_OK; r++) {
        char pub[SF_Z85_KEY_LEN + 1], sec[SF_Z85_KEY_LEN + 1], path[4200], line[64];
        rc = sf_curve_keypair(pub, sec);
        snprintf(path, sizeof path, "%s/rank%d.key", dir, r);
        snprintf(line, sizeof line, "%s\n", sec);
        if (rc == SF_OK) rc = write_file(path, line, 0600);
        memset(sec, 0, sizeof sec);
        memset(line, 0, sizeof line);
        used += (size_t)snprintf(json + used, size - used, "    {\"id\": %d, \"endpoint\": \"ipc://%s/rank%d\", \"public_key\": \"%s\"}%s\n",
                                 r, dir, r, pub, r + 1 < n ? "," : "");
    }
    snprintf(json + used, size - used, "  ]}]}]\n}\n");
    char path[4200];
    snprintf(path, sizeof path, "%s/topology.json", dir);
    if (rc == SF_OK) rc = write_file(path, json, 0644);
    free(json);
    return rc;
}

/* Removes what write_topology made (and the ipc sockets) and the folder. */
static void remove_topology(const char *dir, int n)
{
    char path[4200];
    for (int r = 0; r < n; r++) {
        snprintf(path, sizeof path, "%s/rank%d.key", dir, r);
        unlink(path);
        snprintf(path, sizeof path, "%s/rank%d", dir, r);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/topology.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/rendezvous", dir);
    unlink(path);
    rmdir(dir);
}

/* The -o/--out value among the forwarded arguments, or NULL. */
static const char *forwarded_out(int argc, char **argv)
{
    const char *out = NULL;
    for (int i = 0; i < argc; i++) {
        if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--out") == 0) && i + 1 < argc) out = argv[++i];
        else if (strncmp(argv[i], "--out=", 6) == 0) out = argv[i] + 6;
    }
    return out;
}

static int status_of(int wstatus)
{
    return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus) : 1;
}

static void stop_children(int sig)
{
    for (int i = 0; i < n_children; i++)
        if (children[i] > 0) {
            kill(children[i], sig);
            kill(children[i], SIGCONT); /* a stopped worker takes the signal too */
        }
}

/* The value of --NAME among the forwarded arguments ("--NAME V" or "--NAME=V"; the last one
 * counts, as for the worker), or NULL. */
static const char *forwarded_value(int argc, char **argv, const char *name)
{
    const char *value = NULL;
    const size_t len = strlen(name);
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], name) == 0 && i + 1 < argc) value = argv[++i];
        else if (strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') value = argv[i] + len + 1;
    }
    return value;
}

/* Starts rank r of n: `seqflow worker` with args, its launcher variables set. */
static pid_t spawn(int r, long long n, char **args)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    char value[32];
    snprintf(value, sizeof value, "%d", r);
    setenv("RANK", value, 1);
    setenv("LOCAL_RANK", value, 1);
    snprintf(value, sizeof value, "%lld", n);
    setenv("WORLD_SIZE", value, 1);
    /* OpenMP threads that spin while their process waits for packets would take the
     * cores the other ranks compute on */
    setenv("OMP_WAIT_POLICY", "passive", 0);
    /* an outer launcher's variables describe launch itself, not the workers */
    static const char *const outer[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                        "JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", NULL};
    for (const char *const *v = outer; *v; v++) unsetenv(*v);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    execv("/proc/self/exe", args);
    fprintf(stderr, "seqflow: cannot start a worker: %s\n", strerror(errno));
    _exit(127);
}

int cmd_launch(int argc, char **argv)
{
    long long n = 0, timeout_ms = 3000, restart = 0;
    const char *topology = NULL, *write_dir = NULL;
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            launch_usage(stdout);
            return 0;
        }
        const int has_value = i + 1 < argc;
        if ((strcmp(arg, "-n") == 0 || strcmp(arg, "--ranks") == 0) && has_value) {
            if (!parse_int_arg("-n", argv[++i], 1, LAUNCH_MAX, &n)) return 2;
        } else if (strcmp(arg, "--topology") == 0 && has_value) {
            topology = argv[++i];
        } else if (strcmp(arg, "--timeout-ms") == 0 && has_value) {
            if (!parse_int_arg("--timeout-ms", argv[++i], 100, 3600000, &timeout_ms)) return 2;
        } else if (strcmp(arg, "--restart") == 0 && has_value) {
            if (!parse_int_arg("--restart", argv[++i], 0, 1000000, &restart)) return 2;
        } else if (strcmp(arg, "--write-topology") == 0 && has_value) {
            write_dir = argv[++i];
        } else {
            break; /* the workers' options start here */
        }
    }
    if (n < 1) {
        fprintf(stderr, "seqflow: launch needs -n N (the number of processes)\nTry 'seqflow launch --help'.\n");
        return 2;
    }
    if (write_dir) {
        if (mkdir(write_dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "seqflow: cannot create '%s': %s\n", write_dir, strerror(errno));
            return 1;
        }
        if (write_topology(write_dir, (int)n, (int)timeout_ms) != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            return 1;
        }
        printf("%s/topology.json: %lld ranks; start each with: seqflow worker --topology %s/topology.json --key "
               "%s/rank{rank}.key [run options] [PIPELINE]\n", write_dir, n, write_dir, write_dir);
        return 0;
    }
    /* a private folder for the generated topology; ipc paths must stay short (sun_path) */
    char dir[64] = "";
    if (!topology) {
        snprintf(dir, sizeof dir, "/tmp/seqflow-launch-XXXXXX");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "seqflow: cannot create a temporary folder: %s\n", strerror(errno));
            return 1;
        }
        if (write_topology(dir, (int)n, (int)timeout_ms) != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            remove_topology(dir, (int)n);
            return 1;
        }
    }
    char topology_path[128], key_path[128];
    snprintf(topology_path, sizeof topology_path, "%s/topology.json", dir);
    snprintf(key_path, sizeof key_path, "%s/rank{rank}.key", dir);
    const int forwarded = argc - i;
    char **args = calloc((size_t)forwarded + 10, sizeof *args);
    if (!args) return 1;
    int a = 0;
    args[a++] = "seqflow";
    args[a++] = "worker";
    if (!topology) {
        args[a++] = "--topology";
        args[a++] = topology_path;
        args[a++] = "--key";
        args[a++] = key_path;
    } else {
        args[a++] = "--topology";
        args[a++] = (char *)topology;
    }
    /* how long the driver may wait for a lost worker: with --restart one comes back; without,
     * nothing would, and the job ends at once as it always did */
    const char *rejoin = forwarded_value(forwarded, argv + i, "--rejoin-timeout");
    if (!rejoin && !restart) {
        args[a++] = "--rejoin-timeout";
        args[a++] = "0";
    }
    const int checkpointed = forwarded_value(forwarded, argv + i, "--checkpoint") != NULL;
    const double rejoin_s = !checkpointed ? 0 : rejoin ? atof(rejoin) : restart ? 60 : 0;
    for (int k = 0; k < forwarded; k++) args[a++] = argv[i + k];
    args[a] = NULL;

    run_catch_stop_signals(on_launch_signal);
    fflush(NULL);
    n_children = (int)n;
    for (int r = 0; r < n; r++) {
        pid_t pid = spawn(r, n, args);
        if (pid < 0) {
            fprintf(stderr, "seqflow: cannot start rank %d: %s\n", r, strerror(errno));
            n_children = r;
            stop_children(SIGKILL);
            break;
        }
        children[r] = pid;
    }
    int statuses[LAUNCH_MAX], restarts[LAUNCH_MAX] = {0}, first_failed = -1, alive = n_children;
    pid_t driver_pid = children[0];
    double stop_at = 0, kill_at = 0;
    int after_success = 0; /* the stop follows the driver's success: the output is complete */
    for (int r = 0; r < n_children; r++) statuses[r] = -1;
    while (alive > 0) {
        int wstatus;
        pid_t pid = waitpid(-1, &wstatus, WNOHANG);
        if (pid > 0) {
            int r = 0;
            while (r < n_children && children[r] != pid) r++;
            if (r == n_children) continue;
            children[r] = 0;
            alive--;
            statuses[r] = status_of(wstatus);
            if (after_success && kill_at && statuses[r] != 0) {
                /* a worker that outlived a finished job by 10 s: stopped, the job stands */
                fprintf(stderr, "seqflow launch: rank %d did not exit after the job finished; stopped\n", r);
                statuses[r] = 0;
            }
            if (WIFSIGNALED(wstatus) && !launch_signal && !kill_at)
                fprintf(stderr, "seqflow launch: rank %d (pid %d) was killed by signal %d\n", r, (int)pid, WTERMSIG(wstatus));
            /* a worker that died while the driver runs: started again, to rejoin the job */
            if (statuses[r] != 0 && r > 0 && restarts[r] < restart && children[0] > 0 && !launch_signal && !stop_at) {
                fflush(NULL);
                pid_t again = spawn(r, n, args);
                if (again > 0) {
                    restarts[r]++;
                    children[r] = again;
                    alive++;
                    statuses[r] = -1;
                    fprintf(stderr, "seqflow launch: rank %d started again (pid %d; restart %d of %lld)\n", r, (int)again,
                            restarts[r], restart);
                    continue;
                }
                fprintf(stderr, "seqflow launch: cannot start rank %d again: %s\n", r, strerror(errno));
            }
            if (statuses[r] != 0 && first_failed < 0) first_failed = r;
            if (alive == 0) break;
            /* the driver gone: nothing more can be done; a worker gone: the driver names it within
             * its heartbeat timeout, then the rest stop */
            const double t = sf_monotonic_seconds();
            if (r == 0 && statuses[0] != 0 && !stop_at) stop_at = t;
            else if (r == 0 && !stop_at) stop_at = t + 10.0, after_success = 1; /* the workers finish on their own */
            else if (statuses[r] != 0 && !stop_at) stop_at = t + timeout_ms / 1000.0 + rejoin_s + 5.0;
            continue;
        }
        if (pid < 0 && errno != EINTR) break;
        const double t = sf_monotonic_seconds();
        if (stop_at && t >= stop_at && !kill_at) {
            stop_children(SIGTERM);
            kill_at = t + 2.0;
        }
        if (kill_at && t >= kill_at) {
            stop_children(SIGKILL);
            kill_at = t + 3600;
        }
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    /* a driver killed outright leaves its unfinished output (unless checkpointed: kept to resume) */
    const char *out = forwarded_out(forwarded, argv + i);
    if (statuses[0] > 128 && out && strcmp(out, "-") != 0) {
        char partial[4200];
        snprintf(partial, sizeof partial, "%s.partial-%d", out, (int)driver_pid);
        unlink(partial);
    }
    if (!topology) remove_topology(dir, (int)n);
    free(args);
    if (statuses[0] != 0 && statuses[0] != -1) return statuses[0];
    if (first_failed >= 0) {
        /* the driver succeeded (its output is whole), but a rank's failure is still the job's */
        fprintf(stderr, "seqflow launch: rank %d failed (exit status %d)%s\n", first_failed, statuses[first_failed],
                statuses[0] == 0 ? "; the driver finished: the output is complete" : "");
        return statuses[first_failed];
    }
    return launch_signal ? 128 + launch_signal : 0;
}
