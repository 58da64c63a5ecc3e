/* The topology of a distributed run: which ranks exist, where they listen, how they are
 * grouped into nodes and datacenters, their CURVE public keys, the pipeline with its
 * placements, and how each link between two ranks encodes what it carries. One JSON file,
 * read with cJSON; the schema is docs/DISTRIBUTED.md, section "Topology".
 *
 * Every rank of a job reads the same file. Secret keys are never in it: each rank reads its
 * own from a file (`--key FILE`, sf_topology_read_key).
 *
 * Errors: parsing returns SF_E_PARSE (malformed JSON, a bad or unknown field) or SF_E_NOMEM,
 * and sf_last_error() names the file and the JSON path of the field, e.g.
 *   topology.json: $.datacenters[1].nodes[0].ranks[2].endpoint: expected "tcp://host:port" or
 *   "ipc://path"
 * Ownership: a loaded topology owns every string it hands out; pointers returned by the
 * accessors live until sf_topology_free. A topology is immutable once loaded and may be read
 * by any number of threads. */
#ifndef SEQFLOW_PIPELINE_TOPOLOGY_H
#define SEQFLOW_PIPELINE_TOPOLOGY_H

#include <stddef.h>

#include "compress/frame.h"
#include "compress/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_TOPOLOGY_VERSION 1
#define SF_TOPOLOGY_MAX_RANKS 4096        /* ranks of one job */
#define SF_TOPOLOGY_MAX_BYTES (16u << 20) /* a topology file larger than this is refused */
#define SF_Z85_KEY_LEN 40                 /* a CURVE key in Z85: 32 bytes as 40 characters */

typedef enum sf_topology_security {
    SF_SECURITY_CURVE = 0,    /* default: every connection encrypted, peers authenticated */
    SF_SECURITY_PLAINTEXT = 1 /* only where the file says "security": "plaintext" */
} sf_topology_security;

/* Where two ranks sit relative to each other; selects the link class of "links". */
typedef enum sf_link_scope {
    SF_LINK_SAME_RANK = 0,        /* an in-process queue: no encoding at all */
    SF_LINK_SAME_NODE = 1,
    SF_LINK_SAME_DATACENTER = 2,
    SF_LINK_ACROSS_DATACENTERS = 3
} sf_link_scope;

/* One link's encoding and flow control: the fields of sf_link_options (pipeline/net.h), which
 * the executor fills from it: codec, level, quant, group and shuffle as they are (group 0 = the
 * row width: one scale per row; shuffle 0 or 1), window_packets and window_bytes as they are (always set here),
 * error_feedback 1 as 1 and 0 as -1 (sf_link_options' "off"). Defaults, used where the file
 * sets nothing: raw codec, level 0 (the codec's default), f32 (lossless), group 0, shuffle 0,
 * error_feedback 1 (used only by lossy kinds), window 8 packets and 256 MiB. */
typedef struct sf_topology_link {
    sf_codec codec;
    int level;
    sf_quant_kind quant;
    int group;
    int shuffle;
    int error_feedback;
    int window_packets;
    size_t window_bytes;
} sf_topology_link;

typedef struct sf_topology_rank {
    int id;                         /* 0..world-1 */
    const char *endpoint;           /* "tcp://host:port" or "ipc://path": where its peers reach it */
    const char *bind;               /* where it binds: its "bind" field (e.g. "tcp://0.0.0.0:7001",
                                       or a port behind a proxy), else the endpoint */
    const char *public_key;         /* Z85, SF_Z85_KEY_LEN chars; NULL under plaintext (a key
                                       given there is checked, then not used) */
    const char *host;               /* the rank's "host", else its node's "host", else the
                                       node's name: for messages */
    const char *const *devices;     /* e.g. {"cpu"} or {"cuda:0", "cuda:1"}; never NULL */
    int n_devices;                  /* >= 1 ({"cpu"} when the file lists none) */
    int datacenter;                 /* index into the datacenters, in file order */
    int node;                       /* index of its node over the whole file, in file order */
    const char *datacenter_name, *node_name;
    int chunk;                      /* "chunk": segments a round under sequence parallelism
                                       (1..2^20); 0 when the file gives none */
} sf_topology_rank;

typedef struct sf_topology sf_topology;

/* Reads and validates the file at path (at most SF_TOPOLOGY_MAX_BYTES). Messages start with
 * the path. On success *out is a new topology the caller frees with sf_topology_free; on
 * failure *out is NULL. */
int sf_topology_load(const char *path, sf_topology **out);
/* The same from text[0..len) (need not be NUL-terminated); name prefixes messages (e.g. the
 * file name; NULL reads as "topology"). */
