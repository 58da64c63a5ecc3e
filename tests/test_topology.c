/* The topology file (pipeline/topology.h): a full example read back field by field, link
 * options resolved level by level, and every refusal naming the JSON path of the bad field. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pipeline/topology.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

/* Z85 keys (libzmq's documented test keys) */
#define K0 "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
#define K1 "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
#define S1 "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"

/* JSON written with single quotes, for readable C literals: ' becomes ". */
static char *json(const char *text)
{
    char *s = strdup(text);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    return s;
}

static const char full[] =
    "{'version': 1, 'rendezvous': 'tcp://10.0.0.1:7000', 'heartbeat_ms': 250, 'timeout_ms': 2000,\n"
    " 'pipeline': ['segment', 'embed', {'stage': 'block layers=0-1', 'ranks': [1]},\n"
    "              {'stage': 'block layers=2-3', 'ranks': [2, 3]}, {'stage': 'block layers=4', 'head_ranks': [2, 0]},\n"
    "              'norm'],\n"
    " 'datacenters': [\n"
    "  {'name': 'eu', 'nodes': [\n"
    "    {'name': 'eu-1', 'host': '10.0.0.1', 'ranks': [\n"
    "      {'id': 0, 'endpoint': 'tcp://10.0.0.1:7001', 'public_key': '" K0 "'},\n"
    "      {'id': 1, 'endpoint': 'tcp://10.0.0.1:7002', 'public_key': '" K1 "', 'devices': ['cuda:0', 'cuda:1'], 'chunk': 24}]},\n"
    "    {'name': 'eu-2', 'ranks': [\n"
    "      {'id': 2, 'endpoint': 'ipc:///tmp/sf-2', 'public_key': '" K1 "', 'host': 'eu-2.lan'}]}]},\n"
    "  {'name': 'us', 'nodes': [\n"
    "    {'name': 'us-1', 'host': '10.1.0.1', 'ranks': [\n"
    "      {'id': 4, 'endpoint': 'tcp://[fd00::5]:7001', 'public_key': '" K0 "'},\n"
    "      {'id': 3, 'endpoint': 'tcp://10.1.0.1:7001', 'bind': 'tcp://0.0.0.0:7101', 'public_key': '" K1 "'}]}]}],\n"
    " 'links': {\n"
    "  'default': {'window_packets': 16},\n"
    "  'same_node': {'codec': 'raw'},\n"
    "  'across_datacenters': {'codec': 'lz4', 'quant': 'int8', 'group': 128, 'error_feedback': true, 'shuffle': true},\n"
    "  'overrides': [{'datacenters': ['us', 'eu'], 'level': 9},\n"
    "                {'ranks': [4, 3], 'codec': 'zstd', 'level': 3, 'window_bytes': 1048576, 'shuffle': true},\n"
    "                {'ranks': [0, 4], 'shuffle': false},\n"
    "                {'nodes': ['eu-1', 'eu-2'], 'quant': 'bf16'}]}}\n";

