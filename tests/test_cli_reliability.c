/* The binary under misuse: outputs that are devices, FIFOs, symlinks, full or closed pipes;
 * runs stopped by signals; impossible requests refused before any work with exit 2; messages
 * that say what is wrong. Device nodes are made with mknod inside the test's own temporary
 * directory, never in the machine's /dev. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/spawn.h"

static char dir[512];
static size_t row_bytes; /* bytes of one float32 output row of the default model */

/* dir/name, each in its own buffer (the test asks for fewer than 512; they are never reused,
 * so a path given to a later run stays valid) */
static const char *in_dir(const char *name)
{
    static char slots[512][1024];
    static int next;
    char *p = slots[next++ % 512];
    snprintf(p, sizeof slots[0], "%s/%s", dir, name);
    return p;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static mode_t lmode(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? st.st_mode & S_IFMT : 0;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

/* Entries of dir whose name starts with prefix (leftover temporary outputs). */
static int count_prefixed(const char *prefix)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '^%s' || true", dir, prefix);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

/* Starts the binary with in_fd / out_fd as standard input / output (-1: an empty file and a
 * file in dir) and stderr into dir/err.txt. Every other descriptor is closed in the child, so
 * a pipe end the test closed is really closed. */
static int start(const char *const *argv, int in_fd, int out_fd)
{
    const char *bin = spawn_binary();
    const char *empty = in_dir("empty.in"), *out = in_dir("stdout.txt"), *err = in_dir("err.txt");
    write_file(empty, NULL, 0);
    pid_t pid = fork();
    if (pid != 0) return (int)pid;
    int in = in_fd >= 0 ? in_fd : open(empty, O_RDONLY);
    int o = out_fd >= 0 ? out_fd : open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    signal(SIGPIPE, SIG_DFL);
    int n = 0;
    while (argv[n]) n++;
    char **args = calloc((size_t)n + 1, sizeof *args);
    args[0] = (char *)bin;
    for (int i = 1; i < n; i++) args[i] = (char *)argv[i];
    execv(bin, args);
    _exit(127);
}

/* The exit code (128 + signal when killed), or -1 when it ran past `seconds` (then killed). */
static int wait_for(int pid, double seconds)
{
    double until = now() + seconds;
    for (;;) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        sleep_s(0.01);
    }
}

static int still_running(int pid)
{
    int status;
    return waitpid(pid, &status, WNOHANG) == 0;
}

static char err_text[4096];

/* Runs to the end (at most `seconds`); err_text gets its stderr. */
static int run_fds(const char *const *argv, int in_fd, int out_fd, double seconds, double *elapsed)
{
    double t0 = now();
    int pid = start(argv, in_fd, out_fd);
    int code = wait_for(pid, seconds);
    if (elapsed) *elapsed = now() - t0;
    size_t len = 0;
    unsigned char *err = check_read_file(in_dir("err.txt"), &len);
    snprintf(err_text, sizeof err_text, "%s", err ? (const char *)err : "");
    free(err);
    return code;
}

static unsigned char *read_stdout(void)
{
    size_t len;
    return check_read_file(in_dir("stdout.txt"), &len);
}

static int run(const char *const *argv) { return run_fds(argv, -1, -1, 60, NULL); }

static int err_lines(void)
{
    int n = 0;
    for (const char *c = err_text; *c; c++) n += *c == '\n';
    return n;
}

/* A failure: the exit code, one line on stderr starting "seqflow: " and mentioning `needle`. */
#define EXPECT_FAIL(what, want_code, needle, ...)                                                              \
    do {                                                                                                       \
        int code_ = run((const char *[]){"seqflow", __VA_ARGS__, NULL});                                       \
        CHECKF(code_ == (want_code), "%s: exit %d, want %d: %s", what, code_, want_code, err_text);            \
        CHECKF(err_lines() == 1 && strncmp(err_text, "seqflow: ", 9) == 0, "%s: stderr: %s", what, err_text);  \
        CHECKF(strstr(err_text, needle) != NULL, "%s: stderr does not mention '%s': %s", what, needle, err_text); \
    } while (0)

/* ---- 1: outputs ---------------------------------------------------------------------------- */

static void test_outputs(int can_mknod)
{
    const char *text = in_dir("text.in");
    write_file(text, "hello, outputs", 14);
    const long want = 14 * (long)row_bytes;

    if (can_mknod) {
        /* a null device is written in place: still a device afterwards, no temporary left */
        const char *null_dev = in_dir("null");
        CHECK(run((const char *[]){"seqflow", "run", "-i", text, "-o", null_dev, "-q", NULL}) == 0);
        CHECKF(lmode(null_dev) == S_IFCHR, "-o onto a null device replaced it");
        CHECK(count_prefixed("null.partial") == 0);
        /* through a symlink too */
        CHECK(symlink(null_dev, in_dir("to-null")) == 0);
        CHECK(run((const char *[]){"seqflow", "run", "-i", text, "-o", in_dir("to-null"), "-q", NULL}) == 0);
        CHECK(lmode(in_dir("to-null")) == S_IFLNK && lmode(null_dev) == S_IFCHR);

        /* a full device fails the run with exit 1 for every format that writes, and stays */
        const char *full = in_dir("full");
        const char *formats[] = {"raw", "npy", "digest"};
        for (int i = 0; i < 3; i++) {
            int code = run((const char *[]){"seqflow", "run", "-i", text, "-o", full, "--sink-format", formats[i], "-q", NULL});
            CHECKF(code == 1, "--sink-format %s onto a full device: exit %d: %s", formats[i], code, err_text);
            CHECKF(err_lines() == 1 && strstr(err_text, "No space left"), "%s: %s", formats[i], err_text);
            CHECK(lmode(full) == S_IFCHR);
        }
        /* null writes nothing, so a full device cannot fail it; it must not replace it either */
        CHECK(run((const char *[]){"seqflow", "run", "-i", text, "-o", full, "--sink-format", "null", "-q", NULL}) == 0);
        CHECK(lmode(full) == S_IFCHR);
        CHECK(count_prefixed("full.partial") == 0);

        /* a full device as standard output: digest (the default) and raw '-' */
        int fd = open(full, O_WRONLY);
        CHECK(fd >= 0);
        int code = run_fds((const char *[]){"seqflow", "run", "-i", text, "-q", NULL}, -1, fd, 60, NULL);
        CHECKF(code == 1 && strstr(err_text, "standard output"), "digest onto a full stdout: exit %d: %s", code, err_text);
        code = run_fds((const char *[]){"seqflow", "run", "-i", text, "-o", "-", "-q", NULL}, -1, fd, 60, NULL);
        CHECKF(code == 1 && strstr(err_text, "standard output"), "raw onto a full stdout: exit %d: %s", code, err_text);
        close(fd);
    }

    /* a closed pipe on standard output: an error with exit 1, not a death by SIGPIPE */
    const char *sink_formats[] = {"digest", "raw"};
    for (int i = 0; i < 2; i++) {
        int p[2];
        CHECK(pipe(p) == 0);
        close(p[0]);
        int code = run_fds((const char *[]){"seqflow", "run", "-i", text, "-o", "-", "--sink-format", sink_formats[i], "-q", NULL},
                           -1, p[1], 60, NULL);
        close(p[1]);
        CHECKF(code == 1, "%s into a closed pipe: exit %d: %s", sink_formats[i], code, err_text);
        CHECKF(err_lines() == 1 && strstr(err_text, "Broken pipe"), "%s into a closed pipe: %s", sink_formats[i], err_text);
    }

    /* a FIFO is written in place, its reader gets every byte */
    const char *fifo = in_dir("out.fifo");
    CHECK(mkfifo(fifo, 0644) == 0);
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK); /* a reader exists, so the writer's open goes on */
    CHECK(rfd >= 0);
    int pid = start((const char *[]){"seqflow", "run", "-i", text, "-o", fifo, "-q", NULL}, -1, -1);
    long got = 0;
    int code = -1;
    double until = now() + 60;
    char buf[65536];
    for (;;) {
        ssize_t n = read(rfd, buf, sizeof buf);
        if (n > 0) {
            got += n;
            continue;
        }
        if (code >= 0) break; /* exited and drained */
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        else if (now() > until) {
            kill(pid, SIGKILL);
            break;
        }
        sleep_s(0.005);
    }
    close(rfd);
    CHECKF(code == 0 && got == want, "-o FIFO: exit %d, the reader got %ld of %ld bytes", code, got, want);
    CHECKF(lmode(fifo) == S_IFIFO, "-o onto a FIFO replaced it");

    /* a symlink is followed: its target is written (atomically), the link stays */
    const char *target = in_dir("target.f32"), *link = in_dir("link.f32");
    write_file(target, "old", 3);
    CHECK(symlink("target.f32", link) == 0);
    CHECK(run((const char *[]){"seqflow", "run", "-i", text, "-o", link, "-q", NULL}) == 0);
    CHECKF(lmode(link) == S_IFLNK, "-o onto a symlink replaced the link");
    CHECKF(file_size(target) == want, "the link's target holds %ld bytes, want %ld", file_size(target), want);
    CHECK(count_prefixed("target.f32.partial") == 0 && count_prefixed("link.f32.partial") == 0);
    /* a link to an open descriptor (what /dev/stdout is; a link of our own, so that a broken
     * binary replaces nothing outside this directory) writes through it: into a pipe, and
     * appended to a file */
    const char *fd1 = in_dir("my-stdout");
    CHECK(symlink("/proc/self/fd/1", fd1) == 0);
    int p[2];
    CHECK(pipe(p) == 0);
    pid = start((const char *[]){"seqflow", "run", "-i", text, "-o", fd1, "-q", NULL}, -1, p[1]);
    close(p[1]);
    got = 0;
    for (ssize_t n; (n = read(p[0], buf, sizeof buf)) > 0;) got += n;
    close(p[0]);
    code = wait_for(pid, 60);
    CHECKF(code == 0 && got == want, "-o a link to stdout, a pipe: exit %d, %ld of %ld bytes", code, got, want);
    const char *appended = in_dir("appended.f32");
    write_file(appended, "head", 4);
    int afd = open(appended, O_WRONLY | O_APPEND);
    code = run_fds((const char *[]){"seqflow", "run", "-i", text, "-o", fd1, "-q", NULL}, -1, afd, 60, NULL);
    close(afd);
    CHECKF(code == 0 && file_size(appended) == 4 + want, "-o a link to stdout, a file: exit %d, %ld bytes", code,
           file_size(appended));
    CHECK(lmode(fd1) == S_IFLNK && count_prefixed("my-stdout.partial") == 0);

    /* a link to a file that does not exist yet creates the file where it points */
    CHECK(symlink("created.f32", in_dir("new-link.f32")) == 0);
    CHECK(run((const char *[]){"seqflow", "run", "-i", text, "-o", in_dir("new-link.f32"), "-q", NULL}) == 0);
    CHECK(lmode(in_dir("new-link.f32")) == S_IFLNK && file_size(in_dir("created.f32")) == want);
}

