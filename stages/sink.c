/* sink: writes the committed hidden states of every segment, in arrival order (stream order
 * for one stream), as raw little-endian float32, a .npy file, a digest line, or nowhere; bf16
 * rows (packet.h, dtype SF_DTYPE_BF16: a norm with dtype=bf16) are written as they come, two bytes
 * a value (in .npy as uint16 bit patterns: numpy has no bfloat16).
 * Where the output goes decides how it is written. A regular file (or a path that does not
 * exist yet) is written under a temporary name and renamed only when the run succeeds, so a
 * failed run never leaves partial output that looks complete. A symlink is followed, and its
 * target is what gets written (atomically when the target is regular). Devices, FIFOs and
 * sockets are written in place: renaming a file over them would replace /dev/null for the
 * whole machine. Every write, the final flush and the close are checked, so a full device or a
 * closed pipe fails the run. Provisional (flushed) segments are not written: the completed
 * segment will carry the same positions.
 * With checkpoints on, the temporary name is fixed (OUT.partial) and survives a failure; each
 * checkpoint fsyncs it and records its length, and a resume truncates it to that length and
 * appends (renaming a finished OUT back first, when the newest good checkpoint predates it). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "seqflow/stage.h"
#include "stages/stages.h"

typedef enum sink_format { SINK_RAW, SINK_NPY, SINK_DIGEST, SINK_NULL } sink_format;


typedef struct sink {
    sink_format format;
    const char *path;  /* as given; NULL or "-" = standard output */
    char *target;      /* path with its symlinks followed: the file that is written */
    char *tmp_path;    /* its temporary name; NULL when the output is written in place */
    int partial_slot;  /* this sink's entry in the partial-output registry, -1 for none */
    FILE *file;
    uint64_t rows;
    size_t width;
    size_t elem_bytes; /* 4 (float32) or 2 (bf16), from the first rows; 0 before */
    uint64_t fnv;
    double sum, sum_sq;
    int finished;
    int checkpointing;
} sink;

static const sf_option sink_options[] = {
    {.name = "out", .type = SF_OPT_STRING, .help = "output file ('-' = standard output); unset prints a digest"},
    {.name = "format", .type = SF_OPT_STRING, .default_value = "auto", .choices = "auto|raw|npy|digest|null",
     .help = "raw (little-endian float32, or bf16 after norm dtype=bf16), npy, digest, null, or auto (npy for *.npy, raw otherwise)"},
    {0}};

/* Temporary outputs of the live sinks, so that a program stopped by a signal can remove them
 * without waiting for the stages (sf_sink_discard_partials). A slot is 0 when free, 1 while it
 * is being filled and 2 once its path is complete; only complete slots are unlinked. */
#define SINK_PARTIALS 16
static struct {
    atomic_int state;
    char path[PATH_MAX];
} partials[SINK_PARTIALS];

static int partial_register(const char *path)
{
    if (strlen(path) >= PATH_MAX) return -1;
    for (int i = 0; i < SINK_PARTIALS; i++) {
        int expected = 0;
        if (!atomic_compare_exchange_strong(&partials[i].state, &expected, 1)) continue;
        strcpy(partials[i].path, path);
        atomic_store(&partials[i].state, 2);
        return i;
    }
    return -1; /* more live sinks than slots: that output is cleaned up by its stage only */
}

static void partial_unregister(int slot)
{
    if (slot >= 0) atomic_store(&partials[slot].state, 0);
}

