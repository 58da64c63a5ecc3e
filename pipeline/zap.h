/* ZAP (ZeroMQ RFC 27), the authentication handshake's other half: a socket bound to
 * inproc://zeromq.zap.01 receives one request per incoming connection and answers it. Both the
 * network links (pipeline/net.c) and `seqflow serve` (pipeline/serve.c) admit connections by a
 * list of keys; this is the part they share. Not a public header. */
#ifndef SEQFLOW_PIPELINE_ZAP_H
#define SEQFLOW_PIPELINE_ZAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct sf_zap_request {
    char mechanism[16];  /* "NULL", "PLAIN" or "CURVE" ("" when longer or missing) */
    char address[64];    /* the peer's address as ZeroMQ gives it ("" when longer) */
    const uint8_t *key;  /* CURVE: the client's 32-byte public key; NULL otherwise */
} sf_zap_request;

/* decide: non-zero admits the connection; it may write a user id (at most size - 1 characters,
 * NUL-terminated) that ZeroMQ attaches to the connection's messages. */
typedef int (*sf_zap_decide)(void *user, const sf_zap_request *r, char *user_id, size_t size);

/* Answers every request waiting on the ZAP socket zap (never blocks when none waits): status
 * 200 when decide admits, else 400 with the text `refusal`. Returns how many were refused. */
int sf_zap_answer(void *zap, sf_zap_decide decide, void *user, const char *refusal);

#endif