static void check_full(void)
{
    char *text = json(full);
    sf_topology *t = NULL;
    CHECK_OK(sf_topology_parse(text, strlen(text), "full.json", &t));
    free(text);
    if (!t) return;
    CHECK(sf_topology_world(t) == 5);
    CHECK(sf_topology_get_security(t) == SF_SECURITY_CURVE);
    CHECK(strcmp(sf_topology_rendezvous(t), "tcp://10.0.0.1:7000") == 0);
    CHECK(sf_topology_heartbeat_ms(t) == 250 && sf_topology_timeout_ms(t) == 2000);
    CHECK(sf_topology_connect_timeout_ms(t) == 10000 && sf_topology_linger_ms(t) == 1000);
    CHECK(sf_topology_rendezvous_timeout_ms(t) == 60000);
    CHECKF(strcmp(sf_topology_pipeline(t), "segment ! embed ! block layers=0-1 @1 ! block layers=2-3 @2,3 ! block layers=4 "
                                           "head_ranks=2,0 ! norm") == 0,
           "%s", sf_topology_pipeline(t));

    const sf_topology_rank *r = sf_topology_rank_get(t, 4);
    CHECK(r && r->id == 4 && strcmp(r->endpoint, "tcp://[fd00::5]:7001") == 0 && strcmp(r->host, "10.1.0.1") == 0);
    CHECK(r && r->datacenter == 1 && r->node == 2 && strcmp(r->datacenter_name, "us") == 0 && strcmp(r->node_name, "us-1") == 0);
    CHECK(r && r->n_devices == 1 && strcmp(r->devices[0], "cpu") == 0);
    r = sf_topology_rank_get(t, 1);
    CHECK(r && r->n_devices == 2 && strcmp(r->devices[1], "cuda:1") == 0 && strcmp(r->public_key, K1) == 0);
    CHECK(r && r->chunk == 24 && sf_topology_rank_get(t, 4)->chunk == 0);
    r = sf_topology_rank_get(t, 2);
    CHECK(r && strcmp(r->host, "eu-2.lan") == 0 && strcmp(r->node_name, "eu-2") == 0);
    CHECK(sf_topology_rank_get(t, 5) == NULL && sf_topology_rank_get(t, -1) == NULL);
    CHECK(sf_topology_rank_by_endpoint(t, "ipc:///tmp/sf-2") == sf_topology_rank_get(t, 2));
    CHECK(sf_topology_rank_by_endpoint(t, "tcp://nowhere:1") == NULL);
    /* bind: its own where given, else the endpoint */
    CHECK(strcmp(sf_topology_rank_get(t, 3)->bind, "tcp://0.0.0.0:7101") == 0);
    CHECK(strcmp(sf_topology_rank_get(t, 2)->bind, "ipc:///tmp/sf-2") == 0);

    const sf_topology_rank *peers[4];
    CHECK(sf_topology_peers(t, 2, peers, 4) == 4);
    CHECK(peers[0]->id == 0 && peers[1]->id == 1 && peers[2]->id == 3 && peers[3]->id == 4);
    CHECK(sf_topology_peers(t, 2, peers, 3) == SF_E_INVAL);
    CHECK(sf_topology_peers(t, 5, peers, 4) == SF_E_INVAL);

    CHECK(sf_link_scope_of(t, 0, 0) == SF_LINK_SAME_RANK);
    CHECK(sf_link_scope_of(t, 0, 1) == SF_LINK_SAME_NODE);
    CHECK(sf_link_scope_of(t, 1, 2) == SF_LINK_SAME_DATACENTER);
    CHECK(sf_link_scope_of(t, 2, 3) == SF_LINK_ACROSS_DATACENTERS);
    CHECK(strcmp(sf_link_scope_name(SF_LINK_SAME_DATACENTER), "same_datacenter") == 0);

    sf_topology_link l;
    /* same node: built-in defaults + default level */
    CHECK_OK(sf_topology_link_options(t, 1, 0, &l));
    CHECK(l.codec == SF_CODEC_RAW && l.quant == SF_QUANT_F32 && l.group == 0 && l.shuffle == 0 && l.error_feedback == 1 && l.window_packets == 16 &&
          l.window_bytes == (size_t)256 << 20);
    /* eu-1 <-> eu-2: the node pair override */
    CHECK_OK(sf_topology_link_options(t, 2, 0, &l));
    CHECK(l.codec == SF_CODEC_RAW && l.quant == SF_QUANT_BF16 && l.window_packets == 16);
    /* across datacenters: the class, then the datacenter pair (in either order) */
    CHECK_OK(sf_topology_link_options(t, 0, 4, &l));
    CHECK(l.codec == SF_CODEC_LZ4 && l.level == 9 && l.quant == SF_QUANT_INT8 && l.group == 128 && l.error_feedback == 1);
    CHECK(l.shuffle == 0); /* the class says true, the later rank pair override false */
    CHECK_OK(sf_topology_link_options(t, 1, 4, &l));
    CHECK(l.codec == SF_CODEC_LZ4 && l.shuffle == 1); /* the class's shuffle */
    sf_topology_link d;
    sf_topology_link_defaults(&d);
    CHECK(d.shuffle == 0);
    /* 3 <-> 4 is one node: same_node, then the rank pair */
    CHECK_OK(sf_topology_link_options(t, 3, 4, &l));
    CHECK(l.codec == SF_CODEC_ZSTD && l.level == 3 && l.quant == SF_QUANT_F32 && l.window_bytes == 1048576 && l.shuffle == 1);
    CHECK(sf_topology_link_options(t, 0, 5, &l) == SF_E_INVAL);
    sf_topology_free(t);
    sf_topology_free(NULL);
}

