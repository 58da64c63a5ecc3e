/* Whole-file writes and reads. See file_io.h. */
#include "state/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seqflow/error.h"

int sf_write_file_atomic(const char *path, const char *tmp_path, const void *data, size_t len,
                         int sync, unsigned mode)
{
    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode_t)mode);
    if (fd < 0) return sf_error(SF_E_IO, "cannot create '%s': %s", tmp_path, strerror(errno));
    const uint8_t *p = data;
    size_t done = 0;
    int err = 0;
    while (done < len && !err) {
        ssize_t w = write(fd, p + done, len - done);
        if (w > 0) done += (size_t)w;
        else if (w < 0 && errno != EINTR) err = errno;
        else if (w == 0) err = EIO; /* a regular file never takes nothing: do not spin */
    }
    if (!err && sync && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (err) {
        unlink(tmp_path);
        return sf_error(SF_E_IO, "writing '%s' failed: %s", tmp_path, strerror(err));
    }
    if (rename(tmp_path, path) != 0) {
        err = errno;
        unlink(tmp_path);
        return sf_error(SF_E_IO, "cannot rename '%s' to '%s': %s", tmp_path, path, strerror(err));
    }
    return SF_OK;
}

/* Opens path and reports its size. */
static int open_sized(const char *path, int *fd, size_t *size)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return sf_error(SF_E_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0) {
        int rc = sf_error(SF_E_IO, "cannot stat '%s': %s", path, strerror(errno));
        close(*fd);
        return rc;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > SIZE_MAX) {
        close(*fd);
        return sf_error(SF_E_IO, "'%s' reports a size of %lld bytes", path, (long long)st.st_size);
    }
    *size = (size_t)st.st_size;
    return SF_OK;
}

/* Reads size bytes from fd into dst, then closes fd. */
static int read_all_close(int fd, const char *path, uint8_t *dst, size_t size)
{
    size_t done = 0;
    int rc = SF_OK;
    while (done < size && rc == SF_OK) {
        ssize_t r = read(fd, dst + done, size - done);
        if (r > 0) done += (size_t)r;
        else if (r == 0)
            rc = sf_error(SF_E_FRAME_TRUNCATED, "'%s' shrank while being read (%zu of %zu bytes)",
                          path, done, size);
        else if (errno != EINTR)
            rc = sf_error(SF_E_IO, "reading '%s' failed: %s", path, strerror(errno));
    }
    close(fd);
    return rc;
}

int sf_read_file_alloc(const char *path, size_t limit, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd = -1;
    size_t size = 0;
    int rc = open_sized(path, &fd, &size);
    if (rc != SF_OK) return rc;
    if (size > limit) {
        close(fd);
        return sf_error(SF_E_FRAME_TOO_LARGE, "'%s' holds %zu bytes, over the limit of %zu", path,
                        size, limit);
    }
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return sf_error(SF_E_NOMEM, "out of memory reading '%s' (%zu bytes)", path, size);
    }
    rc = read_all_close(fd, path, buf, size);
    if (rc != SF_OK) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = size;
    return SF_OK;
}

int sf_read_file_exact(const char *path, void *dst, size_t len)
{
    int fd = -1;
    size_t size = 0;
    int rc = open_sized(path, &fd, &size);
    if (rc != SF_OK) return rc;
    if (size != len) {
        close(fd);
        return sf_error(SF_E_FRAME_TRUNCATED, "'%s' holds %zu bytes, expected %zu", path, size,
                        len);
    }
    return read_all_close(fd, path, dst, len);
}
