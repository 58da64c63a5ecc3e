/* A store of per-stream state under a byte budget.
 *
 * A stream's state, to the store, is a float32 region (M and z per layer and head, the
 * global-token FIFO, a partial segment: whatever the caller lays out, given as a list of spans
 * that are gathered on put and scattered on get) plus a small metadata blob (integer fields
 * such as FIFO counts and heads), kept bit for bit.
 *
 * Tiers, each entry in exactly one:
 *   hot         the raw bytes, in memory. Every put lands here.
 *   compressed  one SF_FRAME_STATE frame of the floats (quantization and codec from the config;
 *               lossless F32 by default) followed by one SF_FRAME_BLOB frame of the metadata
 *               (always lossless), in memory. When the hot bytes exceed hot_bytes, the least
 *               recently used hot entries are compressed.
 *   spilled     the same frames in one file per stream in the store's own subdirectory
 *               spill_dir/sf-state-XXXXXX (made by mkdtemp at create, so that stores and
 *               processes sharing spill_dir never name the same file), written atomically
 *               (temporary name, fsync, rename) and read back through the frame decoder with
 *               a size limit and a check that stream id, generation and shape are the ones
 *               written. When memory would exceed the budget, the least recently used
 *               compressed entries are spilled (and hot ones written straight to disk when
 *               compressing them cannot make room).
 * Without a spill directory, a put that cannot fit fails with SF_E_BUDGET and leaves the store
 * (including that stream's previous state) unchanged.
 *
 * Accounting: the bytes the store holds (raw and compressed data, one entry record per stream,
 * the hash table, one scratch buffer sized for the largest stream, plus an estimate of malloc's
 * per-block overhead) never exceed budget_bytes, counted before each allocation, so peak_bytes
 * <= budget_bytes always holds. Temporary buffers inside the frame codec are not counted.
 *
 * Lossy mode (quant.kind != SF_QUANT_F32): get returns each float within
 * sf_quant_error_bound(quant, values put, n) of what was put. A state holding NaN or Inf is
 * compressed losslessly instead (the quantizers refuse non-finite values). Hot entries are
 * always exact.
 *
 * Streams are found by a hash of their u64 id (constant time for any number of streams). A
 * store is not thread-safe: use it from one thread, or lock around it. */
#ifndef SEQFLOW_MEMORY_STATE_STORE_H
#define SEQFLOW_MEMORY_STATE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "compress/frame.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_state_store sf_state_store;

typedef struct sf_state_store_config {
    size_t budget_bytes;   /* hard limit on the bytes accounted in memory (> 0) */
    size_t hot_bytes;      /* share of the budget kept raw; 0 = half the budget */
    const char *spill_dir; /* NULL or "" = never spill; created (one level) when missing */
    sf_codec codec;        /* for the float frame (default SF_CODEC_ZSTD) */
    int level;             /* codec level (0 = codec default) */
    sf_quant_params quant; /* default {SF_QUANT_F32, 1}: lossless */
    int fsync;             /* fsync spill files before renaming them (default 1) */
} sf_state_store_config;

/* One piece of a stream's float region: count floats at data. */
typedef struct sf_state_span {
    float *data;
    size_t count;
} sf_state_span;

typedef struct sf_state_store_stats {
    size_t streams, hot, compressed, spilled; /* entries in each tier */
    size_t bytes_in_memory;                   /* accounted bytes now */
    size_t peak_bytes;                        /* the most bytes_in_memory has been */
    size_t bytes_on_disk;                     /* spill file bytes now */
    size_t raw_bytes;                         /* what every stream's state would take raw */
    uint64_t compressions, spills, loads;     /* counts since create (loads = spill reads) */
} sf_state_store_stats;

/* Fills c with the defaults above (budget 0: the caller must set one). */
void sf_state_store_config_default(sf_state_store_config *c);

/* Creates a store; *out is owned by the caller and released with sf_state_store_free. The
 * config (spill_dir included) is copied. With a spill_dir, the store's subdirectory is made
 * here. SF_E_INVAL for a zero budget, bad quantization or codec, SF_E_IO when spill_dir or the
 * subdirectory cannot be created, SF_E_BUDGET when the budget cannot even hold the store's own
 * records. */
int sf_state_store_create(const sf_state_store_config *c, sf_state_store **out);

/* Removes every spill file this store wrote and its subdirectory, and frees everything.
 * NULL-safe. A process killed before this leaves the subdirectory behind: nothing reads it
 * again, and it is safe to delete. */
void sf_state_store_free(sf_state_store *s);

/* Stores (replaces) stream's state: the floats of spans[0..nspans) in order, and meta_bytes
 * of meta (may be 0). The data is copied; the entry becomes the most recently used. Other
 * entries are compressed or spilled to make room. SF_E_BUDGET when it cannot fit (the store
 * and the stream's previous state are then unchanged), SF_E_IO for a failed spill write. */
int sf_state_store_put(sf_state_store *s, uint64_t stream, const sf_state_span *spans,
                       int nspans, const void *meta, size_t meta_bytes);

/* Copies stream's state out: the spans' counts must add up to the stored float count and
 * meta_size must be at least the stored metadata size (*meta_bytes, when not NULL, receives
 * it). The entry stays in its tier and becomes the most recently used. SF_E_INVAL for an
 * unknown stream or mismatched sizes; SF_E_FRAME* or SF_E_IO when a compressed or spilled
 * copy is damaged (the entry is kept, so that it can be removed); SF_E_NOMEM when the
 * store never got a scratch buffer to read it through. */
int sf_state_store_get(sf_state_store *s, uint64_t stream, const sf_state_span *spans,
                       int nspans, void *meta, size_t meta_size, size_t *meta_bytes);

/* As get, then removes the stream (only when the get succeeded). */
int sf_state_store_take(sf_state_store *s, uint64_t stream, const sf_state_span *spans,
                        int nspans, void *meta, size_t meta_size, size_t *meta_bytes);

/* 1 when the store holds stream, else 0. */
int sf_state_store_contains(const sf_state_store *s, uint64_t stream);

/* The stored float count and metadata size of stream; SF_E_INVAL when unknown. */
int sf_state_store_info(const sf_state_store *s, uint64_t stream, size_t *floats,
                        size_t *meta_bytes);

/* Calls fn(ctx, id) once for every stream held, in no particular order, stopping at the first
 * non-zero return (which it returns). fn may get streams but must not put or remove any. */
int sf_state_store_foreach(const sf_state_store *s, int (*fn)(void *ctx, uint64_t stream),
                           void *ctx);

/* Forgets stream (its spill file is deleted). A stream the store does not hold is a no-op. */
int sf_state_store_remove(sf_state_store *s, uint64_t stream);

/* Removes every stream (and spill file); the store stays usable. */
void sf_state_store_clear(sf_state_store *s);

/* Current counts and bytes. */
void sf_state_store_get_stats(const sf_state_store *s, sf_state_store_stats *out);

/* Which tier holds stream: SF_STATE_HOT, SF_STATE_COMPRESSED or SF_STATE_SPILLED; SF_E_INVAL
 * when the store does not hold it. For tests and diagnostics. */
enum { SF_STATE_HOT = 0, SF_STATE_COMPRESSED = 1, SF_STATE_SPILLED = 2 };
int sf_state_store_tier(const sf_state_store *s, uint64_t stream);

/* The spill file path of stream while it is spilled, else NULL. The string belongs to the
 * store and is valid until its next call. For tests and diagnostics. */
const char *sf_state_store_spill_path(sf_state_store *s, uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif
