/* The state store: a hash map of stream entries in three tiers (hot raw, compressed in memory,
 * spilled to files), kept within a byte budget by a segmented LRU. See state_store.h. */
#include "state/state_store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state/file_io.h"
#include "seqflow/error.h"

/* What malloc keeps beside each block (glibc: 8 to 16 bytes); counted so that the budget
 * reflects memory really taken, not only the bytes asked for. */
#define ALLOC_OVERHEAD 16
#define TABLE_MIN 16

enum {
    TIER_HOT = SF_STATE_HOT,
    TIER_COLD = SF_STATE_COMPRESSED,
    TIER_SPILLED = SF_STATE_SPILLED
};

typedef struct entry {
    uint64_t id, generation;
    struct entry *prev, *next; /* in the hot or cold list; unused when spilled */
    uint8_t *data;             /* hot: floats then meta; cold: the frames */
    size_t alloc;              /* accounted size of data (0 when data is NULL) */
    size_t floats, meta_bytes;
    size_t frame_bytes; /* cold and spilled: length of the frames */
    int tier;
} entry;

/* Most recently used at head, least at tail. */
typedef struct lru {
    entry *head, *tail;
    size_t count;
} lru;

struct sf_state_store {
    sf_state_store_config cfg;
    char *spill_dir; /* this store's own subdirectory (mkdtemp), NULL when not spilling */
    char *path, *tmp_path; /* room for one spill path and its temporary name */
    size_t path_cap;
    entry **slots; /* open addressing, linear probing, power-of-two size */
    size_t cap, count;
    lru hot, cold;
    size_t spilled;
    size_t hot_raw, raw_total;
    size_t mem, peak, disk;
    uint8_t *scratch; /* frames of the largest stream, then its floats decoded */
    size_t scratch_cap, max_floats, max_meta;
    uint64_t next_generation, compressions, spills, loads;
};

static size_t raw_size(const entry *e) { return e->floats * sizeof(float) + e->meta_bytes; }
static size_t block_cost(size_t bytes) { return bytes ? bytes + ALLOC_OVERHEAD : 0; }

/* The frames of floats + meta never exceed this: two headers, the quantized floats (which a
 * small group makes larger than the floats themselves: int8 with group 1 is 5 bytes a value)
 * or the raw ones (the lossless fallback for NaN and Inf), the codecs' worst-case expansion
 * (LZ4 n/255 + 16, zstd n/256 + 64) with slack, and the meta blob raw. */