/* A Unix socket listening at path; accepts one connection and counts its bytes. */
typedef struct listener {
    int fd;
    long got;
} listener;

static void *accept_and_count(void *arg)
{
    listener *l = arg;
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    if (poll(&p, 1, 30000) != 1) return NULL; /* a run that never connects */
    int c = accept(l->fd, NULL, NULL);
    if (c < 0) return NULL;
    char buf[65536];
    for (ssize_t n; (n = read(c, buf, sizeof buf)) > 0;) l->got += n;
    close(c);
    return NULL;
}

static void test_socket_output(void)
{
    const char *text = in_dir("text.in");
    const long want = 14 * (long)row_bytes;
    const char *path = in_dir("out.sock");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        fprintf(stderr, "test_cli_reliability: socket path too long here; socket case skipped\n");
        return;
    }
    strcpy(addr.sun_path, path);
    listener l = {socket(AF_UNIX, SOCK_STREAM, 0), 0};
    CHECK(l.fd >= 0 && bind(l.fd, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(l.fd, 1) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, accept_and_count, &l) == 0);
    int code = run((const char *[]){"seqflow", "run", "-i", text, "-o", path, "-q", NULL});
    pthread_join(t, NULL);
    close(l.fd);
    CHECKF(code == 0 && l.got == want, "-o a socket: exit %d, the listener got %ld of %ld bytes: %s", code, l.got, want,
           err_text);
    CHECKF(lmode(path) == S_IFSOCK, "-o onto a socket replaced it");
}

