/* The rendezvous (pipeline/rendezvous.h): ranks as threads of this process over TCP loopback,
 * CURVE on. A job that agrees gets every rank's endpoint, host, blob and its own payload
 * (one large enough to travel in several chunks); a job that disagrees is refused naming the
 * ranks and what differs; a missing server or a key not in the topology fails with the
 * endpoint named; a rank without the topology asks the server for it, over its own key only. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pipeline/rendezvous.h"
#include "pipeline/topology.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

#define MAX_WORLD 6
#define BIG_RANK 2
#define BIG_PAYLOAD ((size_t)SF_RENDEZVOUS_CHUNK + SF_RENDEZVOUS_CHUNK / 2 + 3)

/* A TCP port free right now on 127.0.0.1 (the kernel's choice for port 0). */
typedef struct job job;
typedef struct member {
    job *j;
    int index;           /* thread index; rank 0 serves */
    sf_hello hello;
    char endpoint[64], host[32];
    uint8_t blob[8];
    int key;             /* which key pair it uses (-1: a stranger's) */
    int fetch;           /* asks for the topology first (sf_rendezvous_fetch_topology) */
    char *fetched;       /* what it got */
    int rc;
    char message[512];
    sf_rendezvous_result *result;
} member;

struct job {
    int world, members, plaintext, timeout_ms, no_server;
    const char *topology;  /* the server's text for ranks that ask, NULL: none */
    char endpoint[64];
    char pub[MAX_WORLD][41], sec[MAX_WORLD][41], stranger_pub[41], stranger_sec[41];
    const char *rank_keys[MAX_WORLD];
    const char *rank_endpoints[MAX_WORLD];
    member m[MAX_WORLD + 1];
};

static uint8_t payload_byte(int rank, size_t i) { return (uint8_t)(rank * 31 + i * 7 + (i >> 12)); }

/* Rank r's payload: 100 + r bytes, and BIG_PAYLOAD for BIG_RANK (several chunks). */
static int make_payload(void *user, int rank, sf_buffer *out)
{
    (void)user;
    size_t n = rank == BIG_RANK ? BIG_PAYLOAD : 100 + (size_t)rank;
    uint8_t *p = malloc(n);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) p[i] = payload_byte(rank, i);
    int rc = sf_buffer_append(out, p, n);
    free(p);
    return rc;
}

static void *member_thread(void *arg)
{
    member *m = arg;
    job *j = m->j;
    sf_rendezvous_config c = {.endpoint = j->endpoint, .plaintext = j->plaintext, .server_public_key = j->pub[0],
                              .timeout_ms = j->timeout_ms, .rank_keys = j->rank_keys, .rank_endpoints = j->rank_endpoints};
    c.public_key = m->key >= 0 ? j->pub[m->key] : j->stranger_pub;
    c.secret_key = m->key >= 0 ? j->sec[m->key] : j->stranger_sec;
    c.topology_text = j->topology;
    c.topology_len = j->topology ? strlen(j->topology) : 0;
    size_t len = 0;
    if (m->index == 0 && !j->no_server) m->rc = sf_rendezvous_serve(&c, &m->hello, make_payload, NULL, &m->result);
    else if (m->fetch && (m->rc = sf_rendezvous_fetch_topology(&c, m->hello.rank, &m->fetched, &len)) != SF_OK) {}
    else if (m->fetch && len != strlen(m->fetched)) m->rc = sf_error(SF_E_INVAL, "fetched %zu bytes, %zu of text", len, strlen(m->fetched));
    else m->rc = sf_rendezvous_join(&c, &m->hello, &m->result);
    snprintf(m->message, sizeof m->message, "%s", m->rc ? sf_last_error() : "");
    return NULL;
}