static size_t frame_bound(const sf_state_store *s, size_t floats, size_t meta)
{
    size_t v = floats * sizeof(float);
    size_t quantized = floats ? sf_quant_encoded_size(&s->cfg.quant, floats) : 0;
    if (quantized > v) v = quantized;
    return 2 * SF_FRAME_HEADER_SIZE + v + v / 128 + meta + 1024;
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The scratch holds the frames of the largest stream in [0, frame_region) and its floats
 * decoded after that, so that a spill file read in never overlaps what is decoded from it. */
static size_t frame_region(const sf_state_store *s, size_t floats, size_t meta)
{
    return align16(frame_bound(s, floats, meta));
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void charge(sf_state_store *s, size_t bytes)
{
    s->mem += bytes;
    if (s->mem > s->peak) s->peak = s->mem;
}

static void release(sf_state_store *s, size_t bytes) { s->mem -= bytes; }

/* ---- LRU lists ------------------------------------------------------------------------- */

static void lru_unlink(lru *l, entry *e)
{
    if (e->prev) e->prev->next = e->next;
    else l->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else l->tail = e->prev;
    e->prev = e->next = NULL;
    l->count--;
}

static void lru_push_front(lru *l, entry *e)
{
    e->prev = NULL;
    e->next = l->head;
    if (l->head) l->head->prev = e;
    l->head = e;
    if (!l->tail) l->tail = e;
    l->count++;
}

static lru *list_of(sf_state_store *s, entry *e)
{
    return e->tier == TIER_HOT ? &s->hot : e->tier == TIER_COLD ? &s->cold : NULL;
}

/* The least recently used entry of l other than skip. */
static entry *lru_victim(const lru *l, const entry *skip)
{
    entry *e = l->tail;
    if (e && e == skip) e = e->prev;
    return e;
}

/* ---- hash table ------------------------------------------------------------------------ */

static size_t find_slot(const sf_state_store *s, uint64_t id)
{
    size_t mask = s->cap - 1, i = (size_t)mix(id) & mask;
    while (s->slots[i] && s->slots[i]->id != id) i = (i + 1) & mask;
    return i;
}

static entry *find(const sf_state_store *s, uint64_t id)
{
    return s->slots[find_slot(s, id)];
}

/* Bytes a table grown for one more entry would need, or 0 when it has room (load <= 1/2). */
static size_t table_growth(const sf_state_store *s)
{
    if ((s->count + 1) * 2 <= s->cap) return 0;
    return block_cost(s->cap * 2 * sizeof(entry *));
}

static int table_grow(sf_state_store *s)
{
    size_t cap = s->cap * 2;
    entry **slots = calloc(cap, sizeof *slots);
    if (!slots) return sf_error(SF_E_NOMEM, "state store: out of memory growing its table");
    charge(s, block_cost(cap * sizeof *slots));
    entry **old = s->slots;
    size_t old_cap = s->cap;
    s->slots = slots;
    s->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) s->slots[find_slot(s, old[i]->id)] = old[i];
    free(old);
    release(s, block_cost(old_cap * sizeof *old));
    return SF_OK;
}

/* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
static void table_delete(sf_state_store *s, size_t i)
{
    size_t mask = s->cap - 1, j = i;
    s->slots[i] = NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->slots[j]) return;
        size_t k = (size_t)mix(s->slots[j]->id) & mask;
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            s->slots[i] = s->slots[j];
            s->slots[j] = NULL;
            i = j;
        }
    }
}

/* ---- files ----------------------------------------------------------------------------- */

static const char *spill_path(sf_state_store *s, const entry *e, int tmp)
{
    char *dst = tmp ? s->tmp_path : s->path;
    snprintf(dst, s->path_cap, "%s/%016llx.sqf%s", s->spill_dir, (unsigned long long)e->id,
             tmp ? ".tmp" : "");
    return dst;
}

static int write_spill(sf_state_store *s, entry *e, const uint8_t *data, size_t len)
{
    return sf_write_file_atomic(spill_path(s, e, 0), spill_path(s, e, 1), data, len,
                                s->cfg.fsync, 0600);
}

static int read_spill(sf_state_store *s, entry *e, uint8_t *dst)
{
    return sf_read_file_exact(spill_path(s, e, 0), dst, e->frame_bytes);
}

/* ---- frames ---------------------------------------------------------------------------- */

/* Writes e's frames (floats, then meta) into the scratch; *len receives their size. */
static int encode_entry(sf_state_store *s, const entry *e, size_t *len)
{
    sf_buffer buf = {s->scratch, 0, s->scratch_cap};
    int rc = SF_OK;
    if (e->floats) {
        sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = SF_FRAME_F32, .ndim = 1,
                           .shape = {e->floats}, .stream = e->id, .segment = e->generation,
                           .codec = s->cfg.codec, .level = s->cfg.level, .quant = s->cfg.quant};
        size_t bytes = e->floats * sizeof(float);
        rc = sf_frame_encode(&d, e->data, bytes, NULL, &buf);
        if (rc != SF_OK && d.quant.kind != SF_QUANT_F32) {
            /* the quantizers refuse NaN and Inf: such a state is kept losslessly */
            d.quant = (sf_quant_params){SF_QUANT_F32, 1};
            sf_clear_error();
            rc = sf_frame_encode(&d, e->data, bytes, NULL, &buf);
        }
    }
    if (rc == SF_OK && e->meta_bytes) {
        sf_frame_desc d = {.kind = SF_FRAME_BLOB, .dtype = SF_FRAME_U8, .ndim = 1,
                           .shape = {e->meta_bytes}, .stream = e->id, .segment = e->generation,
                           .codec = SF_CODEC_RAW, .quant = {SF_QUANT_F32, 1}};
        rc = sf_frame_encode(&d, e->data + e->floats * sizeof(float), e->meta_bytes, NULL, &buf);
    }
    if (buf.data != s->scratch) { /* the encoder outgrew frame_bound: follow its buffer */
        release(s, block_cost(s->scratch_cap));
        charge(s, block_cost(buf.cap));
        s->scratch = buf.data;
        s->scratch_cap = buf.cap;
    }
    *len = buf.len;
    return rc;
}

