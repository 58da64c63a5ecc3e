/* seqflow serve's shared-memory regions (protocol version 4; pipeline/serve_region.c,
 * docs/SERVE.md "Rows through shared memory"):
 *  - MAP gives a fresh name of the asked size; the name is gone once the client ATTACHed;
 *  - the rows placed there (ROWS_AT) are exactly the rows of a client over the socket, for
 *    several streams at once, in order;
 *  - a client that RELEASEs nothing holds the server back for its own streams only: its region
 *    fills, its stream stops, another client's stream runs to its end; RELEASE lets it go on;
 *  - a client that MAPs and never ATTACHes gets ROWS over the socket;
 *  - rows of two sizes (a FLUSH's few, a segment's many, in a region of less than two
 *    segments) never leave the region without room once everything was released;
 *  - refusals (ERROR REGION): a second MAP, more than --shm-budget, a server without regions,
 *    ATTACH of another size, RELEASE beyond what was placed; MAP in version 3 is MALFORMED;
 *  - a client that goes away gives its region back (/metrics). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/process_stats.h"
#include "support/check.h"
#include "support/serve_harness.h"

#define DIM 256
#define SEG 256
#define ROWS_BYTES ((uint64_t)DIM * SEG * 4) /* one segment's float32 rows */

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The next message on d (waiting up to ms): its type, a, b, and its payload's text in text. */
static int next_reply(void *d, long ms, sf_serve_msg *m, char *text, size_t text_size)
{
    static uint8_t buf[SF_SERVE_HEADER_SIZE + SF_SERVE_MAX_TEXT + 64];
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) return 0;
    const long len = sf_serve_recv(d, buf, sizeof buf, 0);
    if (len < 0 || sf_serve_decode(buf, (size_t)len < sizeof buf ? (size_t)len : sizeof buf, 0, m) != SF_OK) return 0;
    if (text) snprintf(text, text_size, "%.*s", (int)m->payload_len, m->payload ? (const char *)m->payload : "");
    return 1;
}

/* Sends type (a, b) and expects ERROR code back; returns its text. */
static const char *expect_error(void *d, sf_serve_type type, uint64_t a, int version, sf_serve_error code,
                                const char *what)
{
    uint8_t h[SF_SERVE_HEADER_SIZE];
    sf_serve_header_version(h, version, type, 0, a, 0);
    zmq_send(d, h, sizeof h, 0);
    sf_serve_msg m = {0};
    static char text[SF_SERVE_MAX_TEXT + 1];
    text[0] = '\0';
    CHECKF(next_reply(d, 5000, &m, text, sizeof text) && m.type == SF_SERVE_ERROR && m.a == (uint64_t)code,
           "%s: ERROR %d expected (got type %d, code %llu: %s)", what, code, m.type, (unsigned long long)m.a, text);
    return text;
}

/* A PING answered: the server took every message before it. */
static void round_trip(void *d)
{
    client_send(d, SF_SERVE_PING, 0, 7, 0, NULL, 0);
    sf_serve_msg m;
    CHECK(next_reply(d, 5000, &m, NULL, 0) && m.type == SF_SERVE_PONG && m.a == 7);
}

/* Takes d's messages until every stream closed (or 10 s passed). */
static void take_all(void *d, client_region *r, tstream *ts, int n, const server *v)
{
    for (double t0 = sf_monotonic_seconds(); sf_monotonic_seconds() - t0 < 10;) {
        int open = 0;
        for (int i = 0; i < n; i++) open += !ts[i].closed;
        if (!open) return;
        clients_wait(&d, 1, 100);
        client_take_region(d, r, ts, n, v);
    }
}

