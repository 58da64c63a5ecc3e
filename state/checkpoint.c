/* Checkpoint files: atomic write, listing, newest-valid load. See checkpoint.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state/checkpoint.h"
#include "state/file_io.h"
#include "seqflow/error.h"

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".sqf"

int sf_checkpoint_path(const char *dir, uint64_t seq, char *buf, size_t size)
{
    int n = snprintf(buf, size, "%s/" CKPT_PREFIX "%020" PRIu64 CKPT_SUFFIX, dir, seq);
    if (n < 0 || (size_t)n >= size) return sf_error(SF_E_INVAL, "checkpoint path under '%s' is too long", dir);
    return SF_OK;
}

int sf_checkpoint_dir_prepare(const char *dir)
{
    if (!dir || !*dir) return sf_error(SF_E_INVAL, "checkpoint directory is empty");
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
        struct stat sb;
        if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return SF_OK;
        return sf_error(SF_E_IO, "checkpoint directory '%s' is not a directory", dir);
    }
    return sf_error(SF_E_IO, "cannot create checkpoint directory '%s': %s", dir, strerror(errno));
}

#define LOCK_NAME "seqflow.lock"

int sf_checkpoint_lock(const char *dir, int *fd_out)
{
    *fd_out = -1;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    if (n < 0 || (size_t)n >= sizeof path) return sf_error(SF_E_INVAL, "checkpoint path under '%s' is too long", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return sf_error(SF_E_IO, "cannot open the lock file '%s': %s", path, strerror(errno));
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        int err = errno;
        if (err != EWOULDBLOCK) {
            close(fd);
            return sf_error(SF_E_IO, "cannot lock '%s': %s", path, strerror(err));
        }
        /* the holder writes its PID right after taking the lock; an empty file means it is
         * between the two */
        char text[32] = {0};
        ssize_t got = pread(fd, text, sizeof text - 1, 0);
        long pid = got > 0 ? strtol(text, NULL, 10) : 0;
        close(fd);
        if (pid > 0)
            return sf_error(SF_E_IO, "checkpoint directory '%s' is in use by another run (PID %ld holds %s)", dir, pid, path);
        return sf_error(SF_E_IO, "checkpoint directory '%s' is in use by another run (it holds %s)", dir, path);
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%ld\n", (long)getpid());
    /* the PID is for the message above only: the lock itself is the flock */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len) {
        int err = errno;
        close(fd);
        return sf_error(SF_E_IO, "cannot write the lock file '%s': %s", path, strerror(err));
    }
    *fd_out = fd;
    return SF_OK;
}

