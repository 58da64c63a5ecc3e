/* Checkpoint and resume through the binary: runs SIGKILLed at pseudo-random moments (fixed
 * seed) and after a given number of checkpoints, then resumed until they finish, must leave
 * output identical byte for byte to an uninterrupted run; a bit-flipped or truncated newest
 * checkpoint is reported on one stderr line and the previous one used; --resume without any
 * checkpoint starts fresh (and says so); every checkpoint damaged, a changed configuration, a
 * pipe on stdin and stdout as output are refused with one line. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "state/checkpoint.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/spawn.h"

/* A small built-in model so that a whole run takes about a second even under sanitizers. */
#define MODEL_ARGS "--segment", "64", "--branches", "16:1,32:2,64:4", "--dim", "32", "--heads", "2", \
                   "--head-dim", "16", "--layers", "2", "--mlp", "64", "--global-tokens", "8",       \
                   "--summary-tokens", "2", "-t", "1", "-q"
#define INPUT_BYTES 8192

static char input_path[512], ref_path[512], out_path[512], ckpt_dir[512], err_path[512];

static void remove_dir(const char *dir)
{
    char lock[600];
    snprintf(lock, sizeof lock, "%s/seqflow.lock", dir);
    sf_checkpoint_clear(dir);
    unlink(lock);
    rmdir(dir);
}

static void remove_outputs(void)
{
    char partial[600];
    snprintf(partial, sizeof partial, "%s.partial", out_path);
    unlink(out_path);
    unlink(partial);
}