/* A job of `world` ranks whose members 0..world-1 say the same thing; callers change them. */
static void job_init(job *j, int world)
{
    memset(j, 0, sizeof *j);
    j->world = j->members = world;
    j->timeout_ms = 5000;
    snprintf(j->endpoint, sizeof j->endpoint, "tcp://127.0.0.1:%d", check_free_port());
    for (int r = 0; r < MAX_WORLD; r++) {
        CHECK_OK(sf_curve_keypair(j->pub[r], j->sec[r]));
        j->rank_keys[r] = j->pub[r];
    }
    CHECK_OK(sf_curve_keypair(j->stranger_pub, j->stranger_sec));
    for (int i = 0; i <= MAX_WORLD; i++) {
        member *m = &j->m[i];
        m->j = j;
        m->index = i;
        m->key = i < MAX_WORLD ? i : 0;
        snprintf(m->endpoint, sizeof m->endpoint, "tcp://127.0.0.1:%d", 9000 + i);
        snprintf(m->host, sizeof m->host, "h%d", i);
        for (int k = 0; k < 8; k++) m->blob[k] = (uint8_t)(i * 16 + k);
        m->hello = (sf_hello){.rank = i, .world = world, .version = SEQFLOW_VERSION_STRING, .model_hash = 11,
                              .config_hash = 22, .pipeline_hash = sf_hash_text("segment ! block @1"), .options_hash = 44,
                              .endpoint = m->endpoint, .host = m->host, .blob = m->blob, .blob_len = (size_t)i % 9};
        if (i < MAX_WORLD) j->rank_endpoints[i] = m->endpoint;
    }
}

static void job_run(job *j)
{
    pthread_t t[MAX_WORLD + 1];
    for (int i = 0; i < j->members; i++) pthread_create(&t[i], NULL, member_thread, &j->m[i]);
    for (int i = 0; i < j->members; i++) pthread_join(t[i], NULL);
}

static void job_free(job *j)
{
    for (int i = 0; i <= MAX_WORLD; i++) {
        sf_rendezvous_result_free(j->m[i].result);
        free(j->m[i].fetched);
    }
}

static int says(const member *m, int rc, const char *mentions)
{
    int ok = m->rc == rc && strstr(m->message, mentions) != NULL;
    if (!ok) fprintf(stderr, "  member %d: rc %d '%s'\n  wanted %d '%s'\n", m->index, m->rc, m->message, rc, mentions);
    return ok;
}

static void check_success(int plaintext)
{
    job j;
    job_init(&j, 4);
    j.plaintext = plaintext;
    job_run(&j);
    for (int i = 0; i < 4; i++) {
        const member *m = &j.m[i];
        CHECKF(m->rc == SF_OK, "rank %d: %s", i, m->message);
        const sf_rendezvous_result *r = m->result;
        if (!r) continue;
        CHECK(r->rank == i && r->world == 4);
        for (int k = 0; k < 4; k++) {
            CHECK(strcmp(r->peers[k].endpoint, j.m[k].endpoint) == 0 && strcmp(r->peers[k].host, j.m[k].host) == 0);
            CHECK(r->peers[k].blob_len == (size_t)k && (k == 0 || memcmp(r->peers[k].blob, j.m[k].blob, (size_t)k) == 0));
        }
        size_t want = i == BIG_RANK ? BIG_PAYLOAD : 100 + (size_t)i;
        CHECKF(r->payload_len == want, "rank %d payload %zu, wanted %zu", i, r->payload_len, want);
        size_t wrong = 0;
        for (size_t b = 0; b < r->payload_len && b < want; b++) wrong += r->payload[b] != payload_byte(i, b);
        CHECKF(wrong == 0, "rank %d: %zu payload bytes differ", i, wrong);
    }
    job_free(&j);
}

static void check_mismatch(void)
{
    job j;
    job_init(&j, 3);
    j.timeout_ms = 2000;
    j.m[2].hello.model_hash = 12;
    job_run(&j);
    CHECK(says(&j.m[0], SF_E_PEER, "rank 2 (host h2) and rank 0 (host h0) differ in their model weights"));
    CHECK(says(&j.m[2], SF_E_PEER, "refused by the rendezvous: rank 2 (host h2) and rank 0 (host h0) differ in their model weights"));
    CHECK(j.m[1].rc == SF_E_PEER && !j.m[1].result); /* refused, or too late to hear why */
    job_free(&j);

    job_init(&j, 2);
    j.m[1].hello.config_hash = 23;
    job_run(&j);
    CHECK(says(&j.m[1], SF_E_PEER, "differ in their model configuration"));
    job_free(&j);

    job_init(&j, 2);
    j.m[1].hello.pipeline_hash = sf_hash_text("segment ! block @2");
    job_run(&j);
    CHECK(says(&j.m[0], SF_E_PEER, "differ in their pipeline text"));
    job_free(&j);

    job_init(&j, 2);
    j.m[1].hello.version = "0.0.9";
    job_run(&j);
    CHECK(says(&j.m[1], SF_E_PEER, "rank 1 (host h1) runs seqflow 0.0.9 but rank 0 (host h0) runs seqflow " SEQFLOW_VERSION_STRING));
    job_free(&j);

    job_init(&j, 2);
    j.m[1].hello.world = 3;
    job_run(&j);
    CHECK(says(&j.m[0], SF_E_PEER, "rank 1 (host h1) says the world has 3 ranks, rank 0 (host h0) that it has 2"));
    job_free(&j);
}