/* Checks one frame's header against what the entry wrote, then decodes it into dst. */
static int decode_one(const entry *e, const uint8_t *buf, size_t len, sf_frame_kind kind,
                      size_t values, void *dst, size_t dst_size, size_t *used)
{
    size_t limit = dst_size > e->frame_bytes ? dst_size : e->frame_bytes;
    sf_frame_header h;
    int rc = sf_frame_peek(buf, len, limit, &h);
    if (rc != SF_OK) return rc;
    if (h.kind != kind || h.ndim != 1 || h.shape[0] != values || h.stream != e->id ||
        h.segment != e->generation)
        return sf_error(SF_E_FRAME,
                        "frame of kind %d, %llu values, stream %llu, generation %llu: expected "
                        "kind %d, %zu values, stream %llu, generation %llu",
                        (int)h.kind, (unsigned long long)h.shape[0], (unsigned long long)h.stream,
                        (unsigned long long)h.segment, (int)kind, values,
                        (unsigned long long)e->id, (unsigned long long)e->generation);
    return sf_frame_decode_into(buf, len, limit, &h, dst, dst_size, used);
}

static int decode_entry(const entry *e, const uint8_t *frames, float *floats, void *meta)
{
    size_t at = 0, used = 0;
    int rc = SF_OK;
    if (e->floats) {
        rc = decode_one(e, frames, e->frame_bytes, SF_FRAME_STATE, e->floats, floats,
                        e->floats * sizeof(float), &used);
        at += used;
    }
    if (rc == SF_OK && e->meta_bytes) {
        rc = decode_one(e, frames + at, e->frame_bytes - at, SF_FRAME_BLOB, e->meta_bytes, meta,
                        e->meta_bytes, &used);
        at += used;
    }
    if (rc == SF_OK && at != e->frame_bytes)
        rc = sf_error(SF_E_FRAME, "%zu bytes after the frames", e->frame_bytes - at);
    return rc;
}

/* ---- moving entries between tiers ------------------------------------------------------ */

static int budget_error(sf_state_store *s, uint64_t id, size_t need)
{
    return sf_error(SF_E_BUDGET,
                    "state store: budget of %zu bytes cannot hold stream %llu (%zu more bytes "
                    "needed; %zu in use by %zu streams: %zu hot, %zu compressed, %zu spilled)%s",
                    s->cfg.budget_bytes, (unsigned long long)id, need, s->mem, s->count,
                    s->hot.count, s->cold.count, s->spilled,
                    s->spill_dir ? "" : "; no spill directory is set");
}

static void drop_data(sf_state_store *s, entry *e)
{
    free(e->data);
    release(s, block_cost(e->alloc));
    e->data = NULL;
    e->alloc = 0;
}

static int spill_cold(sf_state_store *s, entry *e)
{
    if (e->frame_bytes) {
        int rc = write_spill(s, e, e->data, e->frame_bytes);
        if (rc != SF_OK) return rc;
    }
    lru_unlink(&s->cold, e);
    drop_data(s, e);
    e->tier = TIER_SPILLED;
    s->spilled++;
    s->disk += e->frame_bytes;
    s->spills++;
    return SF_OK;
}