/* argv of a checkpointed run writing out_path; resume adds --resume. */
#define CKPT_ARGV(resume_flag)                                                                              \
    {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", out_path, "--checkpoint", ckpt_dir,             \
     "--checkpoint-every", "4", resume_flag, NULL}

static int run_to_end(int resume, spawn_result *r)
{
    const char *with[] = CKPT_ARGV("--resume");
    const char *without[] = CKPT_ARGV(NULL);
    return spawn_run(resume ? with : without, NULL, 0, r);
}

static uint64_t newest_checkpoint(void)
{
    uint64_t *seqs, newest = 0;
    size_t n;
    if (sf_checkpoint_list(ckpt_dir, &seqs, &n) == SF_OK && n) newest = seqs[n - 1];
    free(seqs);
    return newest;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Starts a run, waits until checkpoint `after` exists (when after > 0), then delay_us more,
 * and SIGKILLs it. Kill points are tied to progress rather than to wall time alone so that they
 * land inside the run on fast and slow machines alike. Returns the exit code (137 when the kill
 * landed, 0 when the run finished first). */
static int kill_after(const char *const *argv, long delay_us, uint64_t after)
{
    int stdin_fd;
    int pid = spawn_start(argv, &stdin_fd, err_path);
    if (pid < 0) return -1;
    for (int waited = 0; after && waited < 40000 && newest_checkpoint() < after; waited++) sleep_us(250);
    sleep_us(delay_us);
    kill(pid, SIGKILL);
    int code = spawn_wait(pid);
    close(stdin_fd);
    return code;
}

/* kill_after for the checkpointed run (CKPT_ARGV), resumed or not. */
static int run_and_kill(int resume, long delay_us, uint64_t after)
{
    const char *with[] = CKPT_ARGV("--resume");
    const char *without[] = CKPT_ARGV(NULL);
    return kill_after(resume ? with : without, delay_us, after);
}

static int same_as_reference(void)
{
    size_t a_len = 0, b_len = 0;
    unsigned char *a = check_read_file(ref_path, &a_len), *b = check_read_file(out_path, &b_len);
    int same = a && b && a_len == b_len && memcmp(a, b, a_len) == 0;
    free(a);
    free(b);
    return same;
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        n += strstr(buf, needle) != NULL;
        line += len + (end != NULL);
    }
    return n;
}

/* Damages the newest checkpoint (flip one payload bit, or truncate), then resumes. */
static void damaged_newest(int truncate_it, check_rng *rng)
{
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(run_and_kill(0, 0, 6) == 137);
    uint64_t newest = newest_checkpoint();
    CHECKF(newest >= 6, "newest checkpoint %llu", (unsigned long long)newest);
    char path[1024];
    CHECK_OK(sf_checkpoint_path(ckpt_dir, newest, path, sizeof path));
    size_t len;
    unsigned char *data = check_read_file(path, &len);
    CHECK(data && len > SF_FRAME_HEADER_SIZE + 8);
    if (!data) return;
    FILE *f = fopen(path, "wb");
    if (truncate_it) {
        fwrite(data, 1, len / 2, f);
    } else {
        size_t at = SF_FRAME_HEADER_SIZE + check_rng_next(rng) % (len - SF_FRAME_HEADER_SIZE);
        data[at] ^= (unsigned char)(1u << (check_rng_next(rng) % 8));
        fwrite(data, 1, len, f);
    }
    fclose(f);
    free(data);
    spawn_result r;
    CHECK(run_to_end(1, &r) == 0);
    CHECKF(r.exit_code == 0, "resume after a damaged checkpoint: exit %d: %s", r.exit_code, r.err);
    CHECKF(r.err_lines == 1 && count_lines_with(r.err, "damaged") == 1 && strstr(r.err, path),
           "expected one line naming %s, got: %s", path, r.err);
    CHECKF(same_as_reference(), "output after resuming past a %s checkpoint differs",
           truncate_it ? "truncated" : "bit-flipped");
}

int main(void)
{
    if (!spawn_binary()) return check_skip("SEQFLOW_BIN is not set");
    snprintf(input_path, sizeof input_path, "%s", check_tmp_path("ckpt_input.txt"));
    snprintf(ref_path, sizeof ref_path, "%s", check_tmp_path("ckpt_ref.raw"));
    snprintf(out_path, sizeof out_path, "%s", check_tmp_path("ckpt_out.raw"));
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s", check_tmp_path("ckpt_dir"));
    snprintf(err_path, sizeof err_path, "%s", check_tmp_path("ckpt_stderr.txt"));

    /* printable text with word structure, from a fixed seed */
    check_rng rng = {20261122};
    FILE *f = fopen(input_path, "wb");
    for (int i = 0; i < INPUT_BYTES; i++) {
        uint64_t v = check_rng_next(&rng) % 32;
        fputc(v < 5 ? ' ' : v == 5 ? '\n' : 'a' + (int)(v - 6), f);
    }
    fclose(f);

    spawn_result r;
    const char *ref_argv[] = {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", ref_path, NULL};
    CHECK(spawn_run(ref_argv, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0, "reference run: %s", r.err);
    size_t ref_len;
    free(check_read_file(ref_path, &ref_len));
    CHECKF(ref_len == (size_t)INPUT_BYTES * 32 * sizeof(float), "reference output has %zu bytes", ref_len);

    /* checkpointing itself changes nothing; the directory keeps the newest 3 */
    remove_dir(ckpt_dir);
    remove_outputs();
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    CHECK(run_to_end(0, &r) == 0);
    clock_gettime(CLOCK_MONOTONIC, &end);
    long run_us = (end.tv_sec - start.tv_sec) * 1000000L + (end.tv_nsec - start.tv_nsec) / 1000;
    CHECKF(r.exit_code == 0, "checkpointed run: %s", r.err);
    CHECK(same_as_reference());
    uint64_t *seqs;
    size_t n;
    CHECK_OK(sf_checkpoint_list(ckpt_dir, &seqs, &n));
    /* 8192 tokens / (4 x 64) = 32 interval markers, plus the one after the end of input */
    CHECKF(n == 3 && seqs[2] == 33, "%zu checkpoints, newest %llu", n, n ? (unsigned long long)seqs[n - 1] : 0ull);
    free(seqs);
    char partial[600];
    snprintf(partial, sizeof partial, "%s.partial", out_path);
    CHECK(!check_path_exists(partial));

    /* resuming a finished run changes nothing, and says that the run had finished (one line,
     * no "0 tokens" summary: MODEL_ARGS has -q, so check that without it too) */
    CHECK(run_to_end(1, &r) == 0);
    CHECKF(r.exit_code == 0 && same_as_reference(), "resume of a finished run: %s", r.err);
    CHECKF(r.err_lines == 1 && strstr(r.err, "had finished"), "resume of a finished run says: %s", r.err);
    {
        const char *with_q[] = CKPT_ARGV("--resume");
        const char *argv2[64];
        size_t k = 0;
        for (size_t i = 0; with_q[i] && k < 63; i++)
            if (strcmp(with_q[i], "-q") != 0) argv2[k++] = with_q[i]; /* the summary line must not appear */
        argv2[k] = NULL;
        CHECK(spawn_run(argv2, NULL, 0, &r) == 0);
        CHECKF(r.exit_code == 0 && r.err_lines == 1 && strstr(r.err, "had finished") && !strstr(r.err, "tokens in"),
               "resume of a finished run without -q: %s", r.err);
        CHECK(same_as_reference());
    }

    /* SIGKILL at pseudo-random moments: after a random checkpoint plus a random part of one
     * checkpoint interval (so inside segment processing, output writes and checkpoint writes
     * alike), or early after the start (trial 0); resume, kill again, resume to the end: the
     * same bytes every time */
    long interval_us = run_us / 33;
    int total_kills = 0;
    for (int trial = 0; trial < 4; trial++) {
        remove_dir(ckpt_dir);
        remove_outputs();
        int kills = 0;
        uint64_t first = trial == 0 ? 0 : 1 + check_rng_next(&rng) % 15;
        long delay = (long)(check_rng_uniform(&rng) * (double)interval_us * (trial == 0 ? 2 : 1));
        int code = run_and_kill(0, delay, first);
        kills += code == 137;
        uint64_t second = newest_checkpoint() + 1 + check_rng_next(&rng) % 12;
        code = run_and_kill(1, (long)(check_rng_uniform(&rng) * (double)interval_us), second);
        kills += code == 137;
        CHECK(code == 137 || code == 0);
        CHECK(run_to_end(1, &r) == 0);
        CHECKF(r.exit_code == 0, "trial %d: final resume exited %d: %s", trial, r.exit_code, r.err);
        CHECKF(same_as_reference(), "trial %d (%d kills landed): output differs from the uninterrupted run", trial,
               kills);
        CHECK(!check_path_exists(partial));
        total_kills += kills;
    }
    /* every kill point lies at least a few intervals before the end; allow for a stalled killer */
    CHECKF(total_kills >= 6, "only %d of 8 kills landed before the run finished", total_kills);

    /* one run per directory: a second run on the directory of a live (here stopped) run fails
     * at once naming its PID; after kill -9 of the holder the resume goes on */
    {
        remove_dir(ckpt_dir);
        remove_outputs();
        const char *first[] = CKPT_ARGV(NULL);
        int stdin_fd, pid = spawn_start(first, &stdin_fd, err_path);
        CHECK(pid > 0);
        for (int waited = 0; waited < 40000 && newest_checkpoint() < 2; waited++) sleep_us(250);
        kill(pid, SIGSTOP);
        const char *second[] = CKPT_ARGV("--resume");
        CHECK(spawn_run(second, NULL, 0, &r) == 0);
        char holder[32];
        snprintf(holder, sizeof holder, "PID %d", pid);
        CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "in use") && strstr(r.err, holder),
               "second run on a locked directory: exit %d: %s", r.exit_code, r.err);
        kill(pid, SIGKILL);
        CHECK(spawn_wait(pid) == 137);
        close(stdin_fd);
        CHECK(run_to_end(1, &r) == 0);
        CHECKF(r.exit_code == 0 && same_as_reference(), "resume after kill -9 of the lock holder: %s", r.err);
    }

    damaged_newest(0, &rng);
    damaged_newest(1, &rng);

    /* every checkpoint damaged: refused, not silently restarted */
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(run_and_kill(0, 0, 3) == 137);
    CHECK_OK(sf_checkpoint_list(ckpt_dir, &seqs, &n));
    for (size_t i = 0; i < n; i++) {
        char path[1024];
        sf_checkpoint_path(ckpt_dir, seqs[i], path, sizeof path);
        CHECK(truncate(path, 10) == 0);
    }
    free(seqs);
    CHECK(run_to_end(1, &r) == 0);
    CHECKF(r.exit_code == 1 && count_lines_with(r.err, "no valid checkpoint") == 1,
           "all damaged: exit %d: %s", r.exit_code, r.err);

    /* --resume with no checkpoint: starts from the beginning and says so */
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(run_to_end(1, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 1 && strstr(r.err, "no checkpoint"), "fresh resume: %s", r.err);
    CHECK(same_as_reference());

    /* a different configuration is refused */
    remove_outputs();
    CHECK(run_and_kill(0, 0, 3) == 137);
    const char *other[] = {"seqflow", "run", MODEL_ARGS, "--layers", "1", "-i", input_path, "-o", out_path,
                           "--checkpoint", ckpt_dir, "--resume", NULL};
    CHECK(spawn_run(other, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "different model configuration") && strstr(r.err, "L=1"),
           "changed config: %s", r.err);

    /* another built-in seed (other weights, same configuration) is refused, naming the weights */
    const char *seed[] = {"seqflow", "run", MODEL_ARGS, "--seed", "99", "-i", input_path, "-o", out_path,
                          "--checkpoint", ckpt_dir, "--resume", NULL};
    CHECK(spawn_run(seed, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "weights differ"), "changed seed: %s", r.err);

    /* another sink format is refused, naming the sink stage */
    const char *fmt[] = {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", out_path, "--sink-format", "npy",
                         "--checkpoint", ckpt_dir, "--resume", NULL};
    CHECK(spawn_run(fmt, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "different sink stage") && strstr(r.err, "format=npy"),
           "changed sink format: %s", r.err);

    /* the input changed inside the part read before the checkpoint: refused, naming the input;
     * the original input again: resumed */
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(run_and_kill(0, 0, 3) == 137);
    CHECK(newest_checkpoint() >= 3 && newest_checkpoint() < 33);
    {
        size_t in_len;
        unsigned char *orig = check_read_file(input_path, &in_len);
        CHECK(orig && in_len == INPUT_BYTES);
        unsigned char *edited = malloc(in_len);
        memcpy(edited, orig, in_len);
        edited[10] ^= 1;
        FILE *w = fopen(input_path, "wb");
        fwrite(edited, 1, in_len, w);
        fclose(w);
        CHECK(run_to_end(1, &r) == 0);
        CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "changed") && strstr(r.err, input_path),
               "edited input: %s", r.err);
        /* back to the original: the same checkpoints resume */
        w = fopen(input_path, "wb");
        fwrite(orig, 1, in_len, w);
        fclose(w);
        CHECK(run_to_end(1, &r) == 0);
        CHECKF(r.exit_code == 0 && same_as_reference(), "resume with the original input again: %s", r.err);
        free(orig);
        free(edited);
    }

    /* stdin from a pipe cannot be resumed; stdout cannot be taken back: usage errors (exit 2),
     * refused before any work */
    const char *piped[] = {"seqflow", "run", MODEL_ARGS, "-i", "-", "-o", out_path, "--checkpoint", ckpt_dir, NULL};
    int stdin_fd, pid = spawn_start(piped, &stdin_fd, err_path);
    CHECK(pid > 0);
    if (pid > 0) {
        /* the run may refuse, and exit, before it reads: then the write meets a closed pipe
         * (EPIPE, not SIGPIPE, which would kill the test), and that is the expected outcome */
        void (*was)(int) = signal(SIGPIPE, SIG_IGN);
        ssize_t wrote = write(stdin_fd, "abc", 3);
        (void)wrote;
        signal(SIGPIPE, was);
        close(stdin_fd);
        CHECK(spawn_wait(pid) == 2);
        size_t len;
        char *err = (char *)check_read_file(err_path, &len);
        CHECKF(err && strstr(err, "standard input") && count_lines_with(err, "seqflow:") == 1, "pipe: %s",
               err ? err : "");
        free(err);
    }
    const char *to_stdout[] = {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", "-", "--checkpoint", ckpt_dir, NULL};
    CHECK(spawn_run(to_stdout, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 2 && r.err_lines == 1 && strstr(r.err, "standard output"), "stdout: %s", r.err);
    const char *no_dir[] = {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", out_path, "--resume", NULL};
    CHECK(spawn_run(no_dir, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 2 && r.err_lines == 1, "--resume without --checkpoint: %d %s", r.exit_code, r.err);

    /* a segment stage with its own length: markers fall on its boundaries (every 4 x 32 tokens,
     * not 4 x the model's 64), zstd checkpoint frames, and a kill + resume still loses nothing */
    const char *seg32_ref[] = {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", ref_path,
                               "segment length=32 ! embed ! block ! norm", NULL};
    CHECK(spawn_run(seg32_ref, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0, "segment length=32 reference: %s", r.err);
#define SEG32_ARGV(resume_flag)                                                                          \
    {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", out_path, "--checkpoint", ckpt_dir,         \
     "--checkpoint-every", "4", "--checkpoint-codec", "zstd", "segment length=32 ! embed ! block ! norm", \
     resume_flag, NULL}
    const char *seg32[] = SEG32_ARGV(NULL), *seg32_resume[] = SEG32_ARGV("--resume");
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(spawn_run(seg32, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && same_as_reference(), "segment length=32 checkpointed: %s", r.err);
    uint64_t newest = newest_checkpoint();
    CHECKF(newest == 8192 / (4 * 32) + 1, "segment length=32: newest checkpoint %llu", (unsigned long long)newest);
    char newest_path[1024];
    CHECK_OK(sf_checkpoint_path(ckpt_dir, newest, newest_path, sizeof newest_path));
    size_t newest_len;
    unsigned char *frame = check_read_file(newest_path, &newest_len);
    CHECKF(frame && newest_len > SF_FRAME_HEADER_SIZE && frame[9] == SF_CODEC_ZSTD, "checkpoint codec byte %d",
           frame && newest_len > 9 ? frame[9] : -1);
    free(frame);
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(kill_after(seg32, 0, 20) == 137);
    CHECK(spawn_run(seg32_resume, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && same_as_reference(), "segment length=32 resumed: %s", r.err);

    /* bf16 output (--out-dtype bf16): a kill and a resume lose nothing either; resuming a float32
     * run's checkpoints with bf16 output is refused, not written as a mix */
    const char *bf16_ref[] = {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", ref_path, "--out-dtype", "bf16", NULL};
    CHECK(spawn_run(bf16_ref, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0, "bf16 reference: %s", r.err);
#define BF16_ARGV(resume_flag)                                                                                   {"seqflow", "run", MODEL_ARGS, "-i", input_path, "-o", out_path, "--checkpoint", ckpt_dir,                  "--checkpoint-every", "4", "--out-dtype", "bf16", resume_flag, NULL}
    const char *bf16_run[] = BF16_ARGV(NULL), *bf16_resume[] = BF16_ARGV("--resume");
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(kill_after(bf16_run, 0, 10) == 137);
    CHECK(spawn_run(bf16_resume, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && same_as_reference(), "bf16 output resumed: %s", r.err);
    remove_dir(ckpt_dir);
    remove_outputs();
    CHECK(run_and_kill(0, 0, 3) == 137); /* float32 output, checkpoints 1..3 at least */
    CHECK(spawn_run(bf16_resume, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 1 && r.err_lines == 1, "float32 checkpoints resumed with bf16 output: exit %d: %s", r.exit_code,
           r.err);

    remove_dir(ckpt_dir);
    remove_outputs();
    unlink(input_path);
    unlink(ref_path);
    unlink(err_path);
    return check_finish("test_checkpoint_resume");
}