void sf_sink_discard_partials(void)
{
    for (int i = 0; i < SINK_PARTIALS; i++) {
        int expected = 2;
        /* taken over so that a second caller (a second signal) does not unlink it again */
        if (atomic_compare_exchange_strong(&partials[i].state, &expected, 1)) unlink(partials[i].path);
    }
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The path that writing `path` reaches: symlinks followed one by one (also when the last
 * target does not exist yet, so that it is created where the link points). *via_fd is set
 * when the chain passes through /proc (/dev/stdout is /proc/self/fd/1): such a link names an
 * open descriptor, which is written in place, whatever it is. */
static int follow_links(const char *path, char **out, int *via_fd)
{
    char *cur = strdup(path);
    if (!cur) return sf_error(SF_E_NOMEM, "out of memory");
    *via_fd = 0;
    for (int hops = 0;; hops++) {
        struct stat sb;
        if (strncmp(cur, "/proc/", 6) == 0) *via_fd = 1;
        if (lstat(cur, &sb) != 0 || !S_ISLNK(sb.st_mode)) break;
        if (hops == 40) {
            free(cur);
            return sf_error(SF_E_IO, "cannot write output '%s': %s", path, strerror(ELOOP));
        }
        char link[PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) {
            int e = errno;
            free(cur);
            return sf_error(SF_E_IO, "cannot write output '%s': %s", path, strerror(e));
        }
        link[n] = '\0';
        const char *slash = strrchr(cur, '/');
        size_t dir_len = link[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
        char *next = malloc(dir_len + (size_t)n + 1);
        if (!next) {
            free(cur);
            return sf_error(SF_E_NOMEM, "out of memory");
        }
        memcpy(next, cur, dir_len);
        memcpy(next + dir_len, link, (size_t)n + 1);
        free(cur);
        cur = next;
    }
    *out = cur;
    return SF_OK;
}

/* Opens a device, FIFO, socket or open descriptor for writing in place. open() on a FIFO waits for a reader;
 * a signal that interrupts the wait is retried unless the run was interrupted. */
static int open_in_place(sf_stage *st, sink *k, const struct stat *sb)
{
    int fd = -1;
    if (S_ISSOCK(sb->st_mode)) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(k->target) >= sizeof addr.sun_path)
            return sf_error(SF_E_IO, "cannot write output '%s': socket path too long", k->path);
        strcpy(addr.sun_path, k->target);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (const struct sockaddr *)&addr, sizeof addr) != 0) {
            int e = errno;
            close(fd);
            fd = -1;
            errno = e;
        }
    } else {
        /* a regular file here is an open descriptor (/dev/stdout onto a file): appended to, as
         * `>>` would; what `>` opened is empty anyway. A .npy rewrites its header, so starts over. */
        int flags = O_WRONLY | O_CLOEXEC;
        if (S_ISREG(sb->st_mode)) flags |= k->format == SINK_NPY ? O_TRUNC : O_APPEND;
        do fd = open(k->target, flags);
        while (fd < 0 && errno == EINTR && !sf_stage_interrupted(st));
    }
    if (fd < 0) return sf_error(SF_E_IO, "cannot write output '%s': %s", k->path, strerror(errno));
    if (k->format == SINK_NPY && lseek(fd, 0, SEEK_CUR) < 0) {
        close(fd);
        return sf_error(SF_E_OPTION, ".npy output needs a regular file or a seekable device (its header is written last); '%s' is neither",
                        k->path);
    }
    k->file = fdopen(fd, "wb");
    if (!k->file) {
        close(fd);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    return SF_OK;
}

/* Sets up k->target and, for a regular or new file, k->tmp_path; opens the output unless a
 * resume will (restore opens the partial output). */
static int open_output(sf_stage *st, sink *k)
{
    if (!*k->path) return sf_error(SF_E_OPTION, "the output name is empty ('-' is standard output)");
    int via_fd = 0;
    int rc = follow_links(k->path, &k->target, &via_fd);
    if (rc != SF_OK) return rc;
    struct stat sb;
    /* stat follows the links itself, also those of /proc that name no path */
    int exists = stat(k->path, &sb) == 0;
    if (exists && S_ISDIR(sb.st_mode)) return sf_error(SF_E_OPTION, "output '%s' is a directory; give a file name", k->path);
    if (exists && (!S_ISREG(sb.st_mode) || via_fd)) {
        free(k->target);
        k->target = strdup(k->path);
        if (!k->target) return sf_error(SF_E_NOMEM, "out of memory");
        if (k->checkpointing)
            return sf_error(SF_E_OPTION, "output '%s' is a device, FIFO, socket or open descriptor, which cannot be checkpointed (it cannot be taken back on resume); give a file",
                            k->path);
        return open_in_place(st, k, &sb);
    }
    size_t len = strlen(k->target) + 32;
    k->tmp_path = malloc(len);
    if (!k->tmp_path) return sf_error(SF_E_NOMEM, "out of memory");
    /* a name near NAME_MAX leaves no room for the suffix: the temporary name then keeps as
     * much of it as fits (the same every time, so that a resume finds OUT.partial again) */
    const char *slash = strrchr(k->target, '/');
    size_t dir_len = slash ? (size_t)(slash - k->target) + 1 : 0, base_len = strlen(k->target) - dir_len;
    const size_t suffix_room = 24; /* ".partial-" and a pid */
    int keep = (int)(base_len + suffix_room > NAME_MAX ? NAME_MAX - suffix_room : base_len);
    if (k->checkpointing) snprintf(k->tmp_path, len, "%.*s%.*s.partial", (int)dir_len, k->target, keep, k->target + dir_len);
    else snprintf(k->tmp_path, len, "%.*s%.*s.partial-%d", (int)dir_len, k->target, keep, k->target + dir_len, (int)getpid());
    if (sf_stage_resuming(st)) return SF_OK;
    k->file = fopen(k->tmp_path, "wb");
    if (!k->file) return sf_error(SF_E_IO, "cannot write output '%s': %s", k->path, strerror(errno));
    if (!k->checkpointing) k->partial_slot = partial_register(k->tmp_path);
    return SF_OK;
}