/* A small valid file with root_extra fields and dcs as its datacenters. */
static char *small(const char *root_extra, const char *dcs)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "{'version': 1, 'rendezvous': 'tcp://h0:7000', %s 'datacenters': %s}", root_extra, dcs);
    return json(buf);
}

#define TWO_RANKS                                                                                          \
    "[{'name': 'a', 'nodes': [{'name': 'n0', 'host': 'h0', 'ranks': ["                                     \
    "{'id': 0, 'endpoint': 'tcp://h0:7001', 'public_key': '" K0 "'},"                                      \
    "{'id': 1, 'endpoint': 'tcp://h0:7002', 'public_key': '" K1 "'}]}]}]"

static int refused(const char *root_extra, const char *dcs, const char *mentions)
{
    char *text = small(root_extra, dcs);
    sf_topology *t = (sf_topology *)1;
    int rc = sf_topology_parse(text, strlen(text), "topology.json", &t);
    int ok = rc == SF_E_PARSE && t == NULL && strstr(sf_last_error(), mentions) != NULL;
    if (!ok) fprintf(stderr, "  rc %d '%s'\n  wanted '%s'\n", rc, sf_last_error(), mentions);
    if (rc == SF_OK) sf_topology_free(t);
    free(text);
    return ok;
}

static int accepted(const char *root_extra, const char *dcs)
{
    char *text = small(root_extra, dcs);
    sf_topology *t = NULL;
    int rc = sf_topology_parse(text, strlen(text), "topology.json", &t);
    if (rc != SF_OK) fprintf(stderr, "  rc %d '%s'\n", rc, sf_last_error());
    sf_topology_free(t);
    free(text);
    return rc == SF_OK;
}

