/* The rendezvous: how the ranks of a job find each other and agree they run the same thing
 * before any data moves. Rank 0 serves it (a ZeroMQ ROUTER on the topology's "rendezvous"
 * endpoint); every other rank joins (a DEALER) and says HELLO; once every rank of the world
 * has said hello and they all agree, the server answers each with WELCOME (every rank's
 * endpoint, host and blob, plus a payload meant for that rank alone) or, when anything is
 * wrong, every rank with REFUSE and the reason.
 *
 * Security: unless the configuration says plaintext, the server is a CURVE server with rank
 * 0's keys and a ZAP handler that admits only the listed public keys; a client must know the
 * server's public key. A HELLO for rank r is accepted only over a connection authenticated
 * with rank r's listed key (when keys are listed per rank).
 *
 * Checks, in this order, each refusing the whole job with a message naming the ranks and
 * hosts involved: a world size that differs from the server's, a rank outside 0..world-1, a
 * HELLO over another rank's key, a rank claimed twice (naming both hosts), another version of seqflow (naming both versions
 * and ranks), another model (weights), model configuration, pipeline or options (naming both
 * ranks and what differs). A rank that never says hello within the timeout fails the server
 * with SF_E_PEER naming every missing rank and its endpoint; a client that gets no answer
 * fails with SF_E_PEER naming the rendezvous endpoint.
 *
 * Wire format (every message one ZeroMQ frame, little-endian; every length is checked against
 * the received size before anything is read or allocated):
 *   header      "SFRV" u16 protocol version (SF_RENDEZVOUS_PROTOCOL) u16 type
 *   HELLO   1   i32 rank, i32 world, u64 model, config, pipeline, options hashes,
 *               str version, str endpoint, str host, blob        (str/blob: u16 length, bytes)
 *   WELCOME 2   i32 world, u64 payload bytes, then per rank: str endpoint, str host, blob
 *   REFUSE  3   str message
 *   CHUNK   4   u64 offset, bytes (the payload in pieces of at most SF_RENDEZVOUS_CHUNK)
 *   DONE    5   (client -> server: the whole payload arrived)
 *   ASK     6   i32 rank (client -> server, on a connection of its own before its HELLO: a rank
 *               without the topology file asks for it; it counts as no arrival)
 *   TOPOLOGY 7  u32 length, the topology's text (server -> client)
 * The payload is received by appending chunks as they arrive (never allocated from the
 * announced size) and refused beyond the client's max_payload. */
#ifndef SEQFLOW_PIPELINE_RENDEZVOUS_H
#define SEQFLOW_PIPELINE_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "pipeline/topology.h"
#include "seqflow/buffer.h"
#include "seqflow/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_RENDEZVOUS_PROTOCOL 1
#define SF_RENDEZVOUS_MAX_BLOB 256             /* bytes of a rank's opaque blob */
#define SF_RENDEZVOUS_CHUNK (16u << 20)        /* payload bytes per CHUNK message */
#define SF_RENDEZVOUS_DEFAULT_MAX_PAYLOAD ((size_t)1 << 30)
#define SF_RENDEZVOUS_DEFAULT_TIMEOUT_MS 60000

/* What a rank says about itself. Strings are borrowed for the call. */
typedef struct sf_hello {
    int rank, world;
    const char *version;          /* SEQFLOW_VERSION_STRING */
    uint64_t model_hash;          /* sf_model_weights_hash */
    uint64_t config_hash;         /* sf_hash_model_config */
    uint64_t pipeline_hash;       /* sf_hash_text of the pipeline text with placements */
    uint64_t options_hash;        /* whatever else must match (precision, backend options...) */
    const char *endpoint;         /* this rank's data endpoint (its topology entry) */
    const char *host;             /* this machine's name, for messages */
    const uint8_t *blob;          /* opaque, e.g. an NCCL unique id; NULL when blob_len is 0 */
    size_t blob_len;              /* <= SF_RENDEZVOUS_MAX_BLOB */
} sf_hello;

typedef struct sf_rendezvous_config {
    const char *endpoint;         /* rank 0's rendezvous endpoint: bound by the server,
                                     connected to by clients */
    int plaintext;                /* 1: no CURVE (only where the topology says plaintext) */
    const char *server_public_key; /* rank 0's public key (Z85): server and clients */
    const char *secret_key;       /* this process's secret key (Z85): rank 0's on the server */
    const char *public_key;       /* this process's public key (client; Z85) */
    /* server: the public key of each rank (index = rank, world entries); ZAP admits only these,
     * and a HELLO for rank r must come over r's key. NULL under plaintext. */
    const char *const *rank_keys;
    const char *const *rank_endpoints; /* server, optional (index = rank): named in timeouts */
    int timeout_ms;               /* server: for every rank to arrive and take its welcome;
                                     client: for the welcome; 0 = SF_RENDEZVOUS_DEFAULT_TIMEOUT_MS */
    size_t max_payload;           /* client: the largest payload accepted; 0 = default (1 GiB) */
    /* server, optional: the topology's text, handed to a rank that asks for it
     * (sf_rendezvous_fetch_topology); NULL refuses such requests */
    const char *topology_text;
    size_t topology_len;
} sf_rendezvous_config;

