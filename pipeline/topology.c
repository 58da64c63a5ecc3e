/* The topology file (pipeline/topology.h; schema in docs/DISTRIBUTED.md, "Topology"). Every
 * field is checked where it is read, and every message carries its JSON path, so a typo in a
 * file of a hundred ranks points at its line of thought rather than at a later failure. */
#include "pipeline/topology.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/error.h"

/* Which fields of a link level the file set (the others fall through to the level below). */
enum { L_CODEC = 1, L_LEVEL = 2, L_QUANT = 4, L_GROUP = 8, L_FEEDBACK = 16, L_WPACKETS = 32, L_WBYTES = 64, L_SHUFFLE = 128 };

typedef struct link_level {
    unsigned set;
    sf_topology_link v;
} link_level;

enum { MATCH_DATACENTERS, MATCH_NODES, MATCH_RANKS };

typedef struct link_override {
    int match;   /* MATCH_* */
    int a, b;    /* datacenter, node or rank indices */
    link_level level;
} link_override;

typedef struct named {
    char *name;
    const char *path; /* where it was defined (messages) */
} named;

struct sf_topology {
    sf_topology_security security;
    int heartbeat_ms, timeout_ms, connect_timeout_ms, linger_ms, rendezvous_timeout_ms;
    char *rendezvous;
    char *pipeline;
    int world;
    sf_topology_rank *ranks;      /* [world], index = id */
    char **datacenters, **nodes;  /* names */
    int n_datacenters, n_nodes;
    link_level link_default, link_class[4]; /* indexed by sf_link_scope */
    link_override *overrides;
    int n_overrides;
    char **pool;                  /* every string the topology owns */
    size_t n_pool, cap_pool;
};

/* Parse context: the file's name for messages and the path of the value being read. */
typedef struct ctx {
    const char *name;
    sf_topology *t;
} ctx;

static int fail(const ctx *c, const char *path, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail(const ctx *c, const char *path, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sf_error(SF_E_PARSE, "%s: %s: %s", c->name, path, msg);
}

/* size zeroed bytes owned by t (freed with it); NULL on allocation failure. */
static void *keep_zeroed(sf_topology *t, size_t size)
{
    if (t->n_pool == t->cap_pool) {
        size_t cap = t->cap_pool ? 2 * t->cap_pool : 64;
        char **p = realloc(t->pool, cap * sizeof *p);
        if (!p) return NULL;
        t->pool = p;
        t->cap_pool = cap;
    }
    char *mem = calloc(1, size ? size : 1);
    if (mem) t->pool[t->n_pool++] = mem;
    return mem;
}

/* A copy of s[0..len) and a NUL, owned by t. */
static char *keep(sf_topology *t, const char *s, size_t len)
{
    char *copy = keep_zeroed(t, len + 1);
    if (copy) memcpy(copy, s, len);
    return copy;
}

static char *keep_str(sf_topology *t, const char *s) { return keep(t, s, strlen(s)); }

/* child path: "$.a" + ".b" or "[3]" into a buffer the caller provides */
static const char *field_path(char *buf, size_t size, const char *parent, const char *field)
{
    /* a path too long for the buffer ends in "..." (an unknown field's name can be anything) */
    if (snprintf(buf, size, "%s.%s", parent, field) >= (int)size) memcpy(buf + size - 4, "...", 4);
    return buf;
}
static const char *index_path(char *buf, size_t size, const char *parent, int i)
{
    if (snprintf(buf, size, "%s[%d]", parent, i) >= (int)size) memcpy(buf + size - 4, "...", 4);
    return buf;
}
#define PATH_MAX_LEN 256

/* Refuses fields of obj that are not in allowed (NULL-terminated) and fields given twice
 * (cJSON keeps both; the file's reader would see only one). */
static int check_fields(const ctx *c, const cJSON *obj, const char *path, const char *const *allowed)
{
    if (!cJSON_IsObject(obj)) return fail(c, path, "expected an object");
    for (const cJSON *f = obj->child; f; f = f->next) {
        int known = 0;
        for (const char *const *a = allowed; *a && !known; a++) known = strcmp(*a, f->string) == 0;
        char p[PATH_MAX_LEN];
        field_path(p, sizeof p, path, f->string);
        if (!known) {
            char list[300] = "";
            for (const char *const *a = allowed; *a; a++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", a == allowed ? "" : ", ", *a);
            return fail(c, p, "unknown field (expected one of: %s)", list);
        }
        for (const cJSON *g = f->next; g; g = g->next)
            if (strcmp(g->string, f->string) == 0) return fail(c, p, "given twice");
    }
    return SF_OK;
}

/* An integer field in [min, max]; *out keeps its value when the field is absent. */
static int get_int(const ctx *c, const cJSON *obj, const char *path, const char *field, long min, long max, int *present,
                   long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (present) *present = v != NULL;
    if (!v) return SF_OK;
    char p[PATH_MAX_LEN];
    field_path(p, sizeof p, path, field);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)min ||
        v->valuedouble > (double)max)
        return fail(c, p, "expected an integer in %ld..%ld", min, max);
    *out = (long)v->valuedouble;
    return SF_OK;
}

