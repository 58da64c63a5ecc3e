/* Packets: the unit that flows between stages. A packet is owned by exactly one party at a
 * time: whoever created it, then the stage it is handed to (process takes ownership), then
 * whoever that stage emits it to. Free with sf_packet_free (NULL accepted). */
#ifndef SEQFLOW_PACKET_H
#define SEQFLOW_PACKET_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/dtype.h"

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef enum sf_packet_kind {
    SF_PACKET_TOKENS = 1, /* a chunk of token ids of any length, as a source read them */
    SF_PACKET_SEGMENT = 2, /* the tokens of one segment (n <= N) at positions segment*N.. */
    SF_PACKET_HIDDEN = 3, /* one segment's activations x[n, width] (tokens kept alongside) */
    SF_PACKET_FLUSH = 4,  /* a request to emit the pending partial segment provisionally */
    /* A checkpoint marker (threaded runs with checkpoints on): the scheduler appends the state
     * of each stage it passes to `state` and never hands it to process() */
    SF_PACKET_CHECKPOINT = 5
} sf_packet_kind;

enum {
    /* The last packet of its stream: the stream ends after it (n may be 0). A partial
     * segment marked FINAL commits state (SPEC 1). */
    SF_PACKET_FINAL = 1u << 0,
    /* A flushed partial segment: its outputs are real but state must not advance, and the
     * same positions will come again in the completed segment. */
    SF_PACKET_PROVISIONAL = 1u << 1
};

typedef struct sf_packet {
    sf_packet_kind kind;
    uint32_t flags;
    uint64_t stream;   /* independent streams never share state */
    uint64_t segment;  /* segment index s (SEGMENT / HIDDEN) */
    uint64_t position; /* stream position of row 0 */
    size_t n;          /* rows (tokens) present */
    size_t width;      /* columns of x (0 when x is unused) */
    uint32_t *tokens;  /* [n] (capacity cap_tokens) */
    /* The rows, [n, width] row-major, of element type dtype. Exactly one of x and x_bf16 is
     * set (both NULL before the first reserve), so that code reading x never reads bf16 bit
     * patterns as floats. bf16 rows (uint16_t bit patterns, float32 rounded to nearest even:
     * half the bytes) come from the norm stage's dtype=bf16 (the binary's --out-dtype bf16);
     * sinks and sf_graph_pull's callers take them, stages that compute on rows refuse them. */
    sf_dtype dtype;
    float *x;          /* float32 rows when dtype is SF_DTYPE_F32, else NULL */
    uint16_t *x_bf16;  /* bfloat16 rows when dtype is SF_DTYPE_BF16, else NULL */
    size_t cap_tokens, cap_x; /* cap_x: capacity of the rows' buffer in floats */
    uint8_t *state;    /* CHECKPOINT: saved state of the stages passed so far (owned, may be NULL) */
    size_t state_len, state_cap;
    /* Device rows (graphs on a GPU backend): when dev is non-NULL the activations x[n, width]
     * live in dev, backend memory of the graph's backend lent by a bounded pool, and x holds
     * nothing meaningful. The packet owns the loan: sf_packet_free (or sf_packet_to_host)
     * returns dev to its pool through dev_ops. Only stages whose class sets device_rows see
     * such packets; the graph brings the rows to host memory before any other stage, and
     * before a packet leaves the graph (sf_graph_pull, the last stage), so callers and sinks
     * only ever get host packets (`seqflow serve`'s own graph excepted: it takes them on their
     * way, sf_packet_to_host_start). */
    float *dev;
    const struct sf_packet_device *dev_ops;
    void *dev_pool;
    void *dev_ticket; /* a copy of dev into x under way (sf_packet_to_host_start); NULL: none */
} sf_packet;

/* How device rows go back to host memory and back to their pool (set by whoever lends dev). */
typedef struct sf_packet_device {
    /* copies bytes of dev into host (waits for the copy) */
    int (*download)(void *pool, void *host, const float *dev, size_t bytes);
    /* returns dev to the pool */
    void (*release)(void *pool, float *dev);
    /* optional (NULL: none): begins the copy and returns at once (SF_E_UNSUPPORTED when it
     * cannot now); download_wait waits for it, from any thread */
    int (*download_start)(void *pool, void *host, const float *dev, size_t bytes, void **ticket);
    int (*download_wait)(void *pool, void *ticket);
} sf_packet_device;