/* ---- 2: signals ---------------------------------------------------------------------------- */

/* A run writing to a pipe nobody reads, given time to fill it. */
static int start_stalled(const char *big, int *read_end)
{
    int p[2];
    if (pipe(p) != 0) return -1;
    int pid = start((const char *[]){"seqflow", "run", "-i", big, "-o", "-", "-q", "--no-progress", NULL}, -1, p[1]);
    close(p[1]);
    *read_end = p[0];
    sleep_s(1.5);
    return pid;
}

static void test_signals(void)
{
    const char *big = in_dir("big.in");
    size_t big_len = 1 << 20;
    char *bytes = malloc(big_len);
    memset(bytes, 'a', big_len);
    write_file(big, bytes, big_len);
    free(bytes);

    /* SIGTERM ends a run stalled on its output within seconds, exit 143 */
    int rd;
    int pid = start_stalled(big, &rd);
    CHECK(pid > 0 && still_running(pid));
    double t0 = now();
    kill(pid, SIGTERM);
    int code = wait_for(pid, 20);
    double took = now() - t0;
    close(rd);
    CHECKF(code == 143 && took < 10, "SIGTERM on a stalled output: exit %d after %.1f s", code, took);

    /* SIGINT lets it flush (which cannot finish here); a second SIGINT leaves at once */
    pid = start_stalled(big, &rd);
    kill(pid, SIGINT);
    sleep_s(0.5);
    CHECKF(still_running(pid), "one SIGINT on a stalled output already ended the run");
    t0 = now();
    kill(pid, SIGINT);
    code = wait_for(pid, 20);
    took = now() - t0;
    close(rd);
    CHECKF(code == 130 && took < 2, "a second SIGINT: exit %d after %.1f s", code, took);

    /* SIGHUP and SIGTERM on a run reading a pipe: what was read is written out, FILE.partial-*
     * removed, exit 128 + signal */
    const int sigs[] = {SIGHUP, SIGTERM};
    const char *names[] = {"hup.f32", "term.f32"};
    for (int i = 0; i < 2; i++) {
        const char *out = in_dir(names[i]);
        int p[2];
        CHECK(pipe(p) == 0);
        pid = start((const char *[]){"seqflow", "run", "-i", "-", "-o", out, "--no-progress", "--segment", "64",
                                     "--branches", "64:1", NULL},
                    p[0], -1);
        close(p[0]);
        char chunk[100];
        memset(chunk, 'b', sizeof chunk);
        CHECK(write(p[1], chunk, sizeof chunk) == (ssize_t)sizeof chunk);
        char partial[PATH_MAX + 32];
        snprintf(partial, sizeof partial, "%s.partial-%d", out, pid);
        for (int waited = 0; waited < 3000 && file_size(partial) < 0; waited++) sleep_s(0.01);
        CHECKF(file_size(partial) >= 0, "the run never started its sink");
        sleep_s(0.3);
        kill(pid, sigs[i]);
        sleep_s(0.3);
        close(p[1]); /* as a terminal going away would */
        code = wait_for(pid, 20);
        CHECKF(code == 128 + sigs[i], "%s: exit %d, want %d: %s", names[i], code, 128 + sigs[i], err_text);
        CHECKF(file_size(partial) < 0, "%s: the temporary output %s was left behind", names[i], partial);
        CHECKF(file_size(out) == 100 * (long)row_bytes, "%s: output holds %ld bytes", names[i], file_size(out));
    }

    /* a run whose compute is slow (a model of 8 layers 1024 wide on one thread, a second a
     * segment and more: what was read takes longer to flush than the 3 s grace, on any machine
     * of today; a slow GPU call is the same): SIGTERM leaves after its grace, a second SIGINT at
     * once; either way without output and with FILE.partial-PID removed */
    const char *slow_in = in_dir("slow.in");
    char tokens[2048];
    for (size_t t = 0; t < sizeof tokens; t++) tokens[t] = (char)(t * 7 + 3);
    write_file(slow_in, tokens, sizeof tokens);
    const int stop_sigs[] = {SIGTERM, SIGINT};
    for (int i = 0; i < 2; i++) {
        const char *out = in_dir(i ? "slow-int.f32" : "slow-term.f32");
        pid = start((const char *[]){"seqflow", "run", "--dim", "1024", "--heads", "8", "--head-dim", "128", "--layers", "8",
                                     "--mlp", "4096", "-t", "1", "-i", slow_in, "-o", out, "--no-progress", NULL},
                    -1, -1);
        char partial[PATH_MAX + 32];
        snprintf(partial, sizeof partial, "%s.partial-%d", out, pid);
        for (int waited = 0; waited < 6000 && file_size(partial) < 0; waited++) sleep_s(0.01);
        CHECKF(file_size(partial) >= 0, "the slow run never started its sink");
        sleep_s(0.5);
        t0 = now();
        kill(pid, stop_sigs[i]);
        if (stop_sigs[i] == SIGINT) {
            sleep_s(0.3);
            kill(pid, SIGINT);
        }
        code = wait_for(pid, 60);
        took = now() - t0;
        CHECKF(code == 128 + stop_sigs[i] && took < (i ? 2.0 : 8.0), "slow run, signal %d: exit %d after %.1f s: %s",
               stop_sigs[i], code, took, err_text);
        CHECKF(file_size(partial) < 0 && file_size(out) < 0, "slow run, signal %d: output %ld bytes, temporary %ld",
               stop_sigs[i], file_size(out), file_size(partial));
    }

    /* all of it is documented */
    CHECK(run((const char *[]){"seqflow", "--help", NULL}) == 0);
    unsigned char *help = read_stdout();
    CHECK(help && strstr((char *)help, "SIGTERM") && strstr((char *)help, "SIGHUP") && strstr((char *)help, "second signal") &&
          strstr((char *)help, "143"));
    CHECK(help && strstr((char *)help, "usage error") && strstr((char *)help, "runtime error"));
    free(help);
}