static int get_ms(const ctx *c, const cJSON *root, const char *field, int *out)
{
    long v = *out;
    int rc = get_int(c, root, "$", field, 1, 86400000L, NULL, &v);
    *out = (int)v;
    return rc;
}

/* A string field (non-empty); *out NULL when absent. */
static int get_string(const ctx *c, const cJSON *obj, const char *path, const char *field, int required,
                      const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    *out = NULL;
    char p[PATH_MAX_LEN];
    field_path(p, sizeof p, path, field);
    if (!v) return required ? fail(c, p, "required") : SF_OK;
    if (!cJSON_IsString(v) || !v->valuestring[0]) return fail(c, p, "expected a non-empty string");
    *out = v->valuestring;
    return SF_OK;
}

/* "tcp://host:port" (host a name, an IPv4 address or an IPv6 one in brackets; not "*", which
 * others cannot connect to) or "ipc://path". */
static int endpoint_ok(const char *e)
{
    if (strncmp(e, "ipc://", 6) == 0) return e[6] != '\0' && strlen(e + 6) < 108; /* sun_path */
    if (strncmp(e, "tcp://", 6) != 0) return 0;
    const char *host = e + 6, *colon = strrchr(host, ':');
    if (!colon || colon == host) return 0;
    size_t hlen = (size_t)(colon - host);
    if (host[0] == '[' ? host[hlen - 1] != ']' || hlen < 3 : memchr(host, ':', hlen) != NULL) return 0;
    if (hlen == 1 && host[0] == '*') return 0;
    for (size_t i = 0; i < hlen; i++)
        if (host[i] == '/' || host[i] == ' ' || host[i] == '*') return 0;
    long port = 0;
    const char *s = colon + 1;
    if (!*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || port > 65535) return 0;
        port = port * 10 + (*s - '0');
    }
    return port >= 1 && port <= 65535;
}

static int get_endpoint_opt(const ctx *c, const cJSON *obj, const char *path, const char *field, int required,
                            const char **out)
{
    int rc = get_string(c, obj, path, field, required, out);
    if (rc != SF_OK || !*out) return rc;
    if (!endpoint_ok(*out)) {
        char p[PATH_MAX_LEN];
        return fail(c, field_path(p, sizeof p, path, field),
                    "expected \"tcp://host:port\" or \"ipc://path\" (got \"%s\"; host not \"*\", port 1..65535)", *out);
    }
    return SF_OK;
}

static int get_endpoint(const ctx *c, const cJSON *obj, const char *path, const char *field, const char **out)
{
    return get_endpoint_opt(c, obj, path, field, 1, out);
}

/* ---- links ------------------------------------------------------------------------------------ */

void sf_topology_link_defaults(sf_topology_link *out)
{
    *out = (sf_topology_link){.codec = SF_CODEC_RAW, .level = 0, .quant = SF_QUANT_F32, .group = 0, .shuffle = 0,
                              .error_feedback = 1, .window_packets = 8, .window_bytes = (size_t)256 << 20};
}

static const char *const link_fields[] = {"codec", "level", "quant", "group", "shuffle", "error_feedback",
                                          "window_packets", "window_bytes", NULL};

/* The link fields of obj (others already checked by the caller) into *l. */
static int read_link_fields(const ctx *c, const cJSON *obj, const char *path, link_level *l)
{
    char p[PATH_MAX_LEN];
    const char *s;
    int rc = get_string(c, obj, path, "codec", 0, &s);
    if (rc != SF_OK) return rc;
    if (s) {
        if (sf_codec_parse(s, &l->v.codec) != SF_OK)
            return fail(c, field_path(p, sizeof p, path, "codec"), "expected \"raw\", \"lz4\" or \"zstd\" (got \"%s\")", s);
        l->set |= L_CODEC;
    }
    rc = get_string(c, obj, path, "quant", 0, &s);
    if (rc != SF_OK) return rc;
    if (s) {
        if (sf_quant_kind_parse(s, &l->v.quant) != SF_OK)
            return fail(c, field_path(p, sizeof p, path, "quant"),
                        "expected \"f32\", \"bf16\", \"int8\", \"int4\" or \"fp8\" (got \"%s\")", s);
        l->set |= L_QUANT;
    }
    int present;
    long v = 0;
    /* lz4: 1 fast, 2..12 HC; zstd 1..19; 0 = the codec's default */
    long max_level = (l->set & L_CODEC) && l->v.codec == SF_CODEC_LZ4 ? 12 : 19;
    if ((rc = get_int(c, obj, path, "level", 0, max_level, &present, &v)) != SF_OK) return rc;
    if (present) l->v.level = (int)v, l->set |= L_LEVEL;
    if ((rc = get_int(c, obj, path, "group", 0, 1 << 24, &present, &v)) != SF_OK) return rc;
    if (present) {
        if ((v & 1) && (l->set & L_QUANT) && l->v.quant == SF_QUANT_INT4)
            return fail(c, field_path(p, sizeof p, path, "group"), "int4 needs an even group (got %ld)", v);
        l->v.group = (int)v, l->set |= L_GROUP;
    }
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(obj, "shuffle");
    if (sh) {
        if (!cJSON_IsBool(sh)) return fail(c, field_path(p, sizeof p, path, "shuffle"), "expected true or false");
        l->v.shuffle = cJSON_IsTrue(sh);
        l->set |= L_SHUFFLE;
    }
    const cJSON *fb = cJSON_GetObjectItemCaseSensitive(obj, "error_feedback");
    if (fb) {
        if (!cJSON_IsBool(fb)) return fail(c, field_path(p, sizeof p, path, "error_feedback"), "expected true or false");
        l->v.error_feedback = cJSON_IsTrue(fb);
        l->set |= L_FEEDBACK;
    }
    if ((rc = get_int(c, obj, path, "window_packets", 1, 1 << 20, &present, &v)) != SF_OK) return rc;
    if (present) l->v.window_packets = (int)v, l->set |= L_WPACKETS;
    if ((rc = get_int(c, obj, path, "window_bytes", 1, 1L << 40, &present, &v)) != SF_OK) return rc;
    if (present) l->v.window_bytes = (size_t)v, l->set |= L_WBYTES;
    return SF_OK;
}