static void rows_through_region(void)
{
    server v;
    if (!server_start(&v, DIM, SEG, 1 << 20, 30.0, "shm-rows.sock", NULL)) return;
    check_rng rng = {11};
    void *d = client_dealer(v.endpoint, 0);
    client_region r;
    char error[SF_SERVE_MAX_TEXT + 1] = "";
    CHECKF(client_map(d, 3 * ROWS_BYTES, &r, error, sizeof error), "MAP: %s", error);
    CHECK(strncmp(r.name, "/seqflow-", 9) == 0);
    CHECK(r.size >= 3 * ROWS_BYTES && r.size < 3 * ROWS_BYTES + 65536);
    CHECK(server_metric(&v, "seqflow_serve_shm_regions") == 1);
    client_send(d, SF_SERVE_ATTACH, 0, r.size, 0, NULL, 0);
    round_trip(d);
    const int fd = shm_open(r.name, O_RDONLY, 0);
    CHECKF(fd < 0 && errno == ENOENT, "the region's name is gone once attached");
    if (fd >= 0) close(fd);

    /* three streams of this client, and one over the socket of another: the same rows */
    enum { N = 3, SEGS = 12 };
    tstream ts[N], other;
    for (int i = 0; i < N; i++) tstream_make(&v, &ts[i], 100 + (uint64_t)i, SEGS, &rng);
    tstream_make(&v, &other, 200, SEGS, &rng);
    for (int i = 0; i < N; i++) tstream_push(d, &v, &ts[i], 4, 0);
    void *plain = client_dealer(v.endpoint, 0);
    tstream_push(plain, &v, &other, 4, 0);
    take_all(d, &r, ts, N, &v);
    for (double t0 = sf_monotonic_seconds(); !other.closed && sf_monotonic_seconds() - t0 < 10;) {
        clients_wait(&plain, 1, 100);
        client_take(plain, &other, 1, &v);
    }
    int region_rows = 0;
    for (int i = 0; i < N; i++) {
        CHECKF(ts[i].closed && ts[i].got == SEGS && !ts[i].bad, "stream %d: %d of %d segments, %d bad", i, ts[i].got,
               SEGS, ts[i].bad);
        region_rows += ts[i].region_rows;
    }
    CHECKF(other.closed && other.got == SEGS && !other.bad && other.region_rows == 0, "the socket client's rows");
    /* each stream's last ROWS_AT may be its empty FINAL packet: at least every segment's */
    CHECKF(region_rows >= N * SEGS, "%d ROWS_AT for %d segments", region_rows, N * SEGS);
    CHECK(server_metric(&v, "seqflow_serve_shm_rows_total") >= N * SEGS);
    CHECK(server_metric(&v, "seqflow_serve_shm_bytes{kind=\"in_use\"}") == 0);

    /* a release beyond what was placed; a second MAP; ATTACH of another size */
    expect_error(d, SF_SERVE_RELEASE, r.seen + 2 * r.size, 4, SF_SERVE_E_REGION, "RELEASE beyond the rows");
    expect_error(d, SF_SERVE_MAP, 0, 4, SF_SERVE_E_REGION, "a second MAP");
    expect_error(d, SF_SERVE_ATTACH, r.size + 4096, 4, SF_SERVE_E_REGION, "ATTACH of another size");
    /* a region asked for in version 3, and more than the budget */
    void *e = client_dealer(v.endpoint, 0);
    expect_error(e, SF_SERVE_MAP, 0, 3, SF_SERVE_E_MALFORMED, "MAP in version 3");
    expect_error(e, SF_SERVE_MAP, 1ull << 50, 4, SF_SERVE_E_REGION, "MAP beyond --shm-budget");
    /* refused for the budget, not wrapped round to a region of 0 bytes */
    const char *text = expect_error(e, SF_SERVE_MAP, UINT64_MAX, 4, SF_SERVE_E_REGION, "MAP of 2^64 - 1 bytes");
    CHECKF(strstr(text, "--shm-budget") != NULL, "MAP of 2^64 - 1 bytes: %s", text);
    zmq_close(e);
    zmq_close(plain);
    zmq_close(d);
    client_unmap(&r);
    for (int i = 0; i < N; i++) free(ts[i].tokens);
    free(other.tokens);
    server_stop(&v);
}