/* ---- 4, 8, 9: refusals and messages --------------------------------------------------------- */

static void test_refusals(void)
{
    const char *text = in_dir("small.in");
    write_file(text, "refuse me", 9);
    const char *big = in_dir("big.in"); /* from test_signals: a megabyte of input */

    /* impossible outputs: exit 2 before any work (the big input is never read) */
    double took;
    int code = run_fds((const char *[]){"seqflow", "run", "-i", big, "-o", dir, NULL}, -1, -1, 60, &took);
    CHECKF(code == 2 && took < 5, "-o a directory: exit %d after %.1f s: %s", code, took, err_text);
    CHECK(strstr(err_text, "directory") != NULL);
    EXPECT_FAIL("-o \"\"", 2, "file name", "run", "-i", text, "-o", "");
    EXPECT_FAIL("-o into a missing directory", 2, "does not exist", "run", "-i", text, "-o", in_dir("missing/x.f32"));
    char long_name[NAME_MAX + 20];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    EXPECT_FAIL("-o a name over NAME_MAX", 2, "NAME_MAX", "run", "-i", text, "-o", in_dir(long_name));
    /* a name just under NAME_MAX is fine, though its temporary name must be shortened */
    memset(long_name, 'm', NAME_MAX - 2);
    long_name[NAME_MAX - 2] = '\0';
    code = run((const char *[]){"seqflow", "run", "-i", text, "-o", in_dir(long_name), "-q", NULL});
    CHECKF(code == 0 && file_size(in_dir(long_name)) == 9 * (long)row_bytes, "-o a name of NAME_MAX - 2 bytes: exit %d: %s",
           code, err_text);
    CHECK(count_prefixed("mmmm") == 1);
    EXPECT_FAIL("a pipeline's own sink onto a directory", 2, "directory", "run", "-i", text,
                "segment ! embed ! block ! norm ! sink out=/");

    /* inputs that cannot be resumed, with --checkpoint: a FIFO (nobody writes it: the run must
     * not wait for one), standard input as a pipe, a pipeline's own source */
    const char *fifo = in_dir("in.fifo");
    CHECK(mkfifo(fifo, 0644) == 0);
    code = run_fds((const char *[]){"seqflow", "run", "-i", fifo, "--checkpoint", in_dir("ck"), NULL}, -1, -1, 10, &took);
    CHECKF(code == 2 && strstr(err_text, "FIFO"), "FIFO input with --checkpoint: exit %d: %s", code, err_text);
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "abc", 3) == 3);
    close(p[1]);
    code = run_fds((const char *[]){"seqflow", "run", "-i", "-", "--checkpoint", in_dir("ck"), NULL}, p[0], -1, 10, NULL);
    close(p[0]);
    CHECKF(code == 2 && strstr(err_text, "standard input"), "piped stdin with --checkpoint: exit %d: %s", code, err_text);
    char with_source[PATH_MAX + 64];
    snprintf(with_source, sizeof with_source, "source path='%s' ! segment ! embed ! block ! norm", fifo);
    code = run_fds((const char *[]){"seqflow", "run", "--checkpoint", in_dir("ck"), with_source, NULL}, -1, -1, 10, NULL);
    CHECKF(code == 2 && strstr(err_text, "FIFO"), "a source's FIFO with --checkpoint: exit %d: %s", code, err_text);

    /* pipelines checked before they run: a sink or source in the middle names its position */
    EXPECT_FAIL("sink mid-pipeline", 2, "stage 3 of the pipeline (sink)", "run", "-i", text, "segment ! embed ! sink ! block ! norm");
    EXPECT_FAIL("source mid-pipeline", 2, "stage 2 of the pipeline (source)", "run", "segment ! source ! embed ! block ! norm");
    EXPECT_FAIL("empty pipeline", 2, "empty pipeline", "run", "");
    EXPECT_FAIL("blank pipeline", 2, "empty pipeline", "run", "  ");
    size_t many_len = 400 * 7 + 1;
    char *many = calloc(1, many_len);
    for (int i = 0; i < 400; i++) strcat(many, i ? " ! norm" : "norm");
    code = run_fds((const char *[]){"seqflow", "run", "-i", text, many, NULL}, -1, -1, 60, &took);
    CHECKF(code == 2 && strstr(err_text, "at most 256") && took < 5, "400 stages: exit %d after %.1f s: %s", code, took,
           err_text);
    free(many);
    char *longtext = malloc(70000);
    memset(longtext, ' ', 69999);
    memcpy(longtext, "segment", 7);
    longtext[69999] = '\0';
    EXPECT_FAIL("pipeline text too long", 2, "longer than 65536 bytes", "run", longtext);
    free(longtext);

    /* usage errors exit 2, runtime errors 1: each kind once */
    EXPECT_FAIL("unknown stage", 2, "frobnicate", "run", "-i", text, "segment ! embed ! frobnicate");
    EXPECT_FAIL("unknown stage option", 2, "speed", "run", "-i", text, "segment ! embed ! block speed=11");
    EXPECT_FAIL("bad stage option value", 2, "layers=7", "run", "-i", text, "segment ! embed ! block layers=7 ! norm");
    EXPECT_FAIL("bad option value", 2, "--threads", "run", "--threads", "many");
    EXPECT_FAIL("unknown sink format", 2, "format=csv", "run", "-i", text, "--sink-format", "csv");
    EXPECT_FAIL("too many branches", 2, "16", "run", "--branches",
                "2:1,4:1,8:1,16:1,32:1,64:1,2:2,4:2,8:2,16:2,32:2,64:2,4:4,8:4,16:4,32:4,64:4");
    EXPECT_FAIL("missing input", 1, "missing-input", "run", "-i", in_dir("missing-input"));
    EXPECT_FAIL("token outside the vocabulary", 1, "300", "run", "-i", in_dir("tokens.txt"), "-f", "text");
    EXPECT_FAIL("missing model", 1, "missing.safetensors", "run", "-m", in_dir("missing.safetensors"));
    spawn_result r;
    CHECK(spawn_run((const char *[]){"seqflow", "frobnicate", NULL}, NULL, 0, &r) == 0 && r.exit_code == 2);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "--no-such-option", NULL}, NULL, 0, &r) == 0 && r.exit_code == 2);
}