static void link_apply(sf_topology_link *out, const link_level *l)
{
    if (l->set & L_CODEC) out->codec = l->v.codec;
    if (l->set & L_LEVEL) out->level = l->v.level;
    if (l->set & L_QUANT) out->quant = l->v.quant;
    if (l->set & L_GROUP) out->group = l->v.group;
    if (l->set & L_SHUFFLE) out->shuffle = l->v.shuffle;
    if (l->set & L_FEEDBACK) out->error_feedback = l->v.error_feedback;
    if (l->set & L_WPACKETS) out->window_packets = l->v.window_packets;
    if (l->set & L_WBYTES) out->window_bytes = l->v.window_bytes;
}

/* An index into names[0..n) by name, for an override's pair; the message lists the names. */
static int find_name(const ctx *c, const char *path, const cJSON *v, char **names, int n, const char *what, int *out)
{
    if (!cJSON_IsString(v)) return fail(c, path, "expected a %s name", what);
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], v->valuestring) == 0) return *out = i, SF_OK;
    char list[300] = "";
    for (int i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    return fail(c, path, "no %s named \"%s\" (%ss: %s)", what, v->valuestring, what, list);
}

static int read_links(const ctx *c, const cJSON *links)
{
    sf_topology *t = c->t;
    static const char *const fields[] = {"default", "same_node", "same_datacenter", "across_datacenters", "overrides", NULL};
    int rc = check_fields(c, links, "$.links", fields);
    if (rc != SF_OK) return rc;
    static const struct { const char *field; int slot; } classes[] = {
        {"default", -1}, {"same_node", SF_LINK_SAME_NODE}, {"same_datacenter", SF_LINK_SAME_DATACENTER},
        {"across_datacenters", SF_LINK_ACROSS_DATACENTERS}};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(links, classes[i].field);
        if (!o) continue;
        char p[PATH_MAX_LEN];
        field_path(p, sizeof p, "$.links", classes[i].field);
        link_level *l = classes[i].slot < 0 ? &t->link_default : &t->link_class[classes[i].slot];
        if ((rc = check_fields(c, o, p, link_fields)) != SF_OK || (rc = read_link_fields(c, o, p, l)) != SF_OK) return rc;
    }
    const cJSON *ov = cJSON_GetObjectItemCaseSensitive(links, "overrides");
    if (!ov) return SF_OK;
    if (!cJSON_IsArray(ov)) return fail(c, "$.links.overrides", "expected a list of overrides");
    int n = cJSON_GetArraySize(ov);
    t->overrides = calloc((size_t)(n ? n : 1), sizeof *t->overrides);
    if (!t->overrides) return sf_error(SF_E_NOMEM, "out of memory");
    static const char *const override_fields[] = {"datacenters", "nodes", "ranks", "codec", "level", "quant", "group",
                                                  "shuffle", "error_feedback", "window_packets", "window_bytes", NULL};
    static const char *const match_fields[] = {"datacenters", "nodes", "ranks"};
    int i = 0;
    for (const cJSON *o = ov->child; o; o = o->next, i++) {
        char p[PATH_MAX_LEN];
        index_path(p, sizeof p, "$.links.overrides", i);
        if ((rc = check_fields(c, o, p, override_fields)) != SF_OK) return rc;
        link_override *x = &t->overrides[t->n_overrides];
        int matches = 0;
        for (int m = 0; m < 3; m++) {
            const cJSON *pair = cJSON_GetObjectItemCaseSensitive(o, match_fields[m]);
            if (!pair) continue;
            matches++;
            char pp[PATH_MAX_LEN];
            field_path(pp, sizeof pp, p, match_fields[m]);
            if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2)
                return fail(c, pp, "expected a pair, e.g. [\"%s\", \"%s\"]", m == 2 ? "1" : "a", m == 2 ? "2" : "b");
            x->match = m;
            for (int k = 0; k < 2; k++) {
                const cJSON *v = cJSON_GetArrayItem(pair, k);
                char ip[PATH_MAX_LEN];
                index_path(ip, sizeof ip, pp, k);
                int *dst = k ? &x->b : &x->a;
                if (m == MATCH_DATACENTERS) rc = find_name(c, ip, v, t->datacenters, t->n_datacenters, "datacenter", dst);
                else if (m == MATCH_NODES) rc = find_name(c, ip, v, t->nodes, t->n_nodes, "node", dst);
                else if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
                         v->valuedouble >= t->world)
                    rc = fail(c, ip, "expected a rank of the topology (0..%d)", t->world - 1);
                else
                    *dst = (int)v->valuedouble;
                if (rc != SF_OK) return rc;
            }
        }
        if (matches != 1)
            return fail(c, p, "an override names exactly one pair: \"datacenters\", \"nodes\" or \"ranks\"");
        if ((rc = read_link_fields(c, o, p, &x->level)) != SF_OK) return rc;
        t->n_overrides++;
    }
    return SF_OK;
}