static int sink_init(sf_stage *st)
{
    sink *k = calloc(1, sizeof *k);
    if (!k) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, k);
    k->partial_slot = -1;
    k->fnv = 0xcbf29ce484222325ull;
    k->path = sf_stage_option(st, "out");
    const char *format = sf_stage_option(st, "format");
    int to_stdout = !k->path || strcmp(k->path, "-") == 0;
    if (strcmp(format, "auto") == 0)
        k->format = !k->path ? SINK_DIGEST : (ends_with(k->path, ".npy") ? SINK_NPY : SINK_RAW);
    else if (strcmp(format, "raw") == 0) k->format = SINK_RAW;
    else if (strcmp(format, "npy") == 0) k->format = SINK_NPY;
    else if (strcmp(format, "digest") == 0) k->format = SINK_DIGEST;
    else k->format = SINK_NULL; /* the only other choice the table allows */
    if (k->format == SINK_NPY && to_stdout)
        return sf_error(SF_E_OPTION, ".npy output needs a file (its header is written last)");
    k->checkpointing = sf_stage_checkpoint_every(st) > 0;
    if (k->format == SINK_NULL) return SF_OK;
    if (to_stdout) {
        if (k->checkpointing && k->format != SINK_DIGEST) /* a digest is written once, at the end */
            return sf_error(SF_E_OPTION, "output to standard output cannot be checkpointed (it cannot be taken back on resume); give a file");
        k->file = stdout;
        return SF_OK;
    }
    /* opened now, also for a digest, so that an output that cannot be written fails the run
     * before any work */
    int rc = open_output(st, k);
    if (rc != SF_OK || !k->file || k->format != SINK_NPY) return rc;
    static const char zeros[SF_NPY_HEADER_BYTES];
    if (fwrite(zeros, 1, sizeof zeros, k->file) != sizeof zeros)
        return sf_error(SF_E_IO, "cannot write output '%s': %s", k->path, strerror(errno));
    return SF_OK;
}