/* Writes e's frames, encoded in the scratch, straight from the hot tier to disk. */
static int spill_hot(sf_state_store *s, entry *e, size_t len)
{
    e->frame_bytes = len;
    int rc = write_spill(s, e, s->scratch, len);
    if (rc != SF_OK) return rc;
    lru_unlink(&s->hot, e);
    s->hot_raw -= raw_size(e);
    drop_data(s, e);
    e->tier = TIER_SPILLED;
    s->spilled++;
    s->disk += len;
    s->spills++;
    return SF_OK;
}

/* Moves e (hot) to the compressed tier; keep is never spilled to make room for it. */
static int compress_hot(sf_state_store *s, entry *e, const entry *keep)
{
    size_t raw = raw_size(e), len = 0;
    int rc = raw ? encode_entry(s, e, &len) : SF_OK;
    if (rc != SF_OK) return rc;
    s->compressions++;
    if (len <= raw) {
        /* shrink in place: the accounted bytes only ever go down */
        if (len) memcpy(e->data, s->scratch, len);
        uint8_t *p = len ? realloc(e->data, len) : NULL;
        if (!len) {
            drop_data(s, e);
        } else if (p) {
            e->data = p;
            release(s, e->alloc - len);
            e->alloc = len;
        }
    } else if (s->mem + block_cost(len) <= s->cfg.budget_bytes ||
               (s->spill_dir && lru_victim(&s->cold, keep))) {
        /* incompressible: it still leaves the hot share, and older compressed entries go to
         * disk before it does, so that the tiers keep their recency order */
        entry *older;
        while (s->mem + block_cost(len) > s->cfg.budget_bytes &&
               (older = lru_victim(&s->cold, keep)) && s->spill_dir) {
            rc = spill_cold(s, older);
            if (rc != SF_OK) return rc;
        }
        if (s->mem + block_cost(len) > s->cfg.budget_bytes) return spill_hot(s, e, len);
        uint8_t *p = malloc(len);
        if (!p) return sf_error(SF_E_NOMEM, "state store: out of memory");
        charge(s, block_cost(len));
        memcpy(p, s->scratch, len);
        drop_data(s, e);
        e->data = p;
        e->alloc = len;
    } else if (s->spill_dir) {
        return spill_hot(s, e, len);
    } else {
        return budget_error(s, e->id, block_cost(len));
    }
    e->frame_bytes = len;
    lru_unlink(&s->hot, e);
    s->hot_raw -= raw;
    e->tier = TIER_COLD;
    lru_push_front(&s->cold, e);
    return SF_OK;
}

/* Compresses and spills least recently used entries (never keep) until adding `added` bytes
 * after freeing `freed` stays within the budget and `raw` more hot bytes (after `hot_freed`)
 * within the hot share. The hot share yields when only keep is hot. */
static int make_room(sf_state_store *s, const entry *keep, uint64_t id, size_t added,
                     size_t freed, size_t raw, size_t hot_freed)
{
    for (;;) {
        int over_mem = s->mem + added > s->cfg.budget_bytes + freed;
        int over_hot = s->hot_raw + raw > s->cfg.hot_bytes + hot_freed;
        entry *hot = lru_victim(&s->hot, keep), *cold = lru_victim(&s->cold, keep);
        int rc;
        if (over_hot && hot) {
            rc = compress_hot(s, hot, keep);
        } else if (over_mem && cold && s->spill_dir) {
            rc = spill_cold(s, cold);
        } else if (over_mem && hot) {
            rc = compress_hot(s, hot, keep);
        } else if (over_mem) {
            return budget_error(s, id, s->mem + added - freed - s->cfg.budget_bytes);
        } else {
            return SF_OK;
        }
        if (rc != SF_OK) return rc;
    }
}

/* ---- public API ------------------------------------------------------------------------ */