int sf_topology_parse(const char *text, size_t len, const char *name, sf_topology **out);
/* Frees t; NULL is accepted. */
void sf_topology_free(sf_topology *t);

/* Ranks of the job (world size): ranks are exactly 0..world-1. */
int sf_topology_world(const sf_topology *t);
/* Rank `id`, or NULL when id is outside 0..world-1. */
const sf_topology_rank *sf_topology_rank_get(const sf_topology *t, int id);
/* The rank whose endpoint is `endpoint` (exact text), or NULL. */
const sf_topology_rank *sf_topology_rank_by_endpoint(const sf_topology *t, const char *endpoint);

sf_topology_security sf_topology_get_security(const sf_topology *t);
/* Milliseconds from the file, or the defaults 500, 3000, 10000, 1000 (as sf_net_options). */
int sf_topology_heartbeat_ms(const sf_topology *t);
int sf_topology_timeout_ms(const sf_topology *t);
int sf_topology_connect_timeout_ms(const sf_topology *t);
int sf_topology_linger_ms(const sf_topology *t);
/* Rank 0's rendezvous endpoint ("rendezvous", required): the server binds it, every other
 * rank connects to it. The server authenticates with rank 0's key. */
const char *sf_topology_rendezvous(const sf_topology *t);
/* How long the rendezvous waits for every rank ("rendezvous_timeout_ms", default 60000). */
int sf_topology_rendezvous_timeout_ms(const sf_topology *t);

/* The pipeline text with its placements (stages joined by " ! ", placements written as
 * " @1" or " @1,2", a list entry's "head_ranks" as the block option " head_ranks=1,2" before
 * its placement), whether the file gave it as one string or as a list of stages; NULL when
 * the file has no "pipeline" (the command line then gives it). Ranks of the list form are
 * checked against the world here; placements written in the text form are checked by the
 * pipeline parser, and against the world by whoever places the stages. */
const char *sf_topology_pipeline(const sf_topology *t);

/* Where ranks a and b sit relative to each other; SF_LINK_SAME_RANK for a == b. Both must be
 * valid ranks (otherwise SF_LINK_ACROSS_DATACENTERS, the most conservative). */
sf_link_scope sf_link_scope_of(const sf_topology *t, int a, int b);
const char *sf_link_scope_name(sf_link_scope scope); /* "same_rank", "same_node", ... */
/* The options of the link between ranks a and b (either direction: links are symmetric),
 * resolved as docs/DISTRIBUTED.md says: built-in defaults, then "links.default", then the
 * class of the pair ("same_node", "same_datacenter", "across_datacenters"), then every entry
 * of "links.overrides" that matches the pair, in file order; each level replaces only the
 * fields it names. SF_E_INVAL for an invalid rank. */
int sf_topology_link_options(const sf_topology *t, int a, int b, sf_topology_link *out);
/* The built-in defaults (see sf_topology_link). */
void sf_topology_link_defaults(sf_topology_link *out);

/* The ranks other than `self`, in rank order, for sf_net_options.peers: fills out[0..world-2]
 * with pointers into t (the caller owns only the array, of at least world-1 entries) and
 * returns their count, or a negative SF_E_INVAL for an invalid self. Each has the fields of
 * sf_net_peer: id (rank), endpoint, public_key (NULL under plaintext), host. */
int sf_topology_peers(const sf_topology *t, int self, const sf_topology_rank **out, int cap);

/* Z85 CURVE keys. sf_z85_key_check: SF_OK when text is exactly SF_Z85_KEY_LEN characters of
 * the Z85 alphabet, else SF_E_INVAL saying which (length or the first bad character and its
 * offset); what names the key in the message. */
int sf_z85_key_check(const char *text, const char *what);
/* Reads a secret key file: SF_Z85_KEY_LEN Z85 characters, optionally followed by whitespace
 * (a newline). Refused (SF_E_IO) when the file can be read by its group or others (mode & 077),
 * as ssh does with private keys; SF_E_INVAL for a bad key. out receives the key and a NUL. */
int sf_topology_read_key(const char *path, char out[SF_Z85_KEY_LEN + 1]);
/* The public key of a secret key (both Z85, out NUL-terminated). SF_E_INVAL for a bad secret,
 * SF_E_UNSUPPORTED when libzmq was built without CURVE. */
int sf_curve_public_key(const char *secret, char out[SF_Z85_KEY_LEN + 1]);
/* A new key pair (for `seqflow keygen`); SF_E_UNSUPPORTED without CURVE support. */
int sf_curve_keypair(char public_key[SF_Z85_KEY_LEN + 1], char secret_key[SF_Z85_KEY_LEN + 1]);

#ifdef __cplusplus
}
#endif
#endif
