#include "support/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *spawn_binary(void)
{
    const char *bin = getenv("SEQFLOW_BIN");
    return bin && *bin ? bin : NULL;
}

static void slurp(int fd, char *buf, size_t size)
{
    size_t n = 0;
    lseek(fd, 0, SEEK_SET);
    for (ssize_t got; n + 1 < size && (got = read(fd, buf + n, size - 1 - n)) > 0;) n += (size_t)got;
    buf[n] = '\0';
}

static int exit_code_of(int status)
{
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/* Replaces the child with the binary under test; argv[0] is replaced by its path. */
static void exec_binary(const char *bin, const char *const *argv)
{
    int n = 0;
    while (argv[n]) n++;
    char **args = calloc((size_t)n + 1, sizeof *args);
    args[0] = (char *)bin;
    for (int i = 1; i < n; i++) args[i] = (char *)argv[i];
    execv(bin, args);
    _exit(127);
}

int spawn_run(const char *const *argv, const void *stdin_data, size_t stdin_len, spawn_result *r)
{
    memset(r, 0, sizeof *r);
    const char *bin = spawn_binary();
    if (!bin) return -1;
    FILE *in = tmpfile(), *out = tmpfile(), *err = tmpfile();
    if (!in || !out || !err) return -1;
    if (stdin_data && stdin_len) fwrite(stdin_data, 1, stdin_len, in);
    fflush(in);
    rewind(in);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fileno(in), 0);
        dup2(fileno(out), 1);
        dup2(fileno(err), 2);
        exec_binary(bin, argv);
    }
    int status;
    waitpid(pid, &status, 0);
    r->exit_code = exit_code_of(status);
    slurp(fileno(out), r->out, sizeof r->out);
    slurp(fileno(err), r->err, sizeof r->err);
    for (const char *c = r->err; *c; c++) r->err_lines += *c == '\n';
    fclose(in);
    fclose(out);
    fclose(err);
    return 0;
}

int spawn_start(const char *const *argv, int *stdin_fd, const char *stderr_path)
{
    const char *bin = spawn_binary();
    int fds[2];
    if (!bin || pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[0], 0);
        close(fds[1]);
        int e = open(stderr_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (e >= 0) dup2(e, 2);
        exec_binary(bin, argv);
    }
    close(fds[0]);
    *stdin_fd = fds[1];
    return pid;
}

int spawn_wait(int pid)
{
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return exit_code_of(status);
}