sf_link_scope sf_link_scope_of(const sf_topology *t, int a, int b)
{
    if (!t || a < 0 || b < 0 || a >= t->world || b >= t->world) return SF_LINK_ACROSS_DATACENTERS;
    if (a == b) return SF_LINK_SAME_RANK;
    if (t->ranks[a].node == t->ranks[b].node) return SF_LINK_SAME_NODE;
    if (t->ranks[a].datacenter == t->ranks[b].datacenter) return SF_LINK_SAME_DATACENTER;
    return SF_LINK_ACROSS_DATACENTERS;
}

const char *sf_link_scope_name(sf_link_scope scope)
{
    switch (scope) {
    case SF_LINK_SAME_RANK: return "same_rank";
    case SF_LINK_SAME_NODE: return "same_node";
    case SF_LINK_SAME_DATACENTER: return "same_datacenter";
    default: return "across_datacenters";
    }
}

static int pair_is(int x, int y, int a, int b) { return (x == a && y == b) || (x == b && y == a); }

int sf_topology_link_options(const sf_topology *t, int a, int b, sf_topology_link *out)
{
    if (!t || !out) return sf_error(SF_E_INVAL, "sf_topology_link_options: NULL argument");
    if (a < 0 || b < 0 || a >= t->world || b >= t->world)
        return sf_error(SF_E_INVAL, "link %d-%d: ranks are 0..%d", a, b, t->world - 1);
    sf_topology_link_defaults(out);
    link_apply(out, &t->link_default);
    sf_link_scope scope = sf_link_scope_of(t, a, b);
    if (scope != SF_LINK_SAME_RANK) link_apply(out, &t->link_class[scope]);
    const sf_topology_rank *ra = &t->ranks[a], *rb = &t->ranks[b];
    for (int i = 0; i < t->n_overrides; i++) {
        const link_override *o = &t->overrides[i];
        int hit = o->match == MATCH_DATACENTERS ? pair_is(ra->datacenter, rb->datacenter, o->a, o->b)
                  : o->match == MATCH_NODES     ? pair_is(ra->node, rb->node, o->a, o->b)
                                                : pair_is(a, b, o->a, o->b);
        if (hit) link_apply(out, &o->level);
    }
    return SF_OK;
}

/* ---- the pipeline ----------------------------------------------------------------------------- */

/* The ranks of list (a non-empty JSON list of distinct ranks of the topology, at path.field)
 * appended to text as prefix and the ranks separated by commas. */
static int append_ranks(const ctx *c, const cJSON *list, const char *path, const char *field, const char *prefix,
                        char *text, size_t cap, size_t *len)
{
    char rp[PATH_MAX_LEN];
    field_path(rp, sizeof rp, path, field);
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) return fail(c, rp, "expected a non-empty list of ranks");
    int k = 0;
    for (const cJSON *r = list->child; r; r = r->next, k++) {
        char ip[PATH_MAX_LEN];
        index_path(ip, sizeof ip, rp, k);
        if (!cJSON_IsNumber(r) || r->valuedouble != floor(r->valuedouble) || r->valuedouble < 0 ||
            r->valuedouble >= c->t->world)
            return fail(c, ip, "expected a rank of the topology (0..%d)", c->t->world - 1);
        for (const cJSON *q = list->child; q != r; q = q->next)
            if (q->valuedouble == r->valuedouble) return fail(c, ip, "rank %d is listed twice", (int)r->valuedouble);
        *len += (size_t)snprintf(text + *len, cap - *len, "%s%d", k ? "," : prefix, (int)r->valuedouble);
    }
    return SF_OK;
}

/* A stage's text must not hold an unquoted '!': one stage per entry. */
static int has_bang(const char *s)
{
    char quote = 0;
    for (; *s; s++) {
        if (quote) {
            if (*s == quote) quote = 0;
        } else if (*s == '\'' || *s == '"') {
            quote = *s;
        } else if (*s == '!') {
            return 1;
        }
    }
    return 0;
}

