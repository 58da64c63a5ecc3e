/* The test TCP proxy (tcp_proxy.h). */
#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONN 32
#define CHUNK 65536
#define DEFAULT_BUFFERED (1 << 20)

typedef struct chunk {
    struct chunk *next;
    int64_t due_us;
    size_t len, off;
    uint8_t data[];
} chunk;

typedef struct direction { /* bytes read from `from`, to be written to `to` */
    int from, to;
    chunk *head, *tail;
    size_t buffered;
    double tokens;
    int64_t refill_us;
    int64_t next_us; /* throttled: write nothing before this time */
    int eof;
} direction;

typedef struct conn {
    int used;
    direction d[2];
} conn;

struct tcp_proxy {
    int listen_fd, port, wake[2];
    struct sockaddr_in target;
    tcp_proxy_options o;
    pthread_t thread;
    pthread_mutex_t lock;
    size_t max_buffered;
    int stop, cut, drop, accepted, cut_done;
    unsigned long long forwarded[2]; /* under lock */
    conn c[MAX_CONN];
};

static int64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void reset_close(int fd)
{
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

static void conn_close(conn *c, int reset)
{
    for (int k = 0; k < 2; k++) {
        while (c->d[k].head) {
            chunk *h = c->d[k].head;
            c->d[k].head = h->next;
            free(h);
        }
    }
    if (reset) reset_close(c->d[0].from), reset_close(c->d[0].to);
    else close(c->d[0].from), close(c->d[0].to);
    memset(c, 0, sizeof *c);
}

static void on_accept(tcp_proxy *p, int drop)
{
    int fd = accept(p->listen_fd, NULL, NULL);
    if (fd < 0) return;
    if (drop) {
        reset_close(fd);
        return;
    }
    conn *c = NULL;
    for (int i = 0; i < MAX_CONN && !c; i++)
        if (!p->c[i].used) c = &p->c[i];
    int up = c ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    if (up < 0 || connect(up, (struct sockaddr *)&p->target, sizeof p->target) != 0) {
        if (up >= 0) close(up);
        reset_close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    fcntl(up, F_SETFL, O_NONBLOCK);
    memset(c, 0, sizeof *c);
    c->used = 1;
    c->d[0].from = fd, c->d[0].to = up;
    c->d[1].from = up, c->d[1].to = fd;
    c->d[0].refill_us = c->d[1].refill_us = now_us();
    pthread_mutex_lock(&p->lock);
    p->accepted++;
    pthread_mutex_unlock(&p->lock);
}

/* Reads what fits; returns -1 when the connection is over. */
static int pump_in(tcp_proxy *p, direction *d)
{
    while (d->buffered < p->max_buffered && !d->eof) {
        chunk *ch = malloc(sizeof *ch + CHUNK);
        if (!ch) return 0;
        ssize_t r = read(d->from, ch->data, CHUNK);
        if (r <= 0) {
            free(ch);
            if (r == 0) d->eof = 1;
            else if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
            break;
        }
        ch->next = NULL, ch->len = (size_t)r, ch->off = 0;
        ch->due_us = now_us() + (int64_t)p->o.delay_ms * 1000;
        if (d->tail) d->tail->next = ch;
        else d->head = ch;
        d->tail = ch;
        d->buffered += (size_t)r;
    }
    return 0;
}

/* Writes what is due and allowed by the rate; returns the microseconds until more is due
 * (INT64_MAX: nothing pending), or -1 when the connection is over. */
static int64_t pump_out(tcp_proxy *p, direction *d, int j)
{
    const int64_t now = now_us();
    if (p->o.rate > 0) {
        d->tokens += p->o.rate * (double)(now - d->refill_us) / 1e6;
        if (d->tokens > CHUNK) d->tokens = CHUNK;
        d->refill_us = now;
    }
    while (d->head) {
        chunk *h = d->head;
        if (h->due_us > now) return h->due_us - now;
        size_t want = h->len - h->off;
        if (p->o.rate > 0) {
            /* whole slices of at least 4 KiB (or the rest of the chunk), not a trickle of bytes
             * that would keep the thread spinning */
            const double need = want < 4096 ? (double)want : 4096.0;
            if (d->tokens < need) {
                const int64_t wait = (int64_t)((need - d->tokens) / p->o.rate * 1e6) + 1;
                d->next_us = now + wait;
                return wait;
            }
            if (want > (size_t)d->tokens) want = (size_t)d->tokens;
        }
        ssize_t w = send(d->to, h->data + h->off, want, MSG_NOSIGNAL);
        if (w < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 1000 : -1;
        h->off += (size_t)w;
        d->buffered -= (size_t)w;
        pthread_mutex_lock(&p->lock);
        p->forwarded[j] += (unsigned long long)w;
        pthread_mutex_unlock(&p->lock);
        if (p->o.rate > 0) d->tokens -= (double)w;
        if (h->off == h->len) {
            d->head = h->next;
            if (!d->head) d->tail = NULL;
            free(h);
        }
    }
    if (d->eof) {
        shutdown(d->to, SHUT_WR);
        return -2; /* this direction is done */
    }
    return INT64_MAX;
}

static void *proxy_thread(void *arg)
{
    tcp_proxy *p = arg;
    struct pollfd fds[2 + 4 * MAX_CONN];
    int64_t wait_us = 100000;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const int stop = p->stop, cut = p->cut, drop = p->drop;
        p->cut = 0;
        pthread_mutex_unlock(&p->lock);
        if (stop) break;
        if (cut)
            for (int i = 0; i < MAX_CONN; i++)
                if (p->c[i].used) conn_close(&p->c[i], 1);
        int k = 0;
        fds[k++] = (struct pollfd){p->listen_fd, POLLIN, 0};
        fds[k++] = (struct pollfd){p->wake[0], POLLIN, 0};
        for (int i = 0; i < MAX_CONN; i++)
            for (int j = 0; j < 2; j++) {
                direction *d = &p->c[i].d[j];
                const int used = p->c[i].used;
                fds[k++] = (struct pollfd){used && d->buffered < p->max_buffered && !d->eof ? d->from : -1, POLLIN, 0};
                const int64_t t = now_us();
                fds[k++] = (struct pollfd){used && d->head && d->head->due_us <= t && d->next_us <= t ? d->to : -1, POLLOUT, 0};
            }
        int timeout = wait_us == INT64_MAX ? 100 : (int)((wait_us + 999) / 1000);
        if (timeout > 100) timeout = 100;
        poll(fds, (nfds_t)k, timeout);
        if (fds[1].revents & POLLIN) {
            char buf[64];
            if (read(p->wake[0], buf, sizeof buf) < 0) {}
        }
        if (fds[0].revents & POLLIN) on_accept(p, drop);
        wait_us = INT64_MAX;
        for (int i = 0; i < MAX_CONN; i++) {
            if (!p->c[i].used) continue;
            int over = 0, done = 0;
            for (int j = 0; j < 2 && !over; j++) {
                if (pump_in(p, &p->c[i].d[j]) < 0) over = 1;
                int64_t w = over ? -1 : pump_out(p, &p->c[i].d[j], j);
                if (w == -1) over = 1;
                else if (w == -2) done++;
                else if (w < wait_us) wait_us = w;
            }
            if (over) conn_close(&p->c[i], 1);
            else if (done == 2) conn_close(&p->c[i], 0);
        }
        if (p->o.cut_after_bytes && !p->cut_done) {
            pthread_mutex_lock(&p->lock);
            const unsigned long long total = p->forwarded[0] + p->forwarded[1];
            pthread_mutex_unlock(&p->lock);
            if (total >= p->o.cut_after_bytes) {
                p->cut_done = 1;
                for (int i = 0; i < MAX_CONN; i++)
                    if (p->c[i].used) conn_close(&p->c[i], 1);
            }
        }
    }
    for (int i = 0; i < MAX_CONN; i++)
        if (p->c[i].used) conn_close(&p->c[i], 1);
    return NULL;
}

int tcp_proxy_start(const char *target_host, int target_port, const tcp_proxy_options *o, tcp_proxy **out)
{
    *out = NULL;
    tcp_proxy *p = calloc(1, sizeof *p);
    if (!p) return -1;
    if (o) p->o = *o;
    p->max_buffered = p->o.max_buffered ? p->o.max_buffered : DEFAULT_BUFFERED;
    p->target.sin_family = AF_INET;
    p->target.sin_port = htons((uint16_t)target_port);
    if (inet_pton(AF_INET, target_host, &p->target.sin_addr) != 1) {
        free(p);
        errno = EINVAL;
        return -1;
    }
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)p->o.listen_port);
    if (p->o.listen_host && inet_pton(AF_INET, p->o.listen_host, &a.sin_addr) != 1) {
        if (p->listen_fd >= 0) close(p->listen_fd);
        free(p);
        errno = EINVAL;
        return -1;
    }
    const int one = 1;
    if (p->listen_fd >= 0) setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof a;
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(p->listen_fd, 16) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0 || pipe(p->wake) != 0) {
        if (p->listen_fd >= 0) close(p->listen_fd);
        free(p);
        return -1;
    }
    p->port = ntohs(a.sin_port);
    fcntl(p->wake[0], F_SETFL, O_NONBLOCK);
    pthread_mutex_init(&p->lock, NULL);
    if (pthread_create(&p->thread, NULL, proxy_thread, p) != 0) {
        close(p->listen_fd), close(p->wake[0]), close(p->wake[1]);
        free(p);
        return -1;
    }
    *out = p;
    return 0;
}

int tcp_proxy_port(const tcp_proxy *p) { return p->port; }

static void poke(tcp_proxy *p)
{
    if (write(p->wake[1], "x", 1) < 0) {}
}

void tcp_proxy_cut(tcp_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    p->cut = 1;
    pthread_mutex_unlock(&p->lock);
    poke(p);
}

void tcp_proxy_set_drop(tcp_proxy *p, int drop)
{
    pthread_mutex_lock(&p->lock);
    p->drop = drop;
    pthread_mutex_unlock(&p->lock);
    poke(p);
}

int tcp_proxy_accepted(tcp_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    int n = p->accepted;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void tcp_proxy_bytes(tcp_proxy *p, unsigned long long out[2])
{
    pthread_mutex_lock(&p->lock);
    out[0] = p->forwarded[0], out[1] = p->forwarded[1];
    pthread_mutex_unlock(&p->lock);
}

void tcp_proxy_stop(tcp_proxy *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_mutex_unlock(&p->lock);
    poke(p);
    pthread_join(p->thread, NULL);
    close(p->listen_fd), close(p->wake[0]), close(p->wake[1]);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