void sf_state_store_config_default(sf_state_store_config *c)
{
    memset(c, 0, sizeof *c);
    c->codec = SF_CODEC_ZSTD;
    c->level = 1;
    c->quant = (sf_quant_params){SF_QUANT_F32, 1};
    c->fsync = 1;
}

static int prepare_spill_dir(const char *dir)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return sf_error(SF_E_IO, "state store: cannot create spill directory %s: %s", dir,
                        strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK) != 0)
        return sf_error(SF_E_IO, "state store: spill directory %s is not a writable directory",
                        dir);
    return SF_OK;
}

int sf_state_store_create(const sf_state_store_config *c, sf_state_store **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_state_store_create: NULL out");
    *out = NULL;
    if (!c || c->budget_bytes == 0)
        return sf_error(SF_E_INVAL, "state store: a budget of at least one byte is needed");
    if (sf_quant_encoded_size(&c->quant, 2) == 0)
        return sf_error(SF_E_INVAL, "state store: invalid quantization (kind %d, group %d)",
                        (int)c->quant.kind, c->quant.group);
    if (c->codec != SF_CODEC_RAW && c->codec != SF_CODEC_LZ4 && c->codec != SF_CODEC_ZSTD)
        return sf_error(SF_E_INVAL, "state store: unknown codec %d", (int)c->codec);
    int spilling = c->spill_dir && c->spill_dir[0];
    if (spilling) {
        int rc = prepare_spill_dir(c->spill_dir);
        if (rc != SF_OK) return rc;
    }
    sf_state_store *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "state store: out of memory");
    s->cfg = *c;
    s->cfg.spill_dir = NULL;
    if (s->cfg.hot_bytes == 0 || s->cfg.hot_bytes > c->budget_bytes)
        s->cfg.hot_bytes = c->hot_bytes ? c->budget_bytes : c->budget_bytes / 2;
    s->cap = TABLE_MIN;
    s->slots = calloc(s->cap, sizeof *s->slots);
    size_t dir_size = spilling ? strlen(c->spill_dir) + sizeof "/sf-state-XXXXXX" : 0;
    if (spilling) {
        s->path_cap = dir_size + sizeof "/0123456789abcdef.sqf.tmp";
        s->path = malloc(s->path_cap);
        s->tmp_path = malloc(s->path_cap);
        char *sub = malloc(dir_size);
        if (sub) {
            /* a directory of its own: no other store or process (whatever its pid) can name
             * the same files, and free removes the lot */
            snprintf(sub, dir_size, "%s/sf-state-XXXXXX", c->spill_dir);
            if (!mkdtemp(sub)) {
                int rc = sf_error(SF_E_IO, "state store: cannot create a spill directory in %s: %s",
                                  c->spill_dir, strerror(errno));
                free(sub);
                sf_state_store_free(s);
                return rc;
            }
            s->spill_dir = sub;
        }
    }
    charge(s, block_cost(sizeof *s) + block_cost(s->cap * sizeof *s->slots));
    if (spilling) charge(s, block_cost(dir_size) + 2 * block_cost(s->path_cap));
    if (!s->slots || (spilling && (!s->spill_dir || !s->path || !s->tmp_path))) {
        sf_state_store_free(s);
        return sf_error(SF_E_NOMEM, "state store: out of memory");
    }
    if (s->mem > s->cfg.budget_bytes) {
        int rc = sf_error(SF_E_BUDGET, "state store: a budget of %zu bytes is below the %zu "
                          "bytes of the store's own records", c->budget_bytes, s->mem);
        sf_state_store_free(s);
        return rc;
    }
    *out = s;
    return SF_OK;
}

/* Takes e out of its tier (deleting its spill file) and frees its data; the table keeps it. */
static void detach_entry(sf_state_store *s, entry *e)
{
    if (e->tier == TIER_SPILLED) {
        if (e->frame_bytes) unlink(spill_path(s, e, 0));
        s->spilled--;
        s->disk -= e->frame_bytes;
    } else {
        if (e->tier == TIER_HOT) s->hot_raw -= raw_size(e);
        lru_unlink(list_of(s, e), e);
    }
    s->raw_total -= raw_size(e);
    drop_data(s, e);
}