void sf_checkpoint_unlock(int fd)
{
    if (fd >= 0) close(fd); /* closing the last descriptor releases the flock */
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return sf_error(SF_E_IO, "cannot open checkpoint directory '%s': %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 ? SF_OK : sf_error(SF_E_IO, "fsync of '%s' failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

/* Parses "ckpt-<digits>.sqf"; 0 when name is something else. */
static int parse_name(const char *name, uint64_t *seq)
{
    size_t len = strlen(name), pre = strlen(CKPT_PREFIX), suf = strlen(CKPT_SUFFIX);
    if (len <= pre + suf || strncmp(name, CKPT_PREFIX, pre) != 0 || strcmp(name + len - suf, CKPT_SUFFIX) != 0)
        return 0;
    uint64_t v = 0;
    for (size_t i = pre; i < len - suf; i++) {
        if (name[i] < '0' || name[i] > '9' || v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *seq = v;
    return 1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int sf_checkpoint_list(const char *dir, uint64_t **seqs, size_t *n)
{
    *seqs = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return SF_OK;
        return sf_error(SF_E_IO, "cannot read checkpoint directory '%s': %s", dir, strerror(errno));
    }
    size_t cap = 0;
    struct dirent *e;
    int rc = SF_OK;
    while ((e = readdir(d))) {
        uint64_t seq;
        if (!parse_name(e->d_name, &seq)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *grown = realloc(*seqs, cap * sizeof *grown);
            if (!grown) {
                rc = sf_error(SF_E_NOMEM, "out of memory");
                break;
            }
            *seqs = grown;
        }
        (*seqs)[(*n)++] = seq;
    }
    closedir(d);
    if (rc != SF_OK) {
        free(*seqs);
        *seqs = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*seqs, *n, sizeof **seqs, cmp_u64);
    return SF_OK;
}

int sf_checkpoint_clear(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? SF_OK : sf_error(SF_E_IO, "cannot read checkpoint directory '%s': %s", dir, strerror(errno));
    struct dirent *e;
    int rc = SF_OK;
    char path[4096];
    while ((e = readdir(d))) {
        uint64_t seq;
        size_t len = strlen(e->d_name);
        int temp = strncmp(e->d_name, "." CKPT_PREFIX, strlen(CKPT_PREFIX) + 1) == 0 && len > 4 &&
                   strcmp(e->d_name + len - 4, ".tmp") == 0;
        if (!temp && !parse_name(e->d_name, &seq)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT && rc == SF_OK)
            rc = sf_error(SF_E_IO, "cannot delete old checkpoint '%s': %s", path, strerror(errno));
    }
    closedir(d);
    return rc;
}

int sf_checkpoint_write(const char *dir, uint64_t seq, const void *payload, size_t len, sf_codec codec, int keep)
{
    if (!dir || (!payload && len) || keep < 1) return sf_error(SF_E_INVAL, "sf_checkpoint_write: invalid argument");
    /* shapes are >= 1, so an empty payload is the empty frame, ndim 0 */
    sf_frame_desc desc = {.kind = SF_FRAME_CHECKPOINT, .dtype = SF_FRAME_U8, .ndim = len ? 1 : 0,
                          .shape = {len}, .segment = seq, .codec = codec};
    desc.quant.kind = SF_QUANT_F32;
    sf_buffer frame = {0};
    int rc = sf_frame_encode(&desc, payload, len, NULL, &frame);
    if (rc != SF_OK) return rc;
    char final_path[4096], tmp_path[4096 + 16];
    rc = sf_checkpoint_path(dir, seq, final_path, sizeof final_path);
    if (rc != SF_OK) {
        sf_buffer_release(&frame);
        return rc;
    }
    snprintf(tmp_path, sizeof tmp_path, "%s/." CKPT_PREFIX "%020" PRIu64 ".tmp", dir, seq);
    rc = sf_write_file_atomic(final_path, tmp_path, frame.data, frame.len, 1, 0666);
    sf_buffer_release(&frame);
    if (rc != SF_OK) return rc;
    rc = fsync_dir(dir);
    if (rc != SF_OK) return rc;
    /* Only now, with the new one durable, may old ones go. Files numbered above seq are damaged
     * ones a resume skipped: they go too, so the newest file is always the one just written. */
    uint64_t *seqs;
    size_t n;
    rc = sf_checkpoint_list(dir, &seqs, &n);
    if (rc != SF_OK) return rc;
    size_t older = 0;
    for (size_t i = 0; i < n; i++) older += seqs[i] < seq;
    for (size_t i = 0; i < n && rc == SF_OK; i++) {
        int drop = seqs[i] > seq || (seqs[i] < seq && older >= (size_t)keep && i + (size_t)keep <= older);
        if (!drop) continue;
        rc = sf_checkpoint_path(dir, seqs[i], final_path, sizeof final_path);
        if (rc == SF_OK && unlink(final_path) != 0 && errno != ENOENT)
            rc = sf_error(SF_E_IO, "cannot delete old checkpoint '%s': %s", final_path, strerror(errno));
    }
    free(seqs);
    return rc;
}

int sf_checkpoint_load_newest(const char *dir, size_t max_bytes, sf_checkpoint_report_fn report, void *user,
                              uint64_t *seq, uint8_t **payload, size_t *len)
{
    *seq = 0;
    *payload = NULL;
    *len = 0;
    uint64_t *seqs;
    size_t n;
    int rc = sf_checkpoint_list(dir, &seqs, &n);
    if (rc != SF_OK) return rc;
    char path[4096], line[4096 + 600];
    for (size_t i = n; i-- > 0;) {
        rc = sf_checkpoint_path(dir, seqs[i], path, sizeof path);
        if (rc != SF_OK) break;
        uint8_t *file;
        size_t file_len;
        sf_frame_header h;
        void *values = NULL;
        size_t used = 0;
        rc = sf_read_file_alloc(path, max_bytes + SF_FRAME_HEADER_SIZE, &file, &file_len);
        if (rc == SF_OK) {
            rc = sf_frame_decode(file, file_len, max_bytes, &h, &values, &used);
            if (rc == SF_OK && (h.kind != SF_FRAME_CHECKPOINT || h.dtype != SF_FRAME_U8 || h.ndim > 1))
                rc = sf_error(SF_E_FRAME, "not a checkpoint frame");
            else if (rc == SF_OK && h.segment != seqs[i])
                rc = sf_error(SF_E_FRAME, "holds checkpoint %" PRIu64 ", its name says %" PRIu64, h.segment, seqs[i]);
            else if (rc == SF_OK && used != file_len)
                rc = sf_error(SF_E_FRAME, "%zu bytes after the frame", file_len - used);
            free(file);
        }
        if (rc == SF_OK) {
            *seq = seqs[i];
            *payload = values;
            *len = h.value_bytes;
            break;
        }
        free(values);
        if (rc == SF_E_NOMEM) break;
        snprintf(line, sizeof line, "checkpoint '%s' is damaged (%s); %s", path, sf_last_error(),
                 i ? "trying the previous one" : "no older checkpoint left");
        if (report) report(user, line);
    }
    if (rc != SF_OK && rc != SF_E_NOMEM)
        rc = sf_error(SF_E_STATE, "no valid checkpoint in '%s' (%zu damaged)", dir, n);
    free(seqs);
    return rc;
}