/* The server's source of each rank's payload: appends rank's bytes (its stages' resume
 * state, say) to out, which starts empty; may append nothing. Called once per rank, rank 0
 * included, after every rank has been checked; returns SF_OK or an error that refuses the job
 * with sf_last_error()'s message. */
typedef int (*sf_rendezvous_payload_fn)(void *user, int rank, sf_buffer *out);

typedef struct sf_rendezvous_peer {
    char *endpoint;
    char *host;
    uint8_t *blob;                /* NULL when blob_len is 0 */
    size_t blob_len;
} sf_rendezvous_peer;

/* What every rank learns: owned by the result, freed with sf_rendezvous_result_free. */
typedef struct sf_rendezvous_result {
    int rank, world;
    sf_rendezvous_peer *peers;    /* [world], index = rank */
    uint8_t *payload;             /* this rank's payload (malloc'd; NULL when empty) */
    size_t payload_len;
} sf_rendezvous_result;

/* Rank 0: binds c->endpoint, waits for the other own->world - 1 ranks, checks them against own
 * and each other, calls payload (NULL: every payload empty) and sends each rank its WELCOME,
 * then waits until each confirms it has the whole payload. On success *out holds rank 0's
 * view (its own payload included). On any failure every rank that said hello gets REFUSE with
 * the same message, *out is NULL and the code is SF_E_PEER (missing or refused ranks),
 * SF_E_INVAL (bad configuration), SF_E_IO (cannot bind) or the payload callback's. */
int sf_rendezvous_serve(const sf_rendezvous_config *c, const sf_hello *own,
                        sf_rendezvous_payload_fn payload, void *user, sf_rendezvous_result **out);

/* Any other rank: connects to c->endpoint, says own, and waits for the answer. SF_E_PEER when
 * refused (the server's message, which the rank should print and exit with), when the
 * rendezvous does not answer within the timeout (naming the endpoint), or when the CURVE
 * handshake fails (naming the endpoint: a key not admitted, or the wrong server key). */
int sf_rendezvous_join(const sf_rendezvous_config *c, const sf_hello *own, sf_rendezvous_result **out);

/* A rank started without the topology file (`seqflow worker --connect`): asks the server at
 * c->endpoint for the topology's text, with c's keys (under CURVE the server admits only the
 * topology's keys and answers rank `rank` only over rank `rank`'s: the same proof as a HELLO;
 * server_public_key is rank 0's). *text (malloc'd, NUL-terminated, *len bytes) is what the
 * server's config gave; the caller parses it and joins as usual. SF_E_PEER when refused (the
 * whole job is refused: a request over another rank's key, or a server without a topology to
 * give), when the server does not answer within c->timeout_ms, or when the handshake fails. */
int sf_rendezvous_fetch_topology(const sf_rendezvous_config *c, int rank, char **text, size_t *len);

/* The configuration of rank `rank` from topology t: the rendezvous endpoint and timeout,
 * plaintext or CURVE, rank 0's public key, every rank's key and endpoint (written into keys[]
 * and endpoints[], world entries each, which the caller provides) and this rank's key pair:
 * secret_key (e.g. from sf_topology_read_key) and its public half, derived into public_key.
 * Under CURVE the secret key must be the topology's rank `rank`'s (SF_E_INVAL otherwise, naming
 * both public keys). *out borrows from t, secret_key, public_key, keys and endpoints. */
int sf_rendezvous_config_from_topology(const sf_topology *t, int rank, const char *secret_key,
                                       char public_key[SF_Z85_KEY_LEN + 1], const char **keys,
                                       const char **endpoints, sf_rendezvous_config *out);

/* Frees a result; NULL is accepted. */
void sf_rendezvous_result_free(sf_rendezvous_result *r);

/* XXH3 (64-bit) of bytes / of a NUL-terminated text (NULL hashes as ""). */
uint64_t sf_hash_bytes(const void *data, size_t len);
uint64_t sf_hash_text(const char *text);
/* XXH3 of every field of a model configuration, field by field (no padding bytes). */
uint64_t sf_hash_model_config(const sf_model_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
