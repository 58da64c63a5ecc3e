/* A TCP proxy for tests of network links: listens on 127.0.0.1 (an ephemeral port) unless told
 * otherwise, forwards every connection to a target, and can delay, throttle, cut and refuse.
 * tests/tools/sf_tcp_proxy.c makes a program of it (a WAN between network namespaces). One thread with
 * poll() serves all connections; each direction buffers at most 1 MiB (it stops reading from
 * a side whose bytes cannot go on), so a slow or delayed path back-pressures like a real one. */
#ifndef SEQFLOW_TEST_TCP_PROXY_H
#define SEQFLOW_TEST_TCP_PROXY_H

#include <stddef.h>

typedef struct tcp_proxy tcp_proxy;

typedef struct tcp_proxy_options {
    int delay_ms;        /* each byte leaves this long after it arrived (a WAN's one-way delay) */
    double rate;         /* bytes per second per direction and connection; 0 = unlimited */
    const char *listen_host; /* numeric IPv4 address to listen on; NULL = 127.0.0.1 */
    int listen_port;     /* 0 = an ephemeral port */
    size_t max_buffered; /* bytes held per direction and connection; 0 = 1 MiB. A delayed path
                            carries at most this much per delay: 1 MiB per 25 ms is ~335 Mbit/s */
    unsigned long long cut_after_bytes; /* once this many bytes were forwarded (both directions,
                            every connection), reset every open connection, once; 0 = never */
} tcp_proxy_options;

/* Starts a proxy to target_host:target_port (numeric IPv4). o NULL = no delay, no limit.
 * Returns 0, or -1 with errno. */
int tcp_proxy_start(const char *target_host, int target_port, const tcp_proxy_options *o, tcp_proxy **out);
/* The port it listens on (127.0.0.1). */
int tcp_proxy_port(const tcp_proxy *p);
/* Resets every open connection now (RST both ways; bytes buffered in the proxy are lost). */
void tcp_proxy_cut(tcp_proxy *p);
/* While drop is set, new connections are reset as soon as they arrive (a partition). */
void tcp_proxy_set_drop(tcp_proxy *p, int drop);
/* Connections accepted and forwarded so far. */
int tcp_proxy_accepted(tcp_proxy *p);
/* Bytes forwarded so far: [0] client to target, [1] target to client. */
void tcp_proxy_bytes(tcp_proxy *p, unsigned long long out[2]);
/* Stops the thread and closes everything. NULL accepted. */
void tcp_proxy_stop(tcp_proxy *p);

#endif
