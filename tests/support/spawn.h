/* Running the seqflow binary from tests: arguments, optional stdin bytes, captured output. */
#ifndef SEQFLOW_TEST_SPAWN_H
#define SEQFLOW_TEST_SPAWN_H

#include <stddef.h>

typedef struct spawn_result {
    int exit_code;       /* exit status, or 128 + signal */
    char err[4096];      /* stderr (truncated) */
    char out[16384];     /* stdout (truncated; --help fits) */
    int err_lines;       /* newline count of stderr */
} spawn_result;

/* Path of the binary under test ($SEQFLOW_BIN). NULL when unset. */
const char *spawn_binary(void);

/* Runs argv (argv[0] is replaced by the binary) with stdin_data on standard input
 * (NULL: /dev/null). Returns 0 when the process could be run. */
int spawn_run(const char *const *argv, const void *stdin_data, size_t stdin_len, spawn_result *r);

/* Starts the binary with a pipe on its standard input; returns the pid and the write end. */
int spawn_start(const char *const *argv, int *stdin_fd, const char *stderr_path);
int spawn_wait(int pid);

#endif