static void check_duplicate(void)
{
    job j;
    job_init(&j, 3);
    j.timeout_ms = 2000;
    j.m[2].hello.rank = 1; /* member 2 claims rank 1 too, with rank 1's key; rank 2 never comes */
    j.m[2].key = 1;
    job_run(&j);
    CHECK(says(&j.m[0], SF_E_PEER, "rank 1 is claimed twice: by host h"));
    CHECK(strstr(j.m[0].message, "host h1 (tcp://127.0.0.1:9001)") && strstr(j.m[0].message, "host h2 (tcp://127.0.0.1:9002)"));
    CHECK(says(&j.m[1], SF_E_PEER, "refused by the rendezvous: rank 1 is claimed twice"));
    CHECK(says(&j.m[2], SF_E_PEER, "refused by the rendezvous: rank 1 is claimed twice"));
    job_free(&j);
}

static void check_keys_and_timeouts(void)
{
    job j;
    /* no server: the client names the endpoint it waited for */
    job_init(&j, 2);
    j.no_server = 1;
    j.members = 1;
    j.m[0].hello.rank = 1;
    j.m[0].key = 1;
    j.timeout_ms = 500;
    job_run(&j);
    char want[160];
    snprintf(want, sizeof want, "rendezvous at %s (rank 0) did not answer within 500 ms", j.endpoint);
    CHECK(says(&j.m[0], SF_E_PEER, want));
    job_free(&j);

    /* a key the topology does not list: refused at the handshake; the server then misses rank 1 */
    job_init(&j, 2);
    j.m[1].key = -1;
    j.timeout_ms = 1500;
    job_run(&j);
    snprintf(want, sizeof want, "rendezvous at %s refused this rank's CURVE key", j.endpoint);
    CHECK(says(&j.m[1], SF_E_PEER, want));
    CHECK(says(&j.m[0], SF_E_PEER, "rank 1 (tcp://127.0.0.1:9001) never arrived within 1500 ms"));
    job_free(&j);

    /* a listed key, but another rank's */
    job_init(&j, 3);
    j.m[1].key = 2;
    j.timeout_ms = 2000;
    job_run(&j);
    CHECK(says(&j.m[0], SF_E_PEER, "rank 1 (host h1) connected with another key than rank 1's in the topology"));
    job_free(&j);

    /* the wrong server key: the handshake never completes */
    job_init(&j, 2);
    j.timeout_ms = 1000;
    memcpy(j.pub[0], j.stranger_pub, 41); /* the clients' idea of rank 0's key */
    j.members = 2;
    job_run(&j);
    CHECK(j.m[1].rc == SF_E_PEER && strstr(j.m[1].message, j.endpoint));
    CHECK(j.m[0].rc == SF_E_PEER);
    job_free(&j);
}

/* Ranks without the topology ask the server for it before their HELLO. */
static void check_fetch(void)
{
    job j;
    job_init(&j, 3);
    j.topology = "{\"version\": 1, \"the\": \"topology\"}";
    j.m[1].fetch = j.m[2].fetch = 1;
    job_run(&j);
    for (int i = 0; i < 3; i++) CHECKF(j.m[i].rc == SF_OK, "rank %d: %s", i, j.m[i].message);
    for (int i = 1; i < 3; i++) CHECK(j.m[i].fetched && strcmp(j.m[i].fetched, j.topology) == 0);
    job_free(&j);

    /* asked as rank 2 over rank 1's key: the job is refused, as for such a HELLO */
    job_init(&j, 3);
    j.timeout_ms = 2000;
    j.topology = "{}";
    j.m[2].fetch = 1;
    j.m[2].key = 1;
    job_run(&j);
    CHECK(says(&j.m[0], SF_E_PEER, "rank 2 asked for the topology with another key than rank 2's in the topology"));
    CHECK(says(&j.m[2], SF_E_PEER, "refused by the rendezvous: rank 2 asked for the topology with another key"));
    CHECK(!j.m[2].fetched);
    job_free(&j);

    /* a stranger's key never gets it */
    job_init(&j, 2);
    j.timeout_ms = 1500;
    j.topology = "{}";
    j.m[1].fetch = 1;
    j.m[1].key = -1;
    job_run(&j);
    CHECK(says(&j.m[1], SF_E_PEER, "refused this rank's CURVE key"));
    CHECK(!j.m[1].fetched);
    job_free(&j);

    /* a server with no topology to give */
    job_init(&j, 2);
    j.timeout_ms = 2000;
    j.m[1].fetch = 1;
    job_run(&j);
    CHECK(says(&j.m[1], SF_E_PEER, "rank 1 asked for the topology, and rank 0 has none to give"));
    job_free(&j);
}