static void test_messages(void)
{
    /* leading zeros in text ids are decimal: 000000000072 is 72, 0101 is 101 */
    const char *padded = in_dir("padded.txt"), *plain = in_dir("plain.txt");
    write_file(padded, "000000000000000000072 0101 0 00 7", 33);
    write_file(plain, "72 101 0 0 7", 12);
    char digest[512] = "";
    CHECK(run((const char *[]){"seqflow", "run", "-i", plain, "-f", "text", "-q", NULL}) == 0);
    unsigned char *out = read_stdout();
    if (out) snprintf(digest, sizeof digest, "%s", (const char *)out);
    free(out);
    int code = run((const char *[]){"seqflow", "run", "-i", padded, "-f", "text", "-q", NULL});
    CHECKF(code == 0, "ids with leading zeros: exit %d: %s", code, err_text);
    out = read_stdout();
    CHECKF(out && digest[0] && strcmp((const char *)out, digest) == 0, "ids with leading zeros read otherwise: %s vs %s",
           out ? (const char *)out : "", digest);
    free(out);

    /* a valid but tiny --norm-eps is a number (below the smallest float: that float) */
    code = run((const char *[]){"seqflow", "run", "--norm-eps", "1e-310", "-q", NULL});
    CHECKF(code == 0, "--norm-eps 1e-310: exit %d: %s", code, err_text);
    code = run((const char *[]){"seqflow", "run", "--norm-eps", "1e-30", "-q", NULL});
    CHECKF(code == 0, "--norm-eps 1e-30: exit %d: %s", code, err_text);
    EXPECT_FAIL("--norm-eps 0", 2, "positive number", "run", "--norm-eps", "0");
}

