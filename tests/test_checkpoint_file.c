/* Checkpoint files (state/checkpoint.c) without the binary: an empty payload comes back with
 * length 0 under every codec; a file whose fstat fails is reported as an I/O error naming the
 * cause (fstat is replaced below so that it can be made to fail). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "state/checkpoint.h"
#include "seqflow/error.h"
#include "support/check.h"

static int fail_fstat;

/* Defined here, this fstat is the one the library (linked statically) calls. */
int fstat(int fd, struct stat *st)
{
    if (fail_fstat) {
        errno = EIO;
        return -1;
    }
    return fstatat(fd, "", st, AT_EMPTY_PATH);
}

static char reported[4096];

static void report(void *user, const char *line)
{
    (void)user;
    snprintf(reported, sizeof reported, "%s", line);
}

static void test_empty_payload(const char *dir)
{
    static const sf_codec codecs[] = {SF_CODEC_RAW, SF_CODEC_LZ4, SF_CODEC_ZSTD};
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
        CHECK_OK(sf_checkpoint_write(dir, 10 + c, NULL, 0, codecs[c], 1));
        uint64_t seq = 0;
        uint8_t *payload = NULL;
        size_t len = 99;
        CHECK_OK(sf_checkpoint_load_newest(dir, 1 << 20, report, NULL, &seq, &payload, &len));
        /* a loaded empty checkpoint is told apart from none by a non-NULL payload */
        CHECKF(seq == 10 + c && payload != NULL && len == 0, "codec %s: seq %llu, len %zu",
               sf_codec_name(codecs[c]), (unsigned long long)seq, len);
        free(payload);
    }
    /* and a non-empty one still round-trips */
    static const char text[] = "seqflow checkpoint payload";
    CHECK_OK(sf_checkpoint_write(dir, 20, text, sizeof text, SF_CODEC_ZSTD, 1));
    uint64_t seq = 0;
    uint8_t *payload = NULL;
    size_t len = 0;
    CHECK_OK(sf_checkpoint_load_newest(dir, 1 << 20, report, NULL, &seq, &payload, &len));
    CHECK(seq == 20 && len == sizeof text && payload && memcmp(payload, text, len) == 0);
    free(payload);
}

static void test_fstat_failure(const char *dir)
{
    reported[0] = 0;
    uint64_t seq = 0;
    uint8_t *payload = NULL;
    size_t len = 0;
    fail_fstat = 1;
    int rc = sf_checkpoint_load_newest(dir, 1 << 20, report, NULL, &seq, &payload, &len);
    fail_fstat = 0;
    CHECKF(rc == SF_E_STATE && payload == NULL, "rc %d", rc);
    CHECKF(strstr(reported, strerror(EIO)) != NULL && strstr(reported, "over the limit") == NULL,
           "reported: %s", reported);
    free(payload);
}

/* One holder at a time: a second lock fails at once naming the holder's PID (here our own: a
 * second open file description conflicts like another process), an unlock frees it, and a
 * child killed with SIGKILL while holding it leaves no stale lock behind. */
static void test_lock(const char *dir)
{
    int a = -1, b = -1;
    CHECK_OK(sf_checkpoint_lock(dir, &a));
    CHECK(a >= 0);
    char pid[32];
    snprintf(pid, sizeof pid, "PID %ld", (long)getpid());
    CHECK(sf_checkpoint_lock(dir, &b) == SF_E_IO && b == -1);
    CHECKF(strstr(sf_last_error(), pid) && strstr(sf_last_error(), "in use"), "message: %s", sf_last_error());
    sf_checkpoint_unlock(a);
    CHECK_OK(sf_checkpoint_lock(dir, &b));
    sf_checkpoint_unlock(b);
    sf_checkpoint_unlock(-1);

    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t child = fork();
    if (child == 0) {
        int fd;
        if (sf_checkpoint_lock(dir, &fd) != SF_OK) _exit(1);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        for (;;) pause();
    }
    char c;
    CHECK(child > 0 && read(ready[0], &c, 1) == 1);
    snprintf(pid, sizeof pid, "PID %ld", (long)child);
    CHECK(sf_checkpoint_lock(dir, &b) == SF_E_IO);
    CHECKF(strstr(sf_last_error(), pid), "message: %s", sf_last_error());
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK_OK(sf_checkpoint_lock(dir, &b));
    sf_checkpoint_unlock(b);
    close(ready[0]);
    close(ready[1]);
    char path[4096];
    snprintf(path, sizeof path, "%s/seqflow.lock", dir);
    CHECK(unlink(path) == 0);
}

int main(void)
{
    const char *dir = check_tmp_path("ckpt-file");
    CHECK_OK(sf_checkpoint_dir_prepare(dir));
    test_empty_payload(dir);
    test_fstat_failure(dir);
    test_lock(dir);
    CHECK_OK(sf_checkpoint_clear(dir));
    rmdir(dir);
    return check_finish("test_checkpoint_file");
}