typedef struct topo_member {
    sf_rendezvous_config c;
    sf_hello hello;
    int rc;
    sf_rendezvous_result *result;
} topo_member;

static void *topo_thread(void *arg)
{
    topo_member *m = arg;
    m->rc = m->hello.rank == 0 ? sf_rendezvous_serve(&m->c, &m->hello, NULL, NULL, &m->result)
                               : sf_rendezvous_join(&m->c, &m->hello, &m->result);
    if (m->rc) fprintf(stderr, "  rank %d: %s\n", m->hello.rank, sf_last_error());
    return NULL;
}

/* The configuration each rank derives from the topology file and its own secret key. */
static void check_from_topology(void)
{
    char pub[2][41], sec[2][41], other_pub[41], other_sec[41];
    for (int r = 0; r < 2; r++) CHECK_OK(sf_curve_keypair(pub[r], sec[r]));
    CHECK_OK(sf_curve_keypair(other_pub, other_sec));
    int port = check_free_port(), data = check_free_port();
    char text[1024];
    snprintf(text, sizeof text,
             "{\"version\": 1, \"rendezvous\": \"tcp://127.0.0.1:%d\", \"rendezvous_timeout_ms\": 5000, \"datacenters\": "
             "[{\"name\": \"a\", \"nodes\": [{\"name\": \"n\", \"host\": \"127.0.0.1\", \"ranks\": ["
             "{\"id\": 0, \"endpoint\": \"tcp://127.0.0.1:%d\", \"public_key\": \"%s\"},"
             "{\"id\": 1, \"endpoint\": \"tcp://127.0.0.1:%d\", \"public_key\": \"%s\"}]}]}]}",
             port, data, pub[0], data + 1, pub[1]);
    sf_topology *t = NULL;
    CHECK_OK(sf_topology_parse(text, strlen(text), "t.json", &t));
    if (!t) return;
    const char *keys[2][2], *endpoints[2][2];
    char mine[2][41];
    topo_member m[2];
    memset(m, 0, sizeof m);
    CHECK(sf_rendezvous_config_from_topology(t, 1, other_sec, mine[1], keys[1], endpoints[1], &m[1].c) == SF_E_INVAL);
    CHECKF(strstr(sf_last_error(), "the secret key given is not rank 1's"), "%s", sf_last_error());
    CHECK(sf_rendezvous_config_from_topology(t, 2, sec[1], mine[1], keys[1], endpoints[1], &m[1].c) == SF_E_INVAL);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        CHECK_OK(sf_rendezvous_config_from_topology(t, r, sec[r], mine[r], keys[r], endpoints[r], &m[r].c));
        CHECK(strcmp(mine[r], pub[r]) == 0 && m[r].c.timeout_ms == 5000 && !m[r].c.plaintext);
        m[r].hello = (sf_hello){.rank = r, .world = 2, .version = SEQFLOW_VERSION_STRING,
                                .endpoint = sf_topology_rank_get(t, r)->endpoint, .host = "127.0.0.1"};
    }
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, topo_thread, &m[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        CHECK(m[r].rc == SF_OK && m[r].result && m[r].result->payload_len == 0);
        if (m[r].result) CHECK(strcmp(m[r].result->peers[1].endpoint, sf_topology_rank_get(t, 1)->endpoint) == 0);
        sf_rendezvous_result_free(m[r].result);
    }
    sf_topology_free(t);
}

int main(void)
{
    char pub[41], sec[41];
    if (sf_curve_keypair(pub, sec) == SF_E_UNSUPPORTED) return check_skip("libzmq without CURVE");
    if (check_free_port() < 0) return check_skip("no TCP loopback");
    check_success(0);
    check_success(1);
    check_mismatch();
    check_duplicate();
    check_keys_and_timeouts();
    check_from_topology();
    check_fetch();
    return check_finish("test_rendezvous");
}