/* EINTR while opening a FIFO input (a handler without SA_RESTART, as a host program may have)
 * is retried: the run goes on once the writer comes. */
static void on_usr1(int sig) { (void)sig; }

typedef struct fifo_run {
    sf_graph *graph;
    int rc;
} fifo_run;

static void *run_graph(void *arg)
{
    fifo_run *f = arg;
    f->rc = sf_graph_run(f->graph);
    return NULL;
}

static void test_fifo_eintr(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1; /* no SA_RESTART */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    const char *fifo = in_dir("eintr.fifo");
    CHECK(mkfifo(fifo, 0644) == 0);
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    sf_model *m;
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &m));
    fifo_run f = {NULL, -1};
    CHECK_OK(sf_graph_create(m, NULL, &f.graph));
    char text[PATH_MAX + 128];
    snprintf(text, sizeof text, "source path='%s' ! segment ! embed ! block ! norm ! sink format=null", fifo);
    CHECK_OK(sf_graph_parse(f.graph, text));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, run_graph, &f) == 0);
    for (int i = 0; i < 5; i++) {
        sleep_s(0.1);
        pthread_kill(t, SIGUSR1);
    }
    /* the writer's end opens once the run has the FIFO open for reading; a run that gave up
     * never will, so wait for it at most 20 s */
    int wfd = -1;
    for (double until = now() + 20; wfd < 0 && now() < until; sleep_s(0.01)) wfd = open(fifo, O_WRONLY | O_NONBLOCK);
    CHECKF(wfd >= 0, "the run never opened its FIFO input");
    if (wfd >= 0) {
        fcntl(wfd, F_SETFL, fcntl(wfd, F_GETFL) & ~O_NONBLOCK);
        CHECK(write(wfd, "fifo input", 10) == 10);
        close(wfd);
    }
    pthread_join(t, NULL);
    CHECKF(f.rc == SF_OK, "a signal while opening the FIFO failed the run: %s", sf_graph_error(f.graph));
    CHECK(sf_graph_tokens_out(f.graph) == 10);
    sf_graph_free(f.graph);
    sf_model_free(m);
}

int main(void)
{
    if (!spawn_binary()) return check_skip("SEQFLOW_BIN is not set");
    snprintf(dir, sizeof dir, "%s", check_tmp_path("reliability"));
    if (system("true") != 0) return check_skip("no shell");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(dir, 0755) == 0);
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    row_bytes = (size_t)cfg.dim * 4;
    write_file(in_dir("tokens.txt"), "1 2 300 4", 9);

    /* device nodes need root (CAP_MKNOD); the rest runs anyway */
    int can_mknod = mknod(in_dir("null"), S_IFCHR | 0666, makedev(1, 3)) == 0 &&
                    mknod(in_dir("full"), S_IFCHR | 0666, makedev(1, 7)) == 0;
    if (!can_mknod) fprintf(stderr, "test_cli_reliability: no mknod here (%s); device cases skipped\n", strerror(errno));

    test_outputs(can_mknod);
    test_socket_output();
    test_signals();
    test_refusals();
    test_messages();
    test_fifo_eintr();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_cli_reliability: could not remove %s\n", dir);
    return check_finish("test_cli_reliability");
}
