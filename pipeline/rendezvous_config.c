/* The rendezvous' configuration from a topology, and the hashes a HELLO carries
 * (pipeline/rendezvous.h). */
#include "pipeline/rendezvous.h"

#include <string.h>
#include <xxhash.h>

#include "pipeline/net.h"
#include "seqflow/error.h"

/* ---- hashes ----------------------------------------------------------------------------------- */

uint64_t sf_hash_bytes(const void *data, size_t len) { return XXH3_64bits(len ? data : "", len); }
uint64_t sf_hash_text(const char *text) { return text ? XXH3_64bits(text, strlen(text)) : XXH3_64bits("", 0); }

uint64_t sf_hash_model_config(const sf_model_config *cfg)
{
    if (!cfg) return 0;
    /* field by field into a packed array: struct padding would make equal configs differ */
    int64_t v[16 + 2 * SF_MAX_BRANCHES];
    int n = 0;
    v[n++] = cfg->dim, v[n++] = cfg->heads, v[n++] = cfg->head_dim, v[n++] = cfg->vocab, v[n++] = cfg->layers;
    v[n++] = cfg->segment, v[n++] = cfg->n_branches, v[n++] = cfg->causal, v[n++] = cfg->memory;
    v[n++] = cfg->global_tokens, v[n++] = cfg->summary_tokens, v[n++] = cfg->mlp_hidden, v[n++] = cfg->final_norm;
    uint32_t eps;
    memcpy(&eps, &cfg->norm_eps, sizeof eps);
    v[n++] = eps;
    for (int b = 0; b < cfg->n_branches && b < SF_MAX_BRANCHES; b++) v[n++] = cfg->branches[b].window, v[n++] = cfg->branches[b].dilation;
    return XXH3_64bits(v, (size_t)n * sizeof v[0]);
}

int sf_rendezvous_config_from_topology(const sf_topology *t, int rank, const char *secret_key,
                                       char public_key[SF_Z85_KEY_LEN + 1], const char **keys,
                                       const char **endpoints, sf_rendezvous_config *out)
{
    if (!t || !out || !keys || !endpoints || !public_key)
        return sf_error(SF_E_INVAL, "sf_rendezvous_config_from_topology: NULL argument");
    const sf_topology_rank *self = sf_topology_rank_get(t, rank);
    if (!self) return sf_error(SF_E_INVAL, "rank %d is not in the topology (ranks 0..%d)", rank, sf_topology_world(t) - 1);
    int world = sf_topology_world(t);
    for (int r = 0; r < world; r++) {
        keys[r] = sf_topology_rank_get(t, r)->public_key;
        endpoints[r] = sf_topology_rank_get(t, r)->endpoint;
    }
    *out = (sf_rendezvous_config){.endpoint = sf_topology_rendezvous(t),
                                  .plaintext = sf_topology_get_security(t) == SF_SECURITY_PLAINTEXT,
                                  .rank_keys = keys, .rank_endpoints = endpoints,
                                  .timeout_ms = sf_topology_rendezvous_timeout_ms(t)};
    public_key[0] = '\0';
    if (out->plaintext) {
        out->rank_keys = NULL;
        return SF_OK;
    }
    int rc = sf_curve_public_key(secret_key, public_key);
    if (rc != SF_OK) return rc;
    if (strcmp(public_key, self->public_key) != 0)
        return sf_error(SF_E_INVAL, "the secret key given is not rank %d's: its public key is %s, the topology lists %s",
                        rank, public_key, self->public_key);
    out->server_public_key = sf_topology_rank_get(t, 0)->public_key;
    out->secret_key = secret_key;
    out->public_key = public_key;
    return SF_OK;
}