static int read_pipeline(const ctx *c, const cJSON *v)
{
    sf_topology *t = c->t;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return fail(c, "$.pipeline", "expected a non-empty pipeline");
        t->pipeline = keep_str(t, v->valuestring);
        return t->pipeline ? SF_OK : sf_error(SF_E_NOMEM, "out of memory");
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return fail(c, "$.pipeline", "expected the pipeline text or a non-empty list of stages");
    size_t cap = 1;
    for (const cJSON *e = v->child; e; e = e->next) {
        const cJSON *s = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "stage") : e;
        cap += (cJSON_IsString(s) ? strlen(s->valuestring) : 0) + 3;
        if (cJSON_IsObject(e))
            cap += 12 * (size_t)(2 + cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(e, "ranks")) +
                                 cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(e, "head_ranks")));
    }
    char *text = malloc(cap);
    if (!text) return sf_error(SF_E_NOMEM, "out of memory");
    size_t len = 0;
    int i = 0, rc = SF_OK;
    static const char *const stage_fields[] = {"stage", "ranks", "head_ranks", NULL};
    for (const cJSON *e = v->child; e && rc == SF_OK; e = e->next, i++) {
        char p[PATH_MAX_LEN];
        index_path(p, sizeof p, "$.pipeline", i);
        const char *stage = NULL;
        const cJSON *ranks = NULL, *heads = NULL;
        if (cJSON_IsString(e)) {
            stage = e->valuestring;
        } else if (cJSON_IsObject(e)) {
            if ((rc = check_fields(c, e, p, stage_fields)) != SF_OK || (rc = get_string(c, e, p, "stage", 1, &stage)) != SF_OK)
                break;
            ranks = cJSON_GetObjectItemCaseSensitive(e, "ranks");
            heads = cJSON_GetObjectItemCaseSensitive(e, "head_ranks");
        } else {
            rc = fail(c, p, "expected a stage's text or {\"stage\": ..., \"ranks\": [...]}");
            break;
        }
        if (!stage[0] || has_bang(stage)) {
            rc = fail(c, p, "expected one stage's text (no '!': one stage per entry)");
            break;
        }
        len += (size_t)snprintf(text + len, cap - len, "%s%s", i ? " ! " : "", stage);
        /* head ranks (a block's heads over processes) are an option, so they come before the placement */
        if (heads) rc = append_ranks(c, heads, p, "head_ranks", " head_ranks=", text, cap, &len);
        if (ranks && rc == SF_OK) rc = append_ranks(c, ranks, p, "ranks", " @", text, cap, &len);
    }
    if (rc == SF_OK && !(t->pipeline = keep(t, text, len))) rc = sf_error(SF_E_NOMEM, "out of memory");
    free(text);
    return rc;
}

/* ---- datacenters, nodes, ranks ---------------------------------------------------------------- */