static void region_holds_back(void)
{
    server v;
    sf_serve_options so = {.idle_timeout = 1.0, .send_budget = 1 << 20};
    if (!server_start_with(&v, DIM, SEG, so, "shm-hold.sock")) return;
    check_rng rng = {12};
    void *d = client_dealer(v.endpoint, 0);
    client_region r;
    char error[SF_SERVE_MAX_TEXT + 1] = "";
    /* room for two ROWS: the third waits for a RELEASE */
    CHECKF(client_map(d, 2 * ROWS_BYTES + 8192, &r, error, sizeof error), "MAP: %s", error);
    client_send(d, SF_SERVE_ATTACH, 0, r.size, 0, NULL, 0);
    r.hold = 1;
    enum { SEGS = 8 };
    tstream held, other;
    tstream_make(&v, &held, 1, SEGS, &rng);
    tstream_make(&v, &other, 2, SEGS, &rng);
    tstream_push(d, &v, &held, 8, 0);
    void *plain = client_dealer(v.endpoint, 0);
    tstream_push(plain, &v, &other, 8, 0);
    /* the other client's stream runs to its end meanwhile */
    for (double t0 = sf_monotonic_seconds(); !other.closed && sf_monotonic_seconds() - t0 < 10;) {
        clients_wait(&plain, 1, 100);
        client_take(plain, &other, 1, &v);
        client_send(d, SF_SERVE_PING, held.id, 1, 0, NULL, 0); /* the held client stays alive */
        client_take_region(d, &r, &held, 1, &v);
    }
    CHECKF(other.closed && other.got == SEGS && !other.bad, "the other client's stream ended: %d of %d", other.got,
           SEGS);
    usleep(300 * 1000);
    client_take_region(d, &r, &held, 1, &v);
    CHECKF(held.got == 2 && held.region_rows == 2 && !held.bad, "a full region stops its stream: %d ROWS_AT",
           held.region_rows);
    CHECK(server_metric(&v, "seqflow_serve_shm_bytes{kind=\"in_use\"}") > 2.0 * ROWS_BYTES);
    /* released: the rest comes, in order */
    r.hold = 0;
    client_send(d, SF_SERVE_RELEASE, 0, r.seen, 0, NULL, 0);
    take_all(d, &r, &held, 1, &v);
    CHECKF(held.closed && held.got == SEGS && !held.bad, "after RELEASE: %d of %d segments", held.got, SEGS);

    /* a client that never ATTACHes gets its ROWS over the socket */
    void *a = client_dealer(v.endpoint, 0);
    client_region ra;
    CHECK(client_map(a, 0, &ra, error, sizeof error));
    tstream unattached;
    tstream_make(&v, &unattached, 3, 4, &rng);
    tstream_push(a, &v, &unattached, 8, 0);
    take_all(a, &ra, &unattached, 1, &v);
    CHECK(unattached.closed && unattached.got == 4 && !unattached.bad && unattached.region_rows == 0);
    CHECK(server_metric(&v, "seqflow_serve_shm_regions") == 2);
    /* gone (closed sockets, idle for 1 s): their regions and names go with them */
    zmq_close(a);
    zmq_close(d);
    usleep(1800 * 1000);
    CHECK(server_metric(&v, "seqflow_serve_shm_regions") == 0);
    CHECK(server_metric(&v, "seqflow_serve_shm_bytes{kind=\"made\"}") == 0);
    const int fd = shm_open(ra.name, O_RDONLY, 0);
    CHECKF(fd < 0, "the unattached region's name is gone with its client");
    if (fd >= 0) close(fd);
    client_unmap(&r);
    client_unmap(&ra);
    zmq_close(plain);
    free(held.tokens), free(other.tokens), free(unattached.tokens);
    server_stop(&v);
}