static void destroy_entry(sf_state_store *s, entry *e)
{
    detach_entry(s, e);
    free(e);
    release(s, block_cost(sizeof *e));
    s->count--;
}

void sf_state_store_clear(sf_state_store *s)
{
    for (size_t i = 0; s && s->slots && i < s->cap; i++) {
        if (s->slots[i]) destroy_entry(s, s->slots[i]);
        s->slots[i] = NULL;
    }
}

void sf_state_store_free(sf_state_store *s)
{
    if (!s) return;
    sf_state_store_clear(s);
    if (s->spill_dir) rmdir(s->spill_dir); /* empty now: clear deleted every file */
    free(s->slots);
    free(s->scratch);
    free(s->spill_dir);
    free(s->path);
    free(s->tmp_path);
    free(s);
}

int sf_state_store_put(sf_state_store *s, uint64_t stream, const sf_state_span *spans,
                       int nspans, const void *meta, size_t meta_bytes)
{
    if (!s || nspans < 0 || (nspans && !spans) || (meta_bytes && !meta))
        return sf_error(SF_E_INVAL, "sf_state_store_put: NULL or negative argument");
    size_t floats = 0;
    for (int i = 0; i < nspans; i++) {
        if (spans[i].count && !spans[i].data)
            return sf_error(SF_E_INVAL, "sf_state_store_put: span %d has no data", i);
        if (spans[i].count > (SIZE_MAX / 8 - floats) / sizeof(float))
            return sf_error(SF_E_INVAL, "sf_state_store_put: state too large");
        floats += spans[i].count;
    }
    if (meta_bytes > SIZE_MAX / 8)
        return sf_error(SF_E_INVAL, "sf_state_store_put: metadata too large");
    size_t raw = floats * sizeof(float) + meta_bytes;
    entry *e = find(s, stream);

    size_t max_floats = floats > s->max_floats ? floats : s->max_floats;
    size_t max_meta = meta_bytes > s->max_meta ? meta_bytes : s->max_meta;
    size_t scratch_need = frame_region(s, max_floats, max_meta) + max_floats * sizeof(float);
    size_t scratch_more = scratch_need > s->scratch_cap ? block_cost(scratch_need) : 0;
    size_t added = block_cost(raw) + scratch_more;
    if (!e) added += block_cost(sizeof(entry)) + table_growth(s);
    size_t freed = scratch_more ? block_cost(s->scratch_cap) : 0;
    if (e) freed += block_cost(e->alloc);
    size_t hot_freed = e && e->tier == TIER_HOT ? raw_size(e) : 0;
    int rc = make_room(s, e, stream, added, freed, raw, hot_freed);
    if (rc != SF_OK) return rc;

    /* From here the store changes; past this point only SF_E_NOMEM can fail, and then the
     * stream is dropped rather than left half-written. */
    if (e) {
        detach_entry(s, e);
        e->floats = e->meta_bytes = e->frame_bytes = 0;
        e->tier = TIER_HOT;
        lru_push_front(&s->hot, e);
    }
    if (scratch_more) {
        /* realloc keeps the old scratch when it fails: compressed and spilled entries still
         * need one of the old size */
        uint8_t *grown = realloc(s->scratch, scratch_need);
        if (!grown) rc = sf_error(SF_E_NOMEM, "state store: out of memory");
        else {
            release(s, block_cost(s->scratch_cap));
            charge(s, block_cost(scratch_need));
            s->scratch = grown;
            s->scratch_cap = scratch_need;
            s->max_floats = max_floats;
            s->max_meta = max_meta;
        }
    }
    if (rc == SF_OK && !e) {
        if (table_growth(s)) rc = table_grow(s);
        if (rc == SF_OK) {
            e = calloc(1, sizeof *e);
            if (!e) rc = sf_error(SF_E_NOMEM, "state store: out of memory");
        }
        if (rc == SF_OK) {
            charge(s, block_cost(sizeof *e));
            e->id = stream;
            e->tier = TIER_HOT;
            s->slots[find_slot(s, stream)] = e;
            s->count++;
            lru_push_front(&s->hot, e);
        }
    }
    if (rc == SF_OK && raw) {
        e->data = malloc(raw);
        if (!e->data) rc = sf_error(SF_E_NOMEM, "state store: out of memory");
        else {
            charge(s, block_cost(raw));
            e->alloc = raw;
        }
    }
    if (rc != SF_OK) {
        if (e) sf_state_store_remove(s, stream);
        return rc;
    }
    e->floats = floats;
    e->meta_bytes = meta_bytes;
    e->generation = ++s->next_generation;
    size_t at = 0;
    for (int i = 0; i < nspans; i++) {
        if (spans[i].count) memcpy(e->data + at, spans[i].data, spans[i].count * sizeof(float));
        at += spans[i].count * sizeof(float);
    }
    if (meta_bytes) memcpy(e->data + at, meta, meta_bytes);
    s->hot_raw += raw;
    s->raw_total += raw;
    return SF_OK;
}