static void check_refusals(void)
{
    CHECK(accepted("", TWO_RANKS));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h0:7001', "
                      "'public_key': '" K0 "'}]}]}, {'name': 'b', 'nodes': [{'name': 'n1', 'ranks': [{'id': 1, "
                      "'endpoint': 'h1:7001', 'public_key': '" K0 "'}]}]}]",
                  "topology.json: $.datacenters[1].nodes[0].ranks[0].endpoint: expected \"tcp://host:port\" or \"ipc://path\""));
    static const char *const bad_endpoints[] = {"tcp://h:0", "tcp://h:65536", "tcp://*:7001", "tcp://:7001", "tcp://h",
                                                "tcp://fd00::1:7001", "ipc://", "udp://h:1", "tcp://h:7x"};
    for (size_t i = 0; i < sizeof bad_endpoints / sizeof *bad_endpoints; i++) {
        char dcs[512];
        snprintf(dcs, sizeof dcs, "[{'name': 'a', 'nodes': [{'name': 'n', 'ranks': [{'id': 0, 'endpoint': '%s', "
                                  "'public_key': '%s'}]}]}]", bad_endpoints[i], K0);
        CHECKF(refused("", dcs, "ranks[0].endpoint: expected"), "%s", bad_endpoints[i]);
    }
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 1, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "'}, {'id': 0, 'endpoint': 'tcp://h:2', 'public_key': '" K0 "'}]}, {'name': 'n1', 'ranks': [{'id': 1, "
                      "'endpoint': 'tcp://h:3', 'public_key': '" K0 "'}]}]}]",
                  "topology.json: rank 1 is claimed twice: $.datacenters[0].nodes[0].ranks[0].id and "
                  "$.datacenters[0].nodes[1].ranks[0].id"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "'}, {'id': 2, 'endpoint': 'tcp://h:2', 'public_key': '" K0 "'}]}]}]",
                  "$.datacenters[0].nodes[0].ranks[1].id: rank 2, but the file lists 2 ranks: ids are 0..1"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': -1, 'endpoint': 'tcp://h:1'}]}]}]",
                  "ranks[0].id: expected an integer in 0..4095"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0.5, 'endpoint': 'tcp://h:1'}]}]}]",
                  "ranks[0].id: expected an integer"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': 'abc'}]}]}]",
                  "$.datacenters[0].nodes[0].ranks[0].public_key: a CURVE key is 40 Z85 characters, not 3"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', "
                      "'public_key': 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf~'}]}]}]",
                  "public_key: character 40 ('~') is not in the Z85 alphabet"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', "
                      "'public_key': '#####>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7'}]}]}]",
                  "public_key: characters 1..5 do not encode 4 bytes"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1'}]}]}]",
                  "ranks[0].public_key: required with \"security\": \"curve\""));
    /* plaintext only when the file says so, and then no key is needed */
    CHECK(accepted("'security': 'plaintext',",
                   "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1'}]}]}]"));
    CHECK(refused("'security': 'none',", TWO_RANKS, "$.security: expected \"curve\" or \"plaintext\""));
    /* typos are refused, not ignored */
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpont': 'tcp://h:1'}]}]}]",
                  "$.datacenters[0].nodes[0].ranks[0].endpont: unknown field (expected one of: id, endpoint, bind, public_key, devices, host, chunk)"));
    CHECK(refused("'heartbeat': 5,", TWO_RANKS, "$.heartbeat: unknown field"));
    CHECK(refused("'timeout_ms': 1, 'timeout_ms': 2,", TWO_RANKS, "$.timeout_ms: given twice"));
    CHECK(refused("'links': {'acros_datacenters': {}},", TWO_RANKS, "$.links.acros_datacenters: unknown field"));
    CHECK(refused("'links': {'default': {'codec': 'gzip'}},", TWO_RANKS, "$.links.default.codec: expected \"raw\", \"lz4\" or \"zstd\""));
    CHECK(refused("'links': {'default': {'quant': 'int3'}},", TWO_RANKS, "$.links.default.quant: expected \"f32\""));
    CHECK(refused("'links': {'default': {'codec': 'lz4', 'level': 13}},", TWO_RANKS, "$.links.default.level: expected an integer in 0..12"));
    CHECK(refused("'links': {'default': {'quant': 'int4', 'group': 7}},", TWO_RANKS, "int4 needs an even group"));
    CHECK(refused("'links': {'same_node': {'error_feedback': 1}},", TWO_RANKS, "$.links.same_node.error_feedback: expected true or false"));
    CHECK(refused("'links': {'default': {'shuffle': 1}},", TWO_RANKS, "$.links.default.shuffle: expected true or false"));
    CHECK(refused("'links': {'across_datacenters': {'shuffle': 'yes'}},", TWO_RANKS,
                  "$.links.across_datacenters.shuffle: expected true or false"));
    CHECK(refused("'links': {'default': {'shuffle': null}},", TWO_RANKS, "$.links.default.shuffle: expected true or false"));
    CHECK(refused("'links': {'overrides': [{'ranks': [0, 1], 'shuffle': 'on'}]},", TWO_RANKS,
                  "$.links.overrides[0].shuffle: expected true or false"));
    CHECK(refused("'links': {'default': {'shuffel': true}},", TWO_RANKS, "$.links.default.shuffel: unknown field"));
    CHECK(refused("'links': {'default': {'shuffle': true, 'shuffle': false}},", TWO_RANKS, "$.links.default.shuffle: given twice"));
    CHECK(refused("'links': {'overrides': [{'datacenters': ['a', 'b'], 'codec': 'lz4'}]},", TWO_RANKS,
                  "$.links.overrides[0].datacenters[1]: no datacenter named \"b\" (datacenters: a)"));
    CHECK(refused("'links': {'overrides': [{'nodes': ['n0', 'x']}]},", TWO_RANKS, "overrides[0].nodes[1]: no node named \"x\""));
    CHECK(refused("'links': {'overrides': [{'ranks': [0, 2]}]},", TWO_RANKS, "overrides[0].ranks[1]: expected a rank of the topology (0..1)"));
    CHECK(refused("'links': {'overrides': [{'codec': 'lz4'}]},", TWO_RANKS, "$.links.overrides[0]: an override names exactly one pair"));
    CHECK(refused("'links': {'overrides': [{'ranks': [0, 1], 'nodes': ['n0', 'n0']}]},", TWO_RANKS, "exactly one pair"));
    CHECK(refused("'links': {'overrides': [{'ranks': [0]}]},", TWO_RANKS, "overrides[0].ranks: expected a pair"));
    CHECK(refused("'timeout_ms': 400,", TWO_RANKS, "$.timeout_ms: 400 ms must be longer than heartbeat_ms (500 ms)"));
    CHECK(refused("'linger_ms': -1,", TWO_RANKS, "$.linger_ms: expected an integer"));
    CHECK(refused("'pipeline': ['segment ! embed'],", TWO_RANKS, "$.pipeline[0]: expected one stage's text"));
    CHECK(refused("'pipeline': [{'stage': 'block', 'ranks': [2]}],", TWO_RANKS, "$.pipeline[0].ranks[0]: expected a rank of the topology (0..1)"));
    CHECK(refused("'pipeline': [{'stage': 'block', 'ranks': [1, 1]}],", TWO_RANKS, "$.pipeline[0].ranks[1]: rank 1 is listed twice"));
    CHECK(refused("'pipeline': [{'stage': 'block', 'rank': [1]}],", TWO_RANKS, "$.pipeline[0].rank: unknown field"));
    CHECK(refused("'pipeline': [{'stage': 'block', 'head_ranks': [0, 0]}],", TWO_RANKS,
                  "$.pipeline[0].head_ranks[1]: rank 0 is listed twice"));
    CHECK(refused("'pipeline': [{'stage': 'block', 'head_ranks': []}],", TWO_RANKS,
                  "$.pipeline[0].head_ranks: expected a non-empty list of ranks"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "'}, {'id': 1, 'endpoint': 'tcp://h:1', 'public_key': '" K0 "'}]}]}]",
                  "$.datacenters[0].nodes[0].ranks[1].endpoint: \"tcp://h:1\" is also rank 0's"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h0:7000', 'public_key': '" K0
                      "'}]}]}]",
                  "$.rendezvous: \"tcp://h0:7000\" is also rank 0's endpoint"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "', 'devices': ['gpu0']}]}]}]",
                  "ranks[0].devices[0]: expected \"cpu\", \"cpu:N\", \"cuda\" or \"cuda:N\""));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "', 'devices': ['cpu:x']}]}]}]",
                  "ranks[0].devices[0]: expected"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "', 'devices': ['cpu:0', 'cpu:0']}]}]}]",
                  "ranks[0].devices[1]: device \"cpu:0\" is listed twice"));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "'}]}]}, {'name': 'a', 'nodes': [{'name': 'n1', 'ranks': [{'id': 1, 'endpoint': 'tcp://h:2', 'public_key': '" K0 "'}]}]}]",
                  "$.datacenters[1].name: a second datacenter named \"a\""));
    CHECK(refused("", "[{'name': 'a', 'nodes': [{'name': 'n0', 'ranks': [{'id': 0, 'endpoint': 'tcp://h:1', 'public_key': '" K0
                      "', 'chunk': 0}]}]}]",
                  "ranks[0].chunk"));
    CHECK(refused("", "[{'name': 'a', 'nodes': []}]", "$.datacenters[0].nodes: expected a non-empty list of nodes"));
    CHECK(refused("", "[]", "$.datacenters: expected a non-empty list"));

    /* the file itself: not JSON (line and column), version, size */
    sf_topology *t = (sf_topology *)1;
    const char *bad = "{\n  \"version\": 1,\n  \"rendezvous\" \"x\"\n}";
    CHECK(sf_topology_parse(bad, strlen(bad), "t.json", &t) == SF_E_PARSE && t == NULL);
    CHECKF(strstr(sf_last_error(), "t.json: line 3, column") != NULL, "%s", sf_last_error());
    const char *trailing = "{} {}";
    CHECK(sf_topology_parse(trailing, strlen(trailing), "t.json", &t) == SF_E_PARSE);
    CHECKF(strstr(sf_last_error(), "text after the JSON value") != NULL, "%s", sf_last_error());
    const char *v2 = "{\"version\": 2}";
    CHECK(sf_topology_parse(v2, strlen(v2), "t.json", &t) == SF_E_PARSE);
    CHECKF(strstr(sf_last_error(), "t.json: $.version: this seqflow reads topology version 1, not 2") != NULL, "%s", sf_last_error());
    CHECK(sf_topology_load("/nonexistent/topology.json", &t) == SF_E_IO && t == NULL);
    CHECKF(strstr(sf_last_error(), "/nonexistent/topology.json") != NULL, "%s", sf_last_error());
}