/* "cpu", "cuda", or either with ":N" (a GPU; a CPU rank of head-parallel blocks) */
static int device_ok(const char *d)
{
    if (strcmp(d, "cpu") == 0 || strcmp(d, "cuda") == 0) return 1;
    const size_t at = strncmp(d, "cuda:", 5) == 0 ? 5 : strncmp(d, "cpu:", 4) == 0 ? 4 : 0;
    if (!at || !d[at] || strlen(d + at) > 4) return 0;
    for (const char *s = d + at; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static int read_rank(const ctx *c, const cJSON *r, const char *path, int dc, int node, const char *node_host,
                     const char **claimed_at)
{
    sf_topology *t = c->t;
    static const char *const fields[] = {"id", "endpoint", "bind", "public_key", "devices", "host", "chunk", NULL};
    int rc = check_fields(c, r, path, fields);
    if (rc != SF_OK) return rc;
    long id = -1;
    int present;
    char p[PATH_MAX_LEN];
    if ((rc = get_int(c, r, path, "id", 0, SF_TOPOLOGY_MAX_RANKS - 1, &present, &id)) != SF_OK) return rc;
    if (!present) return fail(c, field_path(p, sizeof p, path, "id"), "required");
    if (id >= t->world)
        return fail(c, field_path(p, sizeof p, path, "id"), "rank %ld, but the file lists %d ranks: ids are 0..%d", id,
                    t->world, t->world - 1);
    if (claimed_at[id]) {
        return sf_error(SF_E_PARSE, "%s: rank %ld is claimed twice: %s.id and %s.id", c->name, id, claimed_at[id], path);
    }
    if (!(claimed_at[id] = keep_str(t, path))) return sf_error(SF_E_NOMEM, "out of memory");
    sf_topology_rank *rk = &t->ranks[id];
    rk->id = (int)id;
    rk->datacenter = dc;
    rk->node = node;
    rk->datacenter_name = t->datacenters[dc];
    rk->node_name = t->nodes[node];
    const char *s;
    if ((rc = get_endpoint(c, r, path, "endpoint", &s)) != SF_OK) return rc;
    if (!(rk->endpoint = keep_str(t, s))) return sf_error(SF_E_NOMEM, "out of memory");
    /* behind NAT, a proxy or a container's port mapping the address a rank binds differs from
     * the one its peers reach it at */
    if ((rc = get_endpoint_opt(c, r, path, "bind", 0, &s)) != SF_OK) return rc;
    if (!(rk->bind = keep_str(t, s ? s : rk->endpoint))) return sf_error(SF_E_NOMEM, "out of memory");
    /* sequence parallelism: this rank's segments a round (a faster machine takes more) */
    long chunk = 0;
    if ((rc = get_int(c, r, path, "chunk", 1, 1 << 20, &present, &chunk)) != SF_OK) return rc;
    rk->chunk = present ? (int)chunk : 0;
    if ((rc = get_string(c, r, path, "host", 0, &s)) != SF_OK) return rc;
    if (!(rk->host = keep_str(t, s ? s : node_host))) return sf_error(SF_E_NOMEM, "out of memory");
    if ((rc = get_string(c, r, path, "public_key", 0, &s)) != SF_OK) return rc;
    field_path(p, sizeof p, path, "public_key");
    if (s && sf_z85_key_check(s, p) != SF_OK) return sf_error(SF_E_PARSE, "%s: %s", c->name, sf_last_error());
    if (!s && t->security == SF_SECURITY_CURVE)
        return fail(c, p, "required with \"security\": \"curve\" (make a key pair with `seqflow keygen`)");
    if (s && t->security == SF_SECURITY_CURVE && !(rk->public_key = keep_str(t, s)))
        return sf_error(SF_E_NOMEM, "out of memory");
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(r, "devices");
    field_path(p, sizeof p, path, "devices");
    if (devs && (!cJSON_IsArray(devs) || cJSON_GetArraySize(devs) == 0 || cJSON_GetArraySize(devs) > 64))
        return fail(c, p, "expected a list of 1 to 64 devices, e.g. [\"cpu\"] or [\"cuda:0\", \"cuda:1\"]");
    int n = devs ? cJSON_GetArraySize(devs) : 1;
    char **list = keep_zeroed(t, (size_t)n * sizeof(char *));
    if (!list) return sf_error(SF_E_NOMEM, "out of memory");
    if (!devs) {
        if (!(list[0] = keep_str(t, "cpu"))) return sf_error(SF_E_NOMEM, "out of memory");
    }
    int k = 0;
    for (const cJSON *d = devs ? devs->child : NULL; d; d = d->next, k++) {
        char dp[PATH_MAX_LEN];
        index_path(dp, sizeof dp, p, k);
        if (!cJSON_IsString(d) || !device_ok(d->valuestring))
            return fail(c, dp, "expected \"cpu\", \"cpu:N\", \"cuda\" or \"cuda:N\"");
        for (int j = 0; j < k; j++)
            if (strcmp(list[j], d->valuestring) == 0) return fail(c, dp, "device \"%s\" is listed twice", list[j]);
        if (!(list[k] = keep_str(t, d->valuestring))) return sf_error(SF_E_NOMEM, "out of memory");
    }
    rk->devices = (const char *const *)list;
    rk->n_devices = n;
    return SF_OK;
}

/* Names must be unique among their kind: a link override names them. */
static int unique_name(const ctx *c, char **names, int n, const char *path, const char *what, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return fail(c, path, "a second %s named \"%s\"", what, name);
    return SF_OK;
}

static int read_datacenters(const ctx *c, const cJSON *dcs)
{
    sf_topology *t = c->t;
    if (!cJSON_IsArray(dcs) || cJSON_GetArraySize(dcs) == 0)
        return fail(c, "$.datacenters", "expected a non-empty list of datacenters");
    /* count everything first: ranks are numbered against the total */
    int n_dc = 0, n_nodes = 0, world = 0, d = 0;
    for (const cJSON *dc = dcs->child; dc; dc = dc->next, d++) {
        char p[PATH_MAX_LEN], np[PATH_MAX_LEN];
        index_path(p, sizeof p, "$.datacenters", d);
        static const char *const dc_fields[] = {"name", "nodes", NULL};
        int rc = check_fields(c, dc, p, dc_fields);
        if (rc != SF_OK) return rc;
        const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(dc, "nodes");
        field_path(np, sizeof np, p, "nodes");
        if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) == 0) return fail(c, np, "expected a non-empty list of nodes");
        n_dc++;
        int k = 0;
        for (const cJSON *node = nodes->child; node; node = node->next, k++) {
            char kp[PATH_MAX_LEN], rp[PATH_MAX_LEN];
            index_path(kp, sizeof kp, np, k);
            static const char *const node_fields[] = {"name", "host", "ranks", NULL};
            if ((rc = check_fields(c, node, kp, node_fields)) != SF_OK) return rc;
            const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(node, "ranks");
            field_path(rp, sizeof rp, kp, "ranks");
            if (!cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) == 0) return fail(c, rp, "expected a non-empty list of ranks");
            n_nodes++;
            world += cJSON_GetArraySize(ranks);
            if (world > SF_TOPOLOGY_MAX_RANKS) return fail(c, rp, "more than %d ranks in the file", SF_TOPOLOGY_MAX_RANKS);
        }
    }
    t->world = world;
    t->ranks = calloc((size_t)world, sizeof *t->ranks);
    t->datacenters = calloc((size_t)n_dc, sizeof *t->datacenters);
    t->nodes = calloc((size_t)n_nodes, sizeof *t->nodes);
    const char **claimed_at = calloc((size_t)world, sizeof *claimed_at);
    if (!t->ranks || !t->datacenters || !t->nodes || !claimed_at) {
        free(claimed_at);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    int rc = SF_OK;
    d = 0;
    for (const cJSON *dc = dcs->child; dc && rc == SF_OK; dc = dc->next, d++) {
        char p[PATH_MAX_LEN], np[PATH_MAX_LEN];
        index_path(p, sizeof p, "$.datacenters", d);
        const char *name;
        if ((rc = get_string(c, dc, p, "name", 1, &name)) != SF_OK) break;
        char fp[PATH_MAX_LEN];
        if ((rc = unique_name(c, t->datacenters, t->n_datacenters, field_path(fp, sizeof fp, p, "name"), "datacenter", name)) != SF_OK)
            break;
        if (!(t->datacenters[t->n_datacenters++] = keep_str(t, name))) {
            rc = sf_error(SF_E_NOMEM, "out of memory");
            break;
        }
        field_path(np, sizeof np, p, "nodes");
        int k = 0;
        for (const cJSON *node = cJSON_GetObjectItemCaseSensitive(dc, "nodes")->child; node && rc == SF_OK;
             node = node->next, k++) {
            char kp[PATH_MAX_LEN], rp[PATH_MAX_LEN];
            index_path(kp, sizeof kp, np, k);
            const char *node_name, *host;
            if ((rc = get_string(c, node, kp, "name", 1, &node_name)) != SF_OK ||
                (rc = get_string(c, node, kp, "host", 0, &host)) != SF_OK ||
                (rc = unique_name(c, t->nodes, t->n_nodes, field_path(fp, sizeof fp, kp, "name"), "node", node_name)) != SF_OK)
                break;
            if (!(t->nodes[t->n_nodes++] = keep_str(t, node_name))) {
                rc = sf_error(SF_E_NOMEM, "out of memory");
                break;
            }
            field_path(rp, sizeof rp, kp, "ranks");
            int j = 0;
            for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(node, "ranks")->child; r && rc == SF_OK; r = r->next, j++) {
                char jp[PATH_MAX_LEN];
                rc = read_rank(c, r, index_path(jp, sizeof jp, rp, j), t->n_datacenters - 1, t->n_nodes - 1,
                               host ? host : node_name, claimed_at);
            }
        }
    }
    /* ids are checked below world as they are read and claimed once each: all are present */
    for (int i = 0; i < world && rc == SF_OK; i++)
        for (int j = i + 1; j < world && rc == SF_OK; j++)
            if (strcmp(t->ranks[i].endpoint, t->ranks[j].endpoint) == 0)
                rc = sf_error(SF_E_PARSE, "%s: %s.endpoint: \"%s\" is also rank %d's (%s.endpoint)", c->name, claimed_at[j],
                              t->ranks[j].endpoint, i, claimed_at[i]);
    free(claimed_at);
    return rc;
}