/* The next ROWS or ROWS_AT on d within ms (a ROWS_AT RELEASEd at once): its type and rows, 0
 * when none came. */
static int next_rows(void *d, long ms, uint64_t *rows)
{
    for (double t0 = sf_monotonic_seconds(); sf_monotonic_seconds() - t0 < ms / 1e3;) {
        sf_serve_msg m;
        if (!next_reply(d, 100, &m, NULL, 0)) continue;
        if (m.type == SF_SERVE_ROWS_AT)
            client_send(d, SF_SERVE_RELEASE, 0, le64(m.payload) + le64(m.payload + 8), 0, NULL, 0);
        if (m.type == SF_SERVE_ROWS || m.type == SF_SERVE_ROWS_AT) {
            *rows = m.b;
            return m.type;
        }
    }
    return 0;
}

static void two_sizes(void)
{
    server v;
    if (!server_start(&v, DIM, SEG, 1 << 20, 30.0, "shm-sizes.sock", NULL)) return;
    void *d = client_dealer(v.endpoint, 0);
    client_region r;
    char error[SF_SERVE_MAX_TEXT + 1] = "";
    CHECK(client_map(d, ROWS_BYTES * 14 / 10, &r, error, sizeof error));
    client_send(d, SF_SERVE_ATTACH, 0, r.size, 0, NULL, 0);
    uint32_t tok[SEG];
    uint8_t payload[4 * SEG];
    for (int i = 0; i < SEG; i++) tok[i] = (uint32_t)(i * 7 % 256);
    for (int i = 0; i < SEG; i++)
        payload[4 * i] = (uint8_t)tok[i], payload[4 * i + 1] = payload[4 * i + 2] = payload[4 * i + 3] = 0;
    client_send(d, SF_SERVE_OPEN, 5, 8, 0, NULL, 0);
    uint64_t rows = 0;
    /* a segment (most of the region), a FLUSH's half segment (the head past the middle), then
     * the next segment: it fits once the region starts over at its beginning */
    client_send(d, SF_SERVE_PUSH, 5, 0, SEG, payload, sizeof payload);
    CHECKF(next_rows(d, 5000, &rows) == SF_SERVE_ROWS_AT && rows == SEG, "the first segment in the region");
    client_send(d, SF_SERVE_PUSH, 5, SEG, SEG / 2, payload, sizeof payload / 2);
    client_send(d, SF_SERVE_FLUSH, 5, 0, 0, NULL, 0);
    CHECKF(next_rows(d, 5000, &rows) == SF_SERVE_ROWS_AT && rows == SEG / 2, "the FLUSH's rows in the region");
    client_send(d, SF_SERVE_PUSH, 5, SEG + SEG / 2, SEG / 2, payload, sizeof payload / 2);
    const int type = next_rows(d, 5000, &rows);
    CHECKF(type == SF_SERVE_ROWS_AT && rows == SEG, "the second segment: type %d, %llu rows", type,
           (unsigned long long)rows);
    zmq_close(d);
    client_unmap(&r);
    server_stop(&v);
}

static void no_regions(void)
{
    server v;
    sf_serve_options so = {.no_shm = 1};
    if (!server_start_with(&v, DIM, SEG, so, "shm-none.sock")) return;
    void *d = client_dealer(v.endpoint, 0);
    expect_error(d, SF_SERVE_MAP, 0, 4, SF_SERVE_E_REGION, "MAP on a server without regions");
    expect_error(d, SF_SERVE_RELEASE, 0, 4, SF_SERVE_E_REGION, "RELEASE without a region");
    CHECK(server_metric(&v, "seqflow_serve_shm_bytes{kind=\"budget\"}") == 0);
    zmq_close(d);
    server_stop(&v);
}

int main(void)
{
    serve_test_ctx = zmq_ctx_new();
    rows_through_region();
    region_holds_back();
    two_sizes();
    no_regions();
    zmq_ctx_term(serve_test_ctx);
    return check_finish("test_serve_shm");
}