static void scatter(const float *src, const sf_state_span *spans, int nspans)
{
    for (int i = 0; i < nspans; i++) {
        if (spans[i].count) memcpy(spans[i].data, src, spans[i].count * sizeof(float));
        src += spans[i].count;
    }
}

int sf_state_store_get(sf_state_store *s, uint64_t stream, const sf_state_span *spans,
                       int nspans, void *meta, size_t meta_size, size_t *meta_bytes)
{
    if (!s || nspans < 0 || (nspans && !spans))
        return sf_error(SF_E_INVAL, "sf_state_store_get: NULL or negative argument");
    entry *e = find(s, stream);
    if (!e)
        return sf_error(SF_E_INVAL, "state store: stream %llu is not in the store",
                        (unsigned long long)stream);
    size_t floats = 0;
    for (int i = 0; i < nspans; i++) {
        if (spans[i].count && !spans[i].data)
            return sf_error(SF_E_INVAL, "sf_state_store_get: span %d has no data", i);
        floats += spans[i].count;
    }
    if (floats != e->floats || meta_size < e->meta_bytes || (e->meta_bytes && !meta))
        return sf_error(SF_E_INVAL,
                        "state store: stream %llu holds %zu floats and %zu metadata bytes; "
                        "asked for %zu floats into %zu metadata bytes",
                        (unsigned long long)stream, e->floats, e->meta_bytes, floats, meta_size);
    if (meta_bytes) *meta_bytes = e->meta_bytes;
    if (e->tier == TIER_HOT) {
        scatter((const float *)e->data, spans, nspans);
        if (e->meta_bytes) memcpy(meta, e->data + e->floats * sizeof(float), e->meta_bytes);
        lru_unlink(&s->hot, e);
        lru_push_front(&s->hot, e);
        return SF_OK;
    }
    /* one span: decode straight into it; several: into the scratch, then scatter */
    size_t region = frame_region(s, s->max_floats, s->max_meta);
    int via_scratch = e->floats && nspans > 1;
    if ((via_scratch || (e->tier == TIER_SPILLED && e->frame_bytes)) && !s->scratch)
        return sf_error(SF_E_NOMEM, "state store: no scratch buffer to read stream %llu into",
                        (unsigned long long)stream);
    if (e->tier == TIER_SPILLED && e->frame_bytes > (via_scratch ? region : s->scratch_cap))
        return sf_error(SF_E_STATE, "state store: stream %llu has %zu bytes of frames, more than "
                        "the scratch holds (%zu)", (unsigned long long)stream, e->frame_bytes,
                        via_scratch ? region : s->scratch_cap);
    float *dst = !e->floats ? NULL : via_scratch ? (float *)(s->scratch + region) : spans[0].data;
    int rc;
    if (e->tier == TIER_COLD) {
        rc = decode_entry(e, e->data, dst, meta);
        if (rc == SF_OK) {
            lru_unlink(&s->cold, e);
            lru_push_front(&s->cold, e);
        }
    } else {
        rc = e->frame_bytes ? read_spill(s, e, s->scratch) : SF_OK; /* empty: no file */
        if (rc == SF_OK) rc = decode_entry(e, s->scratch, dst, meta);
        if (rc == SF_OK) s->loads++;
        else if (rc != SF_E_IO) {
            char why[512];
            snprintf(why, sizeof why, "%s", sf_last_error());
            rc = sf_error(rc, "state store: spill file %s of stream %llu is damaged: %s",
                          spill_path(s, e, 0), (unsigned long long)stream, why);
        }
    }
    if (rc == SF_OK && nspans > 1) scatter(dst, spans, nspans);
    return rc;
}