/* ---- the file --------------------------------------------------------------------------------- */

static int read_root(const ctx *c, const cJSON *root)
{
    sf_topology *t = c->t;
    static const char *const fields[] = {"version", "security", "rendezvous", "rendezvous_timeout_ms", "heartbeat_ms",
                                         "timeout_ms", "connect_timeout_ms", "linger_ms", "pipeline", "datacenters",
                                         "links", NULL};
    int rc = check_fields(c, root, "$", fields);
    if (rc != SF_OK) return rc;
    long version = 0;
    int present;
    if ((rc = get_int(c, root, "$", "version", 0, 1000000, &present, &version)) != SF_OK) return rc;
    if (!present) return fail(c, "$.version", "required (%d)", SF_TOPOLOGY_VERSION);
    if (version != SF_TOPOLOGY_VERSION)
        return fail(c, "$.version", "this seqflow reads topology version %d, not %ld", SF_TOPOLOGY_VERSION, version);
    const char *s;
    if ((rc = get_string(c, root, "$", "security", 0, &s)) != SF_OK) return rc;
    if (s && strcmp(s, "curve") != 0 && strcmp(s, "plaintext") != 0)
        return fail(c, "$.security", "expected \"curve\" or \"plaintext\" (got \"%s\")", s);
    t->security = s && strcmp(s, "plaintext") == 0 ? SF_SECURITY_PLAINTEXT : SF_SECURITY_CURVE;
    if ((rc = get_endpoint(c, root, "$", "rendezvous", &s)) != SF_OK) return rc;
    if (!(t->rendezvous = keep_str(t, s))) return sf_error(SF_E_NOMEM, "out of memory");
    if ((rc = get_ms(c, root, "heartbeat_ms", &t->heartbeat_ms)) != SF_OK ||
        (rc = get_ms(c, root, "timeout_ms", &t->timeout_ms)) != SF_OK ||
        (rc = get_ms(c, root, "connect_timeout_ms", &t->connect_timeout_ms)) != SF_OK ||
        (rc = get_ms(c, root, "rendezvous_timeout_ms", &t->rendezvous_timeout_ms)) != SF_OK)
        return rc;
    long linger = t->linger_ms;
    if ((rc = get_int(c, root, "$", "linger_ms", 0, 86400000L, NULL, &linger)) != SF_OK) return rc;
    t->linger_ms = (int)linger;
    if (t->timeout_ms <= t->heartbeat_ms)
        return fail(c, "$.timeout_ms", "%d ms must be longer than heartbeat_ms (%d ms): a peer would be declared dead between two heartbeats",
                    t->timeout_ms, t->heartbeat_ms);
    const cJSON *dcs = cJSON_GetObjectItemCaseSensitive(root, "datacenters");
    if (!dcs) return fail(c, "$.datacenters", "required");
    if ((rc = read_datacenters(c, dcs)) != SF_OK) return rc;
    for (int i = 0; i < t->world; i++)
        if (strcmp(t->ranks[i].endpoint, t->rendezvous) == 0)
            return fail(c, "$.rendezvous", "\"%s\" is also rank %d's endpoint: the rendezvous needs an endpoint of its own",
                        t->rendezvous, i);
    const cJSON *pipeline = cJSON_GetObjectItemCaseSensitive(root, "pipeline");
    if (pipeline && (rc = read_pipeline(c, pipeline)) != SF_OK) return rc;
    const cJSON *links = cJSON_GetObjectItemCaseSensitive(root, "links");
    if (links && (rc = read_links(c, links)) != SF_OK) return rc;
    return SF_OK;
}