/* FNV-1a over the bytes as written; the sums over the values (bf16 widened exactly). */
static void digest_update(sink *k, const sf_packet *in)
{
    const size_t count = in->n * in->width, bytes_len = sf_packet_row_bytes(in);
    const uint8_t *bytes = sf_packet_rows(in);
    for (size_t i = 0; i < bytes_len; i++) k->fnv = (k->fnv ^ bytes[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < count; i++) {
        float v;
        if (in->x_bf16) {
            uint32_t u = (uint32_t)in->x_bf16[i] << 16;
            memcpy(&v, &u, sizeof v);
        } else {
            v = in->x[i];
        }
        k->sum += v;
        k->sum_sq += (double)v * v;
    }
}

static int sink_process(sf_stage *st, sf_packet *in)
{
    sink *k = sf_stage_priv(st);
    int rc = SF_OK;
    if (in->kind == SF_PACKET_HIDDEN && !(in->flags & SF_PACKET_PROVISIONAL) && in->n) {
        const size_t elem = sf_dtype_size(in->dtype), bytes = sf_packet_row_bytes(in);
        if (k->width && k->width != in->width)
            rc = sf_error(SF_E_INVAL, "rows of width %zu after rows of width %zu", in->width, k->width);
        else if (k->elem_bytes && k->elem_bytes != elem)
            rc = sf_error(SF_E_INVAL, "%s rows after %s rows", elem == 2 ? "bf16" : "float32",
                          k->elem_bytes == 2 ? "bf16" : "float32");
        if (rc == SF_OK) {
            k->width = in->width;
            k->elem_bytes = elem;
            if (k->file && k->format != SINK_DIGEST && fwrite(sf_packet_rows(in), 1, bytes, k->file) != bytes)
                rc = sf_error(SF_E_IO, "writing %s%s%s failed: %s", k->file == stdout ? "standard output" : "output '",
                              k->file == stdout ? "" : k->path, k->file == stdout ? "" : "'", strerror(errno));
            if (k->format == SINK_DIGEST) digest_update(k, in);
            k->rows += in->n;
        }
    }
    sf_packet_free(in);
    return rc;
}

void sf_npy_header(char out[SF_NPY_HEADER_BYTES], uint64_t rows, size_t width, int elem_bytes)
{
    memset(out, ' ', SF_NPY_HEADER_BYTES);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    const uint16_t dict_len = SF_NPY_HEADER_BYTES - 10;
    out[8] = (char)(dict_len & 0xff);
    out[9] = (char)(dict_len >> 8);
    int n = snprintf(out + 10, dict_len, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRIu64 ", %zu), }",
                     elem_bytes == 2 ? "<u2" : "<f4", rows, width);
    out[10 + n] = ' ';
    out[SF_NPY_HEADER_BYTES - 1] = '\n';
}

static int write_npy_header(sink *k)
{
    char header[SF_NPY_HEADER_BYTES];
    sf_npy_header(header, k->rows, k->width, (int)k->elem_bytes);
    if (fseek(k->file, 0, SEEK_SET) != 0 || fwrite(header, 1, sizeof header, k->file) != sizeof header)
        return sf_error(SF_E_IO, "writing output '%s' failed: %s", k->path, strerror(errno));
    return SF_OK;
}

/* Makes what was written final: flushed and closed (a regular file also fsynced and renamed
 * into place unless rc, the writing so far, failed), every step checked. */
static int finish_output(sink *k, int rc)
{
    const char *name = k->path && strcmp(k->path, "-") != 0 ? k->path : "standard output";
    if (k->file == stdout) {
        k->file = NULL;
        if ((fflush(stdout) != 0 || ferror(stdout)) && rc == SF_OK)
            rc = sf_error(SF_E_IO, "writing to standard output failed: %s", strerror(errno));
        return rc;
    }
    if ((fflush(k->file) != 0 || (k->tmp_path && fsync(fileno(k->file)) != 0)) && rc == SF_OK)
        rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", name, strerror(errno));
    if (fclose(k->file) != 0 && rc == SF_OK) rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", name, strerror(errno));
    k->file = NULL;
    if (rc == SF_OK && k->tmp_path && rename(k->tmp_path, k->target) != 0)
        rc = sf_error(SF_E_IO, "cannot rename output into '%s': %s", k->path, strerror(errno));
    if (rc == SF_OK) {
        partial_unregister(k->partial_slot);
        k->partial_slot = -1;
        k->finished = 1;
    }
    return rc;
}

static int sink_flush(sf_stage *st)
{
    sink *k = sf_stage_priv(st);
    int rc = SF_OK;
    if (k->format == SINK_DIGEST) {
        double count = (double)k->rows * (double)k->width;
        if (fprintf(k->file, "digest: rows=%" PRIu64 " width=%zu fnv1a64=%016" PRIx64 " mean=%.9g rms=%.9g%s\n", k->rows,
                    k->width, k->fnv, count ? k->sum / count : 0.0, count ? sqrt(k->sum_sq / count) : 0.0,
                    k->elem_bytes == 2 ? " dtype=bf16" : "") < 0)
            rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", k->file == stdout ? "standard output" : k->path,
                          strerror(errno));
        return finish_output(k, rc);
    }
    if (!k->file) return SF_OK;
    if (k->rows == 0 && sf_stage_model(st)) /* an empty stream still has the model's width */
        k->width = (size_t)sf_model_get_config(sf_stage_model(st))->dim;
    if (k->format == SINK_NPY) rc = write_npy_header(k);
    return finish_output(k, rc);
}