int sf_state_store_take(sf_state_store *s, uint64_t stream, const sf_state_span *spans,
                        int nspans, void *meta, size_t meta_size, size_t *meta_bytes)
{
    int rc = sf_state_store_get(s, stream, spans, nspans, meta, meta_size, meta_bytes);
    if (rc == SF_OK) rc = sf_state_store_remove(s, stream);
    return rc;
}

int sf_state_store_contains(const sf_state_store *s, uint64_t stream)
{
    return s && find(s, stream) != NULL;
}

int sf_state_store_info(const sf_state_store *s, uint64_t stream, size_t *floats,
                        size_t *meta_bytes)
{
    const entry *e = s ? find(s, stream) : NULL;
    if (!e)
        return sf_error(SF_E_INVAL, "state store: stream %llu is not in the store",
                        (unsigned long long)stream);
    if (floats) *floats = e->floats;
    if (meta_bytes) *meta_bytes = e->meta_bytes;
    return SF_OK;
}

int sf_state_store_remove(sf_state_store *s, uint64_t stream)
{
    if (!s) return sf_error(SF_E_INVAL, "sf_state_store_remove: NULL store");
    size_t i = find_slot(s, stream);
    entry *e = s->slots[i];
    if (!e) return SF_OK;
    table_delete(s, i);
    destroy_entry(s, e);
    return SF_OK;
}

void sf_state_store_get_stats(const sf_state_store *s, sf_state_store_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s) return;
    out->streams = s->count;
    out->hot = s->hot.count;
    out->compressed = s->cold.count;
    out->spilled = s->spilled;
    out->bytes_in_memory = s->mem;
    out->peak_bytes = s->peak;
    out->bytes_on_disk = s->disk;
    out->raw_bytes = s->raw_total;
    out->compressions = s->compressions;
    out->spills = s->spills;
    out->loads = s->loads;
}

const char *sf_state_store_spill_path(sf_state_store *s, uint64_t stream)
{
    entry *e = s ? find(s, stream) : NULL;
    if (!e || e->tier != TIER_SPILLED || !e->frame_bytes) return NULL;
    return spill_path(s, e, 0);
}

int sf_state_store_tier(const sf_state_store *s, uint64_t stream)
{
    const entry *e = s ? find(s, stream) : NULL;
    if (!e)
        return sf_error(SF_E_INVAL, "state store: stream %llu is not in the store",
                        (unsigned long long)stream);
    return e->tier;
}

int sf_state_store_foreach(const sf_state_store *s, int (*fn)(void *ctx, uint64_t stream),
                           void *ctx)
{
    if (!s || !fn) return sf_error(SF_E_INVAL, "sf_state_store_foreach: NULL argument");
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->slots[i]) continue;
        int rc = fn(ctx, s->slots[i]->id);
        if (rc != 0) return rc;
    }
    return SF_OK;
}