static void check_keys(void)
{
    CHECK_OK(sf_z85_key_check(K0, "k"));
    CHECK(sf_z85_key_check(K0 "x", "k") == SF_E_INVAL);
    CHECK(sf_z85_key_check(NULL, "k") == SF_E_INVAL);
    char pub[41], sec[41];
    int rc = sf_curve_public_key(S1, pub);
    if (rc == SF_E_UNSUPPORTED) return; /* libzmq without CURVE */
    CHECK(rc == SF_OK && strcmp(pub, K1) == 0);
    CHECK_OK(sf_curve_keypair(pub, sec));
    char again[41];
    CHECK_OK(sf_curve_public_key(sec, again));
    CHECK(strcmp(again, pub) == 0);

    /* key files: private, one key, optional newline */
    const char *path = check_tmp_path("topology.key");
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", S1);
    fclose(f);
    chmod(path, 0600);
    char key[41];
    CHECK_OK(sf_topology_read_key(path, key));
    CHECK(strcmp(key, S1) == 0);
    chmod(path, 0644);
    CHECK(sf_topology_read_key(path, key) == SF_E_IO);
    CHECKF(strstr(sf_last_error(), "can be read by others (mode 644)") != NULL, "%s", sf_last_error());
    f = fopen(path, "w");
    fprintf(f, "%s\n%s\n", S1, K0);
    fclose(f);
    chmod(path, 0600);
    CHECK(sf_topology_read_key(path, key) == SF_E_INVAL);
    CHECKF(strstr(sf_last_error(), "expected one Z85 key and nothing else") != NULL, "%s", sf_last_error());
    f = fopen(path, "w");
    fprintf(f, "short\n");
    fclose(f);
    CHECK(sf_topology_read_key(path, key) == SF_E_INVAL);
    CHECK(sf_topology_read_key("/nonexistent/key", key) == SF_E_IO);
    remove(path);
}

int main(void)
{
    check_full();
    check_refusals();
    check_keys();
    return check_finish("test_topology");
}