int sf_topology_parse(const char *text, size_t len, const char *name, sf_topology **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_topology_parse: NULL argument");
    *out = NULL;
    if (!text) return sf_error(SF_E_INVAL, "sf_topology_parse: NULL text");
    ctx c = {.name = name ? name : "topology"};
    if (len > SF_TOPOLOGY_MAX_BYTES)
        return sf_error(SF_E_PARSE, "%s: %zu bytes; a topology holds at most %u", c.name, len, SF_TOPOLOGY_MAX_BYTES);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
    if (root) /* only blanks may follow the value */
        while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r' || !text[at])) at++;
    if (!root || at < len) {
        cJSON_Delete(root);
        int line = 1, col = 1;
        for (size_t i = 0; i < at && i < len; i++) text[i] == '\n' ? (line++, col = 1) : col++;
        return sf_error(SF_E_PARSE, "%s: line %d, column %d: %s", c.name, line, col,
                        root ? "text after the JSON value" : "not valid JSON");
    }
    sf_topology *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    t->heartbeat_ms = 500;
    t->timeout_ms = 3000;
    t->connect_timeout_ms = 10000;
    t->linger_ms = 1000;
    t->rendezvous_timeout_ms = 60000;
    c.t = t;
    int rc = read_root(&c, root);
    cJSON_Delete(root);
    if (rc != SF_OK) {
        sf_topology_free(t);
        return rc;
    }
    *out = t;
    return SF_OK;
}

int sf_topology_load(const char *path, sf_topology **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_topology_load: NULL argument");
    *out = NULL;
    if (!path) return sf_error(SF_E_INVAL, "sf_topology_load: NULL path");
    FILE *f = fopen(path, "rb");
    if (!f) return sf_error(SF_E_IO, "%s: %s", path, strerror(errno));
    char *text = malloc(SF_TOPOLOGY_MAX_BYTES + 1);
    if (!text) {
        fclose(f);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    size_t len = fread(text, 1, SF_TOPOLOGY_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    int rc;
    if (bad) rc = sf_error(SF_E_IO, "%s: read error", path);
    else if (len > SF_TOPOLOGY_MAX_BYTES) rc = sf_error(SF_E_PARSE, "%s: larger than %u bytes", path, SF_TOPOLOGY_MAX_BYTES);
    else rc = sf_topology_parse(text, len, path, out);
    free(text);
    return rc;
}

void sf_topology_free(sf_topology *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_pool; i++) free(t->pool[i]);
    free(t->pool);
    free(t->ranks);
    free(t->datacenters);
    free(t->nodes);
    free(t->overrides);
    free(t);
}

/* ---- accessors -------------------------------------------------------------------------------- */

int sf_topology_world(const sf_topology *t) { return t ? t->world : 0; }

const sf_topology_rank *sf_topology_rank_get(const sf_topology *t, int id)
{
    return t && id >= 0 && id < t->world ? &t->ranks[id] : NULL;
}

const sf_topology_rank *sf_topology_rank_by_endpoint(const sf_topology *t, const char *endpoint)
{
    for (int i = 0; t && endpoint && i < t->world; i++)
        if (strcmp(t->ranks[i].endpoint, endpoint) == 0) return &t->ranks[i];
    return NULL;
}

sf_topology_security sf_topology_get_security(const sf_topology *t) { return t ? t->security : SF_SECURITY_CURVE; }
int sf_topology_heartbeat_ms(const sf_topology *t) { return t ? t->heartbeat_ms : 500; }
int sf_topology_timeout_ms(const sf_topology *t) { return t ? t->timeout_ms : 3000; }
int sf_topology_connect_timeout_ms(const sf_topology *t) { return t ? t->connect_timeout_ms : 10000; }
int sf_topology_linger_ms(const sf_topology *t) { return t ? t->linger_ms : 1000; }
const char *sf_topology_rendezvous(const sf_topology *t) { return t ? t->rendezvous : NULL; }
int sf_topology_rendezvous_timeout_ms(const sf_topology *t) { return t ? t->rendezvous_timeout_ms : 60000; }
const char *sf_topology_pipeline(const sf_topology *t) { return t ? t->pipeline : NULL; }

int sf_topology_peers(const sf_topology *t, int self, const sf_topology_rank **out, int cap)
{
    if (!t || self < 0 || self >= t->world)
        return sf_error(SF_E_INVAL, "sf_topology_peers: rank %d is not in the topology", self);
    if (!out || cap < t->world - 1)
        return sf_error(SF_E_INVAL, "sf_topology_peers: room for %d peers needed", t->world - 1);
    int n = 0;
    for (int i = 0; i < t->world; i++)
        if (i != self) out[n++] = &t->ranks[i];
    return n;
}