/* State (only with checkpoints on; empty otherwise): u32 format, u32 element bytes (4, 2 for
 * bf16, 0 before any row), u64 rows, width, fnv, double sum, sum_sq, u64 output bytes. */
typedef struct sink_state {
    uint32_t format, elem_bytes;
    uint64_t rows, width, fnv;
    double sum, sum_sq;
    uint64_t bytes;
} sink_state;

static int sink_save(sf_stage *st, sf_buffer *out)
{
    sink *k = sf_stage_priv(st);
    if (!k->checkpointing) return SF_OK;
    sink_state v = {(uint32_t)k->format, (uint32_t)k->elem_bytes, k->rows, k->width, k->fnv, k->sum, k->sum_sq, 0};
    if (k->file && k->tmp_path) {
        /* the checkpoint may only name bytes that are on disk */
        if (fflush(k->file) != 0 || fsync(fileno(k->file)) != 0)
            return sf_error(SF_E_IO, "writing output '%s' failed: %s", k->path, strerror(errno));
        off_t end = ftello(k->file);
        if (end < 0) return sf_error(SF_E_IO, "output '%s': %s", k->path, strerror(errno));
        v.bytes = (uint64_t)end;
    }
    return sf_buffer_append(out, &v, sizeof v);
}

static int sink_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    sink *k = sf_stage_priv(st);
    if (len == 0) return SF_OK; /* saved without checkpoints: nothing was recorded */
    sink_state v;
    if (len != sizeof v) return sf_error(SF_E_STATE, "sink state has %zu bytes, expected %zu", len, sizeof v);
    memcpy(&v, data, sizeof v);
    if (v.format != (uint32_t)k->format) return sf_error(SF_E_STATE, "sink state is for another output format");
    if (v.elem_bytes != 0 && v.elem_bytes != 2 && v.elem_bytes != 4)
        return sf_error(SF_E_STATE, "sink state names %u-byte output values", v.elem_bytes);
    k->elem_bytes = v.elem_bytes;
    k->rows = v.rows;
    k->width = (size_t)v.width;
    k->fnv = v.fnv;
    k->sum = v.sum;
    k->sum_sq = v.sum_sq;
    if (!k->tmp_path) return SF_OK;
    if (k->file) { /* restoring into a sink that was not set up for a resume */
        fclose(k->file);
        k->file = NULL;
    }
    k->file = fopen(k->tmp_path, "r+b");
    if (!k->file && errno == ENOENT && rename(k->target, k->tmp_path) == 0) k->file = fopen(k->tmp_path, "r+b");
    if (!k->file)
        return sf_error(SF_E_STATE, "cannot resume: partial output '%s' is missing or unreadable (%s)", k->tmp_path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(k->file), &sb) != 0 || (uint64_t)sb.st_size < v.bytes)
        return sf_error(SF_E_STATE, "cannot resume: partial output '%s' is shorter than the checkpoint's %llu bytes",
                        k->tmp_path, (unsigned long long)v.bytes);
    if (ftruncate(fileno(k->file), (off_t)v.bytes) != 0 || fseeko(k->file, 0, SEEK_END) != 0)
        return sf_error(SF_E_IO, "cannot resume output '%s': %s", k->tmp_path, strerror(errno));
    return SF_OK;
}

static void sink_free(sf_stage *st)
{
    sink *k = sf_stage_priv(st);
    if (!k) return;
    if (k->file && k->file != stdout) fclose(k->file);
    partial_unregister(k->partial_slot);
    if (k->tmp_path && !k->finished && !k->checkpointing) unlink(k->tmp_path);
    free(k->tmp_path);
    free(k->target);
    free(k);
}

const sf_stage_class sf_sink_stage = {
    .name = "sink",
    .help = "write hidden states: raw float32 (or bf16), .npy, a digest line, or nothing",
    .options = sink_options,
    .init = sink_init,
    .process = sink_process,
    .flush = sink_flush,
    .save = sink_save,
    .restore = sink_restore,
    .free = sink_free,
    .terminal = 1,
};