/* A new packet with room for cap_tokens token ids and cap_x floats (either may be 0).
 * Returns NULL when out of memory. */
sf_packet *sf_packet_new(sf_packet_kind kind, size_t cap_tokens, size_t cap_x);
/* Grows the packet's buffers to at least these capacities, keeping their contents. */
int sf_packet_reserve(sf_packet *p, size_t cap_tokens, size_t cap_x);
void sf_packet_free(sf_packet *p);
/* Where large activation buffers (x of 1 MiB and more) come from. A GPU backend installs
 * page-locked memory here so that device rows are copied straight into packets (no staging
 * copy on the host). alloc returns NULL on failure; free accepts NULL. Process-wide: the first
 * call wins and stays for the life of the process (buffers already handed out keep the
 * allocator that made them). Not for stages: backends call it. */
typedef struct sf_host_allocator {
    void *(*alloc)(size_t bytes);
    void (*free)(void *ptr);
} sf_host_allocator;
void sf_packet_set_host_allocator(const sf_host_allocator *allocator);

/* Brings device rows (dev) into x, grown as needed, and returns dev to its pool; SF_OK and
 * nothing done when the packet has none. On failure dev is released all the same. The rows
 * are not scanned here (see sf_set_check_finite for where they are). */
int sf_packet_to_host(sf_packet *p);
/* Begins bringing device rows into x (grown now) where their pool copies without waiting, and
 * returns; sf_packet_to_host (on any thread) then waits for the copy and returns dev, as
 * sf_packet_free does. x is not to be read before. Where the pool cannot, the rows are brought
 * over now (sf_packet_to_host). Experimental. */
int sf_packet_to_host_start(sf_packet *p);
/* Rounds the rows to bf16 in place (x becomes x_bf16, dtype SF_DTYPE_BF16); device rows are
 * brought to the host first. SF_OK and nothing done when the packet is bf16 already. */
int sf_packet_to_bf16(sf_packet *p);
/* For a packet with device rows: brings n * width bf16 values from dev_bf16 instead of dev's
 * floats (backend memory of the same backend as dev: the rows converted there, which halves
 * the download) into x_bf16 (dtype SF_DTYPE_BF16), and returns dev to its pool (on failure
 * too). */
int sf_packet_to_host_bf16(sf_packet *p, const void *dev_bf16);
/* SF_OK when the packet's host rows (float32 or bf16) are all finite; otherwise
 * SF_E_NONFINITE naming `where` (e.g. "after layer 3"), the value (NaN or infinite), the
 * stream, the position and the column of the first one. Device rows are not read. */
int sf_packet_check_finite(const sf_packet *p, const char *where);
/* Process-wide finiteness checks. ON (the default): every layer's rows computed in host memory
 * (the CPU backend) are scanned by the block stage after that layer, and rows computed on a GPU
 * where they are brought to the host (the final norm, the block's download, the graph's own) by a
 * pass on the device (the backend's non-finite scan, issued ahead of the download so that it adds
 * no wait; on the host where the backend has none), a hit then named from the host copy. Measured
 * cost: 0.007% of a CPU segment, and within noise (under 1%) of the reference model's rate on an
 * H100 (bench/RESULTS.md). HOST: only rows computed in host memory. OFF: no scan (for a model
 * known to produce infinities on purpose). Thread-safe; read by the block stage at init and by the
 * stages that bring rows to the host per packet. */
typedef enum sf_check_finite_mode {
    SF_CHECK_FINITE_OFF = 0,
    SF_CHECK_FINITE_ON = 1,
    SF_CHECK_FINITE_HOST = 2
} sf_check_finite_mode;
/* SF_E_INVAL for a mode not in the enum (the mode is then unchanged). */
int sf_set_check_finite(sf_check_finite_mode mode);
sf_check_finite_mode sf_check_finite(void);
/* Bytes of the rows: n * width * sf_dtype_size(dtype). */
size_t sf_packet_row_bytes(const sf_packet *p);
/* The rows' buffer, whatever their type (x or x_bf16). */
static inline const void *sf_packet_rows(const sf_packet *p) { return p->x ? (const void *)p->x : (const void *)p->x_bf16; }

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
