/* sink: writes the committed hidden states of every segment, in arrival order (stream order
 * for one stream), as raw little-endian float32, a .npy file, a digest line, or nowhere; bf16
 * rows (packet.h, dtype SF_DTYPE_BF16: a norm with dtype=bf16) are written as they come, two bytes
 * a value (in .npy as uint16 bit patterns: numpy has no bfloat16).
 * Files are written under a temporary name and renamed only when the run succeeds, so a
 * failed run never leaves partial output that looks complete. Provisional (flushed) segments
 * are not written: the completed segment will carry the same positions.
 * With checkpoints on, the temporary name is fixed (OUT.partial) and survives a failure; each
 * checkpoint fsyncs it and records its length, and a resume truncates it to that length and
 * appends (renaming a finished OUT back first, when the newest good checkpoint predates it). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seqflow/stage.h"
#include "stages/stages.h"

typedef enum sink_format { SINK_RAW, SINK_NPY, SINK_DIGEST, SINK_NULL } sink_format;

#define NPY_HEADER_BYTES 128

typedef struct sink {
    sink_format format;
    const char *path;  /* NULL or "-" = standard output */
    char *tmp_path;
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

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int sink_init(sf_stage *st)
{
    sink *k = calloc(1, sizeof *k);
    if (!k) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, k);
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
    if (k->format == SINK_NULL || k->format == SINK_DIGEST) return SF_OK;
    if (to_stdout) {
        if (k->checkpointing)
            return sf_error(SF_E_OPTION, "output to standard output cannot be checkpointed (it cannot be taken back on resume); give a file");
        k->file = stdout;
        return SF_OK;
    }
    size_t len = strlen(k->path) + 32;
    k->tmp_path = malloc(len);
    if (!k->tmp_path) return sf_error(SF_E_NOMEM, "out of memory");
    if (k->checkpointing) snprintf(k->tmp_path, len, "%s.partial", k->path);
    else snprintf(k->tmp_path, len, "%s.partial-%d", k->path, (int)getpid());
    if (sf_stage_resuming(st)) return SF_OK; /* restore opens the partial output */
    k->file = fopen(k->tmp_path, "wb");
    if (!k->file) return sf_error(SF_E_IO, "cannot write output '%s': %s", k->path, strerror(errno));
    if (k->format == SINK_NPY) {
        static const char zeros[NPY_HEADER_BYTES];
        if (fwrite(zeros, 1, sizeof zeros, k->file) != sizeof zeros)
            return sf_error(SF_E_IO, "cannot write output '%s': %s", k->path, strerror(errno));
    }
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
            if (k->file && fwrite(sf_packet_rows(in), 1, bytes, k->file) != bytes)
                rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", k->path ? k->path : "-", strerror(errno));
            if (k->format == SINK_DIGEST) digest_update(k, in);
            k->rows += in->n;
        }
    }
    sf_packet_free(in);
    return rc;
}

static int write_npy_header(sink *k)
{
    char header[NPY_HEADER_BYTES];
    memset(header, ' ', sizeof header);
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    uint16_t dict_len = NPY_HEADER_BYTES - 10;
    header[8] = (char)(dict_len & 0xff);
    header[9] = (char)(dict_len >> 8);
    int n = snprintf(header + 10, dict_len, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRIu64 ", %zu), }",
                     k->elem_bytes == 2 ? "<u2" : "<f4", k->rows, k->width);
    header[10 + n] = ' ';
    header[NPY_HEADER_BYTES - 1] = '\n';
    if (fseek(k->file, 0, SEEK_SET) != 0 || fwrite(header, 1, sizeof header, k->file) != sizeof header)
        return sf_error(SF_E_IO, "writing output '%s' failed: %s", k->path, strerror(errno));
    return SF_OK;
}

static int sink_flush(sf_stage *st)
{
    sink *k = sf_stage_priv(st);
    int rc = SF_OK;
    if (k->format == SINK_DIGEST) {
        double count = (double)k->rows * (double)k->width;
        FILE *out = stdout;
        if (k->path && strcmp(k->path, "-") != 0) {
            out = fopen(k->path, "w");
            if (!out) return sf_error(SF_E_IO, "cannot write output '%s': %s", k->path, strerror(errno));
        }
        fprintf(out, "digest: rows=%" PRIu64 " width=%zu fnv1a64=%016" PRIx64 " mean=%.9g rms=%.9g%s\n", k->rows,
                k->width, k->fnv, count ? k->sum / count : 0.0, count ? sqrt(k->sum_sq / count) : 0.0,
                k->elem_bytes == 2 ? " dtype=bf16" : "");
        if (out != stdout && fclose(out) != 0) rc = sf_error(SF_E_IO, "writing '%s' failed", k->path);
        else if (out == stdout) fflush(stdout);
        k->finished = 1;
        return rc;
    }
    if (!k->file) return SF_OK;
    if (k->rows == 0 && sf_stage_model(st)) /* an empty stream still has the model's width */
        k->width = (size_t)sf_model_get_config(sf_stage_model(st))->dim;
    if (k->format == SINK_NPY) rc = write_npy_header(k);
    if (k->file == stdout) {
        if (fflush(stdout) != 0) rc = sf_error(SF_E_IO, "writing to standard output failed");
        k->file = NULL;
        return rc;
    }
    if (fflush(k->file) != 0 || fsync(fileno(k->file)) != 0)
        rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", k->path, strerror(errno));
    if (fclose(k->file) != 0 && rc == SF_OK) rc = sf_error(SF_E_IO, "writing output '%s' failed", k->path);
    k->file = NULL;
    if (rc == SF_OK && rename(k->tmp_path, k->path) != 0)
        rc = sf_error(SF_E_IO, "cannot rename output into '%s': %s", k->path, strerror(errno));
    if (rc == SF_OK) k->finished = 1;
    return rc;
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
    if (k->file) {
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
    if (!k->file && errno == ENOENT && rename(k->path, k->tmp_path) == 0) k->file = fopen(k->tmp_path, "r+b");
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
    if (k->tmp_path && !k->finished && !k->checkpointing) unlink(k->tmp_path);
    free(k->tmp_path);
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
};
