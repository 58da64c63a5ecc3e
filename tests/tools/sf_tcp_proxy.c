/* sf_tcp_proxy: the test TCP proxy (tests/support/tcp_proxy.h) as a program, to put a WAN
 * between processes: each connection to --listen is forwarded to --target, every byte held
 * --delay-ms in each direction, optionally throttled and cut. tests/wan_netns.sh and
 * bench/bench_wan.sh run one per direction between two network namespaces.
 *   sf_tcp_proxy --listen ADDR:PORT --target ADDR:PORT [--delay-ms D] [--rate-mbit R]
 *                [--buffer-bytes B] [--cut-after-bytes N] [--ready-file F]
 * It runs until SIGINT or SIGTERM, then prints one line on stdout:
 *   sf_tcp_proxy: LISTEN -> TARGET: C connections, U bytes forwarded, D bytes back */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/tcp_proxy.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static void usage(FILE *f)
{
    fputs("usage: sf_tcp_proxy --listen ADDR:PORT --target ADDR:PORT [options]\n"
          "\n"
          "Forwards every TCP connection to ADDR:PORT (numeric IPv4; listen port 0 = any) to the\n"
          "target, until SIGINT or SIGTERM; then prints the bytes forwarded each way.\n"
          "\n"
          "  --delay-ms D          hold every byte D ms in each direction (one-way delay)\n"
          "  --rate-mbit R         at most R Mbit/s per direction and connection (0 = no limit)\n"
          "  --buffer-bytes B      bytes held per direction and connection (default 64 MiB: a\n"
          "                        delayed path carries at most B per delay)\n"
          "  --cut-after-bytes N   reset every open connection once N bytes were forwarded\n"
          "  --ready-file F        write the port listened on to F once listening\n",
          f);
}

/* "a.b.c.d:port" into host (a buffer of size) and *port; 0 when malformed. */
static int split_address(const char *text, char *host, size_t size, int *port)
{
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= size || colon == text) return 0;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    char *end;
    long v = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || v < 0 || v > 65535) return 0;
    *port = (int)v;
    return 1;
}

static int number(const char *name, const char *text, double min, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || end == text || v < min) {
        fprintf(stderr, "sf_tcp_proxy: %s: '%s' is not a number >= %g\n", name, text, min);
        return 0;
    }
    *out = v;
    return 1;
}

int main(int argc, char **argv)
{
    const char *listen_text = NULL, *target_text = NULL, *ready_file = NULL;
    double delay = 0, rate_mbit = 0, buffer = 64.0 * 1024 * 1024, cut_after = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "sf_tcp_proxy: %s: unknown option or missing value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int ok = 1;
        if (strcmp(a, "--listen") == 0) listen_text = v;
        else if (strcmp(a, "--target") == 0) target_text = v;
        else if (strcmp(a, "--ready-file") == 0) ready_file = v;
        else if (strcmp(a, "--delay-ms") == 0) ok = number(a, v, 0, &delay);
        else if (strcmp(a, "--rate-mbit") == 0) ok = number(a, v, 0, &rate_mbit);
        else if (strcmp(a, "--buffer-bytes") == 0) ok = number(a, v, 65536, &buffer);
        else if (strcmp(a, "--cut-after-bytes") == 0) ok = number(a, v, 0, &cut_after);
        else {
            fprintf(stderr, "sf_tcp_proxy: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    char listen_host[64], target_host[64];
    int listen_port, target_port;
    if (!listen_text || !target_text || !split_address(listen_text, listen_host, sizeof listen_host, &listen_port) ||
        !split_address(target_text, target_host, sizeof target_host, &target_port) || target_port == 0) {
        fprintf(stderr, "sf_tcp_proxy: needs --listen ADDR:PORT and --target ADDR:PORT (numeric IPv4)\n");
        return 2;
    }
    /* the signals are blocked except while pausing, so none is lost between a check and pause */
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* the proxy's thread inherits the mask */

    struct in_addr check;
    if (inet_pton(AF_INET, listen_host, &check) != 1 || inet_pton(AF_INET, target_host, &check) != 1) {
        fprintf(stderr, "sf_tcp_proxy: addresses are numeric IPv4: %s, %s\n", listen_text, target_text);
        return 2;
    }
    tcp_proxy_options o = {.delay_ms = (int)delay, .rate = rate_mbit * 1e6 / 8, .listen_host = listen_host,
                           .listen_port = listen_port, .max_buffered = (size_t)buffer,
                           .cut_after_bytes = (unsigned long long)cut_after};
    tcp_proxy *p;
    if (tcp_proxy_start(target_host, target_port, &o, &p) != 0) {
        fprintf(stderr, "sf_tcp_proxy: cannot listen on %s: %s\n", listen_text, strerror(errno));
        return 1;
    }
    if (ready_file) {
        FILE *f = fopen(ready_file, "w");
        if (!f || fprintf(f, "%d\n", tcp_proxy_port(p)) < 0 || fclose(f) != 0) {
            fprintf(stderr, "sf_tcp_proxy: cannot write %s: %s\n", ready_file, strerror(errno));
            tcp_proxy_stop(p);
            return 1;
        }
    }
    while (!stop_signal) sigsuspend(&old);
    unsigned long long bytes[2];
    tcp_proxy_bytes(p, bytes);
    const int accepted = tcp_proxy_accepted(p);
    tcp_proxy_stop(p);
    printf("sf_tcp_proxy: %s -> %s: %d connections, %llu bytes forwarded, %llu bytes back\n", listen_text, target_text,
           accepted, bytes[0], bytes[1]);
    return 0;
}
