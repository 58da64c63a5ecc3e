/* The network communicator (pipeline/comm_net.h): three sf_net in one process (TCP loopback
 * and ipc, CURVE keys), three communicators driven by three threads. Point-to-point messages
 * of many sizes in a ring; tagged messages over a lossy (int8 + lz4) data link, whose error
 * feedback keeps each tag's running sum within one message's rounding, and exact ones that
 * stay bit for bit; collectives bit-identical on every rank; a peer that never sends or takes
 * nothing, a watched flag raised, a peer that aborts, one that goes silent (the only one that
 * sets lost_peer) and one that leaves: every wait ends, naming the peer. A group over two of the
 * three nets, its ranks in another order than theirs: sums, broadcast and messages. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "compress/quantize.h"
#include "pipeline/comm_net.h"
#include "pipeline/net.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

#define R 3
#define BASE 0x5E000000u

static char pub[R][41], sec[R][41];

/* check_report is not thread-safe: the ranks' threads check under this lock */
static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;
#define TCHECKF(cond, ...)                                                                                             \
    do {                                                                                                               \
        pthread_mutex_lock(&check_lock);                                                                               \
        CHECKF(cond, __VA_ARGS__);                                                                                     \
        pthread_mutex_unlock(&check_lock);                                                                             \
    } while (0)
#define TCHECK_OK(expr)                                                                                                \
    do {                                                                                                               \
        const int tcheck_rc_ = (expr);                                                                                 \
        pthread_mutex_lock(&check_lock);                                                                               \
        CHECK_OK(tcheck_rc_);                                                                                          \
        pthread_mutex_unlock(&check_lock);                                                                             \
    } while (0)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

typedef struct trio {
    char ep[R][128];
    sf_net *net[R];
    sf_comm *comm[R];
} trio;

/* Three processes' sf_net, each knowing the other two (CURVE); small heartbeat and timeout. */
static int make_trio(trio *t, int ipc, int net_timeout_ms)
{
    static int serial;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < R; i++) {
        char name[64];
        snprintf(name, sizeof name, "comm-net-%d-%d.sock", serial, i);
        if (ipc)
            snprintf(t->ep[i], sizeof t->ep[i], "ipc://%s", check_tmp_path(name));
        else
            snprintf(t->ep[i], sizeof t->ep[i], "tcp://127.0.0.1:%d", check_free_port());
    }
    serial++;
    int rc = SF_OK;
    for (int i = 0; i < R && rc == SF_OK; i++) {
        sf_net_peer peers[R - 1];
        for (int j = 0, k = 0; j < R; j++)
            if (j != i) peers[k++] = (sf_net_peer){j, t->ep[j], pub[j], "loopback"};
        sf_net_options o = {0};
        o.rank = i, o.bind = t->ep[i];
        o.secret_key = sec[i], o.public_key = pub[i];
        o.peers = peers, o.n_peers = R - 1;
        o.heartbeat_ms = 100, o.timeout_ms = net_timeout_ms, o.connect_timeout_ms = 2000, o.linger_ms = 200;
        rc = sf_net_create(&o, &t->net[i]);
    }
    return rc;
}

static int make_comms(trio *t, uint32_t base, sf_comm_net_options_fn options, const int timeout_ms[R])
{
    int rc = SF_OK;
    for (int i = 0; i < R && rc == SF_OK; i++)
        rc = sf_comm_net_create(t->net[i], i, R, base, options, NULL, timeout_ms[i], &t->comm[i]);
    return rc;
}

static void free_trio(trio *t)
{
    for (int i = 0; i < R; i++) sf_comm_free(t->comm[i]), t->comm[i] = NULL;
    for (int i = 0; i < R; i++) sf_net_free(t->net[i]), t->net[i] = NULL;
}

typedef struct rank_arg {
    trio *t;
    int rank;
    void (*fn)(struct rank_arg *);
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    a->fn(a);
    return NULL;
}

/* fn on every rank, each on its own thread, with its own communicator */
static void run3(trio *t, void (*fn)(rank_arg *))
{
    pthread_t th[R];
    rank_arg a[R];
    for (int r = 0; r < R; r++) {
        a[r] = (rank_arg){t, r, fn};
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
}

/* The values of message (who, k) of `count` elements: normal draws, as float32 or bf16. */
static void *values(int who, int k, size_t count, sf_dtype type)
{
    check_rng g = {(uint64_t)who * 1000003u + (uint64_t)k * 7919u + count + 1};
    float *x = malloc((count ? count : 1) * sizeof *x);
    check_fill_normal(&g, x, count, 2.0);
    if (type == SF_DTYPE_F32) return x;
    uint16_t *b = malloc((count ? count : 1) * sizeof *b);
    for (size_t i = 0; i < count; i++) b[i] = check_bf16_bits(x[i]);
    free(x);
    return b;
}

/* ---- a ring of point-to-point messages, lossless ------------------------------------------ */

static const size_t ring_counts[] = {0, 1, 3, 1000, 70001};

static void ring_rank(rank_arg *a)
{
    sf_comm *c = a->t->comm[a->rank];
    const int next = (a->rank + 1) % R, prev = (a->rank + R - 1) % R;
    int good = 0, total = 0;
    for (size_t ci = 0; ci < sizeof ring_counts / sizeof ring_counts[0]; ci++) {
        for (int ti = 0; ti < 2; ti++) {
            const size_t count = ring_counts[ci];
            const sf_dtype type = ti ? SF_DTYPE_BF16 : SF_DTYPE_F32;
            const size_t bytes = count * sf_dtype_size(type);
            /* three plain sends, then an exact and an inexact tagged one: all before any receive */
            for (int k = 0; k < 5; k++) {
                void *x = values(a->rank, k, count, type);
                if (k < 3)
                    TCHECK_OK(sf_comm_send(c, x, count, type, next));
                else
                    TCHECK_OK(sf_comm_send_tagged(c, x, count, type, next, 40 + (uint64_t)k, k == 3));
                free(x);
            }
            /* the exact one first: order is per (peer, exactness) */
            static const int order[] = {3, 0, 1, 2, 4};
            for (int j = 0; j < 5; j++) {
                const int k = order[j];
                void *want = values(prev, k, count, type), *got = malloc(bytes ? bytes : 1);
                int rc = k < 3 ? sf_comm_recv(c, got, count, type, prev)
                               : sf_comm_recv_tagged(c, got, count, type, prev, k == 3);
                TCHECK_OK(rc);
                good += rc == SF_OK && memcmp(want, got, bytes) == 0;
                total++;
                free(want), free(got);
            }
        }
    }
    TCHECKF(good == total, "rank %d: %d of %d messages from rank %d bit for bit", a->rank, good, total, prev);
}

static void ring(void)
{
    trio t;
    static const int timeouts[R] = {5000, 5000, 5000};
    CHECK_OK(make_trio(&t, 0, 3000));
    CHECK_OK(make_comms(&t, BASE, NULL, timeouts));
    if (t.comm[R - 1]) run3(&t, ring_rank);
    /* arguments refused before anything travels */
    float x = 1;
    if (t.comm[0]) {
        CHECK(sf_comm_send(t.comm[0], &x, 1, SF_DTYPE_F32, 0) == SF_E_INVAL);
        CHECK(sf_comm_recv(t.comm[0], &x, 1, SF_DTYPE_F32, 3) == SF_E_INVAL);
        CHECK_OK(sf_comm_wait(t.comm[0]));
    }
    sf_comm *bad = NULL;
    CHECK(sf_comm_net_create(t.net[0], 1, R, BASE, NULL, NULL, 1000, &bad) == SF_E_INVAL && !bad);
    CHECK(sf_comm_net_create(t.net[0], 0, 4, BASE, NULL, NULL, 1000, &bad) == SF_E_INVAL && !bad);
    CHECK(sf_comm_net_create(t.net[0], 0, R, UINT32_MAX - 1, NULL, NULL, 1000, &bad) == SF_E_INVAL && !bad);
    free_trio(&t);
}

/* ---- a group over some of the net's ranks ------------------------------------------------ */

/* The communicator of net ranks {2, 0} (rank 1 not in it): its rank 0 is net rank 2. */
static const int group_ranks[2] = {2, 0};

static void group_rank(rank_arg *a)
{
    if (a->rank == 1) return;
    const int me = a->rank == 2 ? 0 : 1;
    sf_comm *c = a->t->comm[a->rank];
    float sum[3] = {me ? 1.5f : 10.0f, me ? 2.5f : 20.0f, 3.0f}, got = me ? 7.0f : 0.0f, in = -1, out = (float)(me + 40);
    TCHECK_OK(sf_comm_all_reduce(c, sum, 3, SF_DTYPE_F32));
    TCHECKF(sum[0] == 11.5f && sum[1] == 22.5f && sum[2] == 6.0f, "group rank %d: sums %g %g %g", me, sum[0], sum[1],
            sum[2]);
    TCHECK_OK(sf_comm_broadcast(c, &got, 1, SF_DTYPE_F32, 1));
    TCHECKF(got == 7.0f, "group rank %d: broadcast from rank 1 (net rank 0) gave %g", me, got);
    TCHECK_OK(sf_comm_send(c, &out, 1, SF_DTYPE_F32, 1 - me));
    TCHECK_OK(sf_comm_recv(c, &in, 1, SF_DTYPE_F32, 1 - me));
    TCHECKF(in == (float)(1 - me + 40), "group rank %d: received %g from rank %d", me, in, 1 - me);
}

static void group(void)
{
    trio t;
    CHECK_OK(make_trio(&t, 1, 3000));
    int rc = SF_OK;
    for (int i = 0; i < R && rc == SF_OK; i++)
        if (i != 1) rc = sf_comm_net_create_group(t.net[i], group_ranks, 2, i == 2 ? 0 : 1, BASE + 96, NULL, NULL, 5000,
                                                  &t.comm[i]);
    CHECK_OK(rc);
    if (rc == SF_OK) run3(&t, group_rank);
    /* refused: a rank twice, this process's own rank elsewhere than at `rank`, a rank not a peer */
    sf_comm *bad = NULL;
    static const int twice[2] = {2, 2}, unknown[2] = {0, 7};
    CHECK(sf_comm_net_create_group(t.net[0], twice, 2, 0, BASE + 96, NULL, NULL, 1000, &bad) == SF_E_INVAL && !bad);
    CHECK(sf_comm_net_create_group(t.net[0], group_ranks, 2, 0, BASE + 96, NULL, NULL, 1000, &bad) == SF_E_INVAL && !bad);
    CHECK(sf_comm_net_create_group(t.net[0], unknown, 2, 0, BASE + 96, NULL, NULL, 1000, &bad) == SF_E_INVAL && !bad);
    free_trio(&t);
}

/* ---- tags over a lossy data link --------------------------------------------------------- */

static int lossy_options(void *user, int peer, sf_link_options *o)
{
    (void)user, (void)peer;
    o->codec = SF_CODEC_LZ4, o->quant = SF_QUANT_INT8; /* error feedback on: the default */
    return SF_OK;
}

#define LOSSY_N 512
#define LOSSY_K 24

/* What rank 0 sends rank 1: tag 7 alone K times; tags 11 and 12 interleaved K times each;
 * exact messages (tag 13) among them; a NaN refused on the lossy link; bf16 values. */
static void lossy_rank(rank_arg *a)
{
    sf_comm *c = a->t->comm[a->rank];
    float *v = values(7, 0, LOSSY_N, SF_DTYPE_F32), *u = values(11, 0, LOSSY_N, SF_DTYPE_F32),
          *w = values(12, 0, LOSSY_N, SF_DTYPE_F32), *z = values(13, 0, LOSSY_N, SF_DTYPE_F32);
    z[0] = 1e-40f, z[1] = -0.0f, z[2] = 3.0e38f, z[3] = INFINITY; /* subnormal, signed zero, huge, infinite */
    uint16_t *h = values(14, 0, LOSSY_N, SF_DTYPE_BF16);
    if (a->rank == 0) {
        for (int k = 0; k < LOSSY_K; k++) TCHECK_OK(sf_comm_send_tagged(c, v, LOSSY_N, SF_DTYPE_F32, 1, 7, 0));
        for (int k = 0; k < LOSSY_K; k++) {
            TCHECK_OK(sf_comm_send_tagged(c, u, LOSSY_N, SF_DTYPE_F32, 1, 11, 0));
            if (k % 8 == 0) TCHECK_OK(sf_comm_send_tagged(c, z, LOSSY_N, SF_DTYPE_F32, 1, 13, 1));
            TCHECK_OK(sf_comm_send_tagged(c, w, LOSSY_N, SF_DTYPE_F32, 1, 12, 0));
        }
        float nan = v[0];
        v[0] = NAN;
        int rc = sf_comm_send_tagged(c, v, LOSSY_N, SF_DTYPE_F32, 1, 7, 0);
        TCHECKF(rc == SF_E_INVAL && strstr(sf_last_error(), "finite"), "a NaN on the lossy link: %d %s", rc,
                sf_last_error());
        v[0] = nan;
        TCHECK_OK(sf_comm_send_tagged(c, h, LOSSY_N, SF_DTYPE_BF16, 1, 14, 0));
    } else if (a->rank == 1) {
        const sf_quant_params qp = {SF_QUANT_INT8, LOSSY_N};
        float got[LOSSY_N];
        /* tag 7: the running sum against K v; the first message's own rounding */
        double sum[LOSSY_N] = {0}, first = 0, err = 0;
        for (int k = 0; k < LOSSY_K; k++) {
            TCHECK_OK(sf_comm_recv_tagged(c, got, LOSSY_N, SF_DTYPE_F32, 0, 0));
            for (int i = 0; i < LOSSY_N; i++) {
                sum[i] += got[i];
                if (k == 0) first = fmax(first, fabs((double)got[i] - v[i]));
            }
        }
        double vmax = 0;
        for (int i = 0; i < LOSSY_N; i++)
            err = fmax(err, fabs(sum[i] - (double)LOSSY_K * v[i])), vmax = fmax(vmax, fabsf(v[i]));
        /* one message's bound, its scale grown by what the residual adds (half a step), and
         * float32 rounding of the residual once a message */
        const double bound = sf_quant_error_bound(&qp, v, LOSSY_N) * 1.01 + LOSSY_K * vmax * 0x1p-22;
        TCHECKF(first > 0 && LOSSY_K * first > 4 * bound,
                "the link is not lossy enough to tell (first message off by %g)", first);
        TCHECKF(err <= bound, "tag 7: the sum of %d messages is off by %g, beyond one message's rounding %g", LOSSY_K,
                err, bound);
        printf("test_comm_net: tag 7: one message off by %.3g, the sum of %d by %.3g (bound %.3g)\n", first, LOSSY_K,
               err, bound);
        /* tags 11 and 12 interleaved, each its own feedback; each exact one read before the
         * inexact one sent ahead of it (order is per exactness) */
        float exact[LOSSY_N];
        int identical = 0;
        double su[LOSSY_N] = {0}, sw[LOSSY_N] = {0}, eu = 0, ew = 0;
        for (int k = 0; k < LOSSY_K; k++) {
            if (k % 8 == 0) {
                TCHECK_OK(sf_comm_recv_tagged(c, exact, LOSSY_N, SF_DTYPE_F32, 0, 1));
                identical += memcmp(exact, z, sizeof exact) == 0;
            }
            TCHECK_OK(sf_comm_recv_tagged(c, got, LOSSY_N, SF_DTYPE_F32, 0, 0));
            for (int i = 0; i < LOSSY_N; i++) su[i] += got[i];
            TCHECK_OK(sf_comm_recv_tagged(c, got, LOSSY_N, SF_DTYPE_F32, 0, 0));
            for (int i = 0; i < LOSSY_N; i++) sw[i] += got[i];
        }
        double umax = 0, wmax = 0;
        for (int i = 0; i < LOSSY_N; i++) {
            eu = fmax(eu, fabs(su[i] - (double)LOSSY_K * u[i])), ew = fmax(ew, fabs(sw[i] - (double)LOSSY_K * w[i]));
            umax = fmax(umax, fabsf(u[i])), wmax = fmax(wmax, fabsf(w[i]));
        }
        const double bu = sf_quant_error_bound(&qp, u, LOSSY_N) * 1.01 + LOSSY_K * umax * 0x1p-22,
                     bw = sf_quant_error_bound(&qp, w, LOSSY_N) * 1.01 + LOSSY_K * wmax * 0x1p-22;
        TCHECKF(identical == LOSSY_K / 8, "%d of %d exact messages bit for bit on the lossy link", identical,
                LOSSY_K / 8);
        TCHECKF(eu <= bu && ew <= bw, "interleaved tags: sums off by %g (bound %g) and %g (bound %g)", eu, bu, ew, bw);
        printf("test_comm_net: tags 11, 12 interleaved: sums off by %.3g, %.3g (bounds %.3g, %.3g)\n", eu, ew, bu, bw);
        uint16_t hb[LOSSY_N];
        TCHECK_OK(sf_comm_recv_tagged(c, hb, LOSSY_N, SF_DTYPE_BF16, 0, 0));
        TCHECKF(memcmp(hb, h, sizeof hb) == 0, "bf16 values on the lossy link not bit for bit");
    }
    free(v), free(u), free(w), free(z), free(h);
}

static void lossy(void)
{
    trio t;
    static const int timeouts[R] = {5000, 5000, 5000};
    CHECK_OK(make_trio(&t, 0, 3000));
    CHECK_OK(make_comms(&t, BASE + 16, lossy_options, timeouts));
    if (t.comm[R - 1]) run3(&t, lossy_rank);
    free_trio(&t);
}

/* ---- collectives: bit-identical on every rank -------------------------------------------- */

static void collectives_rank(rank_arg *a)
{
    sf_comm *c = a->t->comm[a->rank];
    const int me = a->rank;
    for (int round = 0; round < 3; round++) {
        const size_t n = round == 2 ? 0 : 1001 + (size_t)round * 77;
        /* all_reduce, float32: rank order 0, 1, 2 in float32 */
        float *x = values(me, 100 + round, n, SF_DTYPE_F32), *want = values(0, 100 + round, n, SF_DTYPE_F32);
        for (int r = 1; r < R; r++) {
            float *y = values(r, 100 + round, n, SF_DTYPE_F32);
            for (size_t i = 0; i < n; i++) want[i] += y[i];
            free(y);
        }
        int ticket = -1;
        int rc = round == 1 ? sf_comm_all_reduce_start(c, x, n, SF_DTYPE_F32, &ticket)
                            : sf_comm_all_reduce(c, x, n, SF_DTYPE_F32);
        TCHECK_OK(rc);
        if (round == 1) TCHECK_OK(sf_comm_join(c, ticket));
        TCHECKF(memcmp(x, want, n * 4) == 0, "rank %d round %d: float32 all_reduce not the rank-order sum bit for bit",
                me, round);
        free(x), free(want);
        /* all_reduce, bf16: summed in float32, rounded once */
        uint16_t *b = values(me, 200 + round, n, SF_DTYPE_BF16);
        float *acc = calloc(n + 1, sizeof *acc);
        for (int r = 0; r < R; r++) {
            uint16_t *y = values(r, 200 + round, n, SF_DTYPE_BF16);
            for (size_t i = 0; i < n; i++) acc[i] = r ? acc[i] + check_bf16_float(y[i]) : check_bf16_float(y[i]);
            free(y);
        }
        TCHECK_OK(sf_comm_all_reduce(c, b, n, SF_DTYPE_BF16));
        size_t same = 0;
        for (size_t i = 0; i < n; i++) same += b[i] == check_bf16_bits(acc[i]);
        TCHECKF(same == n, "rank %d round %d: bf16 all_reduce %zu of %zu", me, round, same, n);
        free(b), free(acc);
        /* all_gather, float32 from its own buffer, bf16 in place */
        const size_t g = n / 3 + 1;
        float *mine = values(me, 300 + round, g, SF_DTYPE_F32), *all = malloc(R * g * 4);
        TCHECK_OK(sf_comm_all_gather(c, mine, all, g, SF_DTYPE_F32));
        int gathered = 0;
        for (int r = 0; r < R; r++) {
            float *y = values(r, 300 + round, g, SF_DTYPE_F32);
            gathered += memcmp(all + (size_t)r * g, y, g * 4) == 0;
            free(y);
        }
        TCHECKF(gathered == R, "rank %d: all_gather %d of %d slices", me, gathered, R);
        uint16_t *hall = malloc(R * g * 2), *hm = values(me, 400 + round, g, SF_DTYPE_BF16);
        memcpy(hall + (size_t)me * g, hm, g * 2);
        TCHECK_OK(sf_comm_all_gather(c, hall + (size_t)me * g, hall, g, SF_DTYPE_BF16));
        gathered = 0;
        for (int r = 0; r < R; r++) {
            uint16_t *y = values(r, 400 + round, g, SF_DTYPE_BF16);
            gathered += memcmp(hall + (size_t)r * g, y, g * 2) == 0;
            free(y);
        }
        TCHECKF(gathered == R, "rank %d: in-place bf16 all_gather %d of %d slices", me, gathered, R);
        free(mine), free(all), free(hall), free(hm);
        /* broadcast from each root */
        for (int root = 0; root < R; root++) {
            float *y = me == root ? values(root, 500 + round, n, SF_DTYPE_F32) : calloc(n + 1, 4);
            float *ref = values(root, 500 + round, n, SF_DTYPE_F32);
            TCHECK_OK(sf_comm_broadcast(c, y, n, SF_DTYPE_F32, root));
            TCHECKF(memcmp(y, ref, n * 4) == 0, "rank %d: broadcast from %d", me, root);
            free(y), free(ref);
        }
    }
    TCHECK_OK(sf_comm_fence(c));
    /* the ranks disagree on the count: every rank's all_reduce fails, rank 0's naming both */
    float y[12] = {0};
    const double t0 = now_s();
    int rc = sf_comm_all_reduce(c, y, me == 2 ? 11 : 10, SF_DTYPE_F32);
    const double took = now_s() - t0;
    TCHECKF(rc == SF_E_COMM && took < 6, "rank %d: mismatched all_reduce: %d after %.2f s (%s)", me, rc, took,
            sf_last_error());
    if (me == 0)
        TCHECKF(strstr(sf_last_error(), "rank 2 sent 11 float32 values, 10 float32 expected"), "rank 0: %s",
                sf_last_error());
    else
        TCHECKF(strstr(sf_last_error(), "aborted by rank 0"), "rank %d: %s", me, sf_last_error());
    rc = sf_comm_broadcast(c, y, 1, SF_DTYPE_F32, 0);
    TCHECKF(rc == SF_E_COMM && strstr(sf_last_error(), "failed earlier"), "rank %d: after a failure: %s", me,
            sf_last_error());
}

static void collectives(void)
{
    trio t;
    static const int timeouts[R] = {5000, 5000, 5000};
    CHECK_OK(make_trio(&t, 1, 3000));
    /* the data links lossy: collectives do not use them */
    CHECK_OK(make_comms(&t, BASE + 32, lossy_options, timeouts));
    if (t.comm[R - 1]) run3(&t, collectives_rank);
    free_trio(&t);
}

/* ---- failures ----------------------------------------------------------------------------- */

/* Rank 1 waits for rank 2, who never sends (timeout 500 ms); rank 0, waiting for rank 1 with a
 * long timeout, learns at once why. */
static int silent_exchanged;

static void silent_rank(rank_arg *a)
{
    sf_comm *c = a->t->comm[a->rank];
    float x[4] = {1, 2, 3, 4}, y[4];
    if (a->rank == 2) return;
    const int other = 1 - a->rank;
    TCHECK_OK(sf_comm_send(c, x, 4, SF_DTYPE_F32, other));
    TCHECK_OK(sf_comm_recv(c, y, 4, SF_DTYPE_F32, other));
    /* rank 1's failure aborts its links, dropping what rank 0 has not taken: after the exchange */
    if (a->rank == 0) __atomic_store_n(&silent_exchanged, 1, __ATOMIC_RELEASE);
    for (int k = 0; k < 500 && !__atomic_load_n(&silent_exchanged, __ATOMIC_ACQUIRE); k++) usleep(10000);
    const double t0 = now_s();
    int rc = sf_comm_recv(c, y, 4, SF_DTYPE_F32, a->rank == 1 ? 2 : 1);
    const double took = now_s() - t0;
    if (a->rank == 1) {
        TCHECKF(rc == SF_E_COMM && strstr(sf_last_error(), "nothing from rank 2 within 500 ms") && took >= 0.45 &&
                    took < 6,
                "rank 1's wait for silent rank 2: %d after %.2f s (%s)", rc, took, sf_last_error());
        rc = sf_comm_send(c, x, 4, SF_DTYPE_F32, 0);
        TCHECKF(rc == SF_E_COMM && strstr(sf_last_error(), "failed earlier"), "after the timeout: %d %s", rc,
                sf_last_error());
    } else {
        TCHECKF(rc == SF_E_COMM && strstr(sf_last_error(), "aborted by rank 1") &&
                    strstr(sf_last_error(), "nothing from rank 2") && took < 6,
                "rank 0 after rank 1 timed out: %d after %.2f s (%s)", rc, took, sf_last_error());
    }
}

static void silent(void)
{
    trio t;
    static const int timeouts[R] = {10000, 500, 10000};
    CHECK_OK(make_trio(&t, 1, 3000));
    CHECK_OK(make_comms(&t, BASE + 48, NULL, timeouts));
    if (t.comm[R - 1]) run3(&t, silent_rank);
    free_trio(&t);
}

/* Rank 0 sends rank 2, who takes nothing, more than a window (8): the ninth send fails after
 * the timeout (400 ms). Rank 1 waits for rank 2 with a flag watched (sf_comm_watch) that rank 2
 * raises: the wait ends then. */
static int stop_flag;

static void stuck_rank(rank_arg *a)
{
    sf_comm *c = a->t->comm[a->rank];
    float x[16] = {0};
    if (a->rank == 2) {
        usleep(200000);
        __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
        return;
    }
    const double t0 = now_s();
    int rc = SF_OK, sent = 0;
    if (a->rank == 0)
        for (int k = 0; k < 9 && rc == SF_OK; k++) {
            rc = sf_comm_send(c, x, 16, SF_DTYPE_F32, 2);
            sent += rc == SF_OK;
        }
    else
        rc = sf_comm_recv(c, x, 16, SF_DTYPE_F32, 2);
    const double took = now_s() - t0;
    if (a->rank == 0)
        TCHECKF(sent == 8 && rc == SF_E_COMM && strstr(sf_last_error(), "no credit within 400 ms") && took >= 0.35 &&
                    took < 6,
                "a full window: %d sent, then %d after %.2f s (%s)", sent, rc, took, sf_last_error());
    else
        TCHECKF(rc == SF_E_COMM && strstr(sf_last_error(), "stopped") && took >= 0.15 && took < 6,
                "the watched flag: %d after %.2f s (%s)", rc, took, sf_last_error());
}

static void stuck(void)
{
    trio t;
    static const int timeouts[R] = {400, 10000, 10000};
    CHECK_OK(make_trio(&t, 0, 3000));
    CHECK_OK(make_comms(&t, BASE + 80, NULL, timeouts));
    stop_flag = 0;
    if (t.comm[1]) sf_comm_watch(t.comm[1], &stop_flag);
    if (t.comm[R - 1]) run3(&t, stuck_rank);
    const double t0 = now_s();
    free_trio(&t);
    CHECKF(now_s() - t0 < 6, "freeing the communicators took %.2f s", now_s() - t0);
}

/* How rank 2 leaves after one exchange with rank 0: its communicator aborted, its sf_net frozen
 * (a stopped process: silent), or its communicator and sf_net freed. */
static int dead_how, dead_exchanged;

static void dead_rank(rank_arg *a)
{
    trio *t = a->t;
    sf_comm *c = t->comm[a->rank];
    float x[4] = {1, 2, 3, 4}, y[4];
    if (a->rank == 1) return;
    const int other = 2 - a->rank;
    TCHECK_OK(sf_comm_send(c, x, 4, SF_DTYPE_F32, other));
    TCHECK_OK(sf_comm_recv(c, y, 4, SF_DTYPE_F32, other));
    if (a->rank == 2) {
        /* an abort drops what the peer has not taken yet: rank 0 must have had its message */
        for (int k = 0; k < 500 && !__atomic_load_n(&dead_exchanged, __ATOMIC_ACQUIRE); k++) usleep(10000);
        usleep(50000); /* rank 0 is waiting by now */
        if (dead_how == 0) sf_comm_abort(c, "injected failure");
        if (dead_how == 1) sf_net_test_freeze(t->net[2], 1);
        if (dead_how == 2) {
            sf_comm_free(c), t->comm[2] = NULL;
            sf_net_free(t->net[2]), t->net[2] = NULL;
        }
        return;
    }
    __atomic_store_n(&dead_exchanged, 1, __ATOMIC_RELEASE);
    const double t0 = now_s();
    int rc = sf_comm_recv(c, y, 4, SF_DTYPE_F32, 2);
    const double took = now_s() - t0;
    static const char *what[] = {"aborted by rank 2", "rank 2 (host loopback) stopped answering",
                                 "rank 2 closed its communicator"};
    /* the net declares a silent peer dead after 1200 ms (heartbeats every 100) */
    const double limit = dead_how == 1 ? 5.0 : 4.0;
    TCHECKF(rc == SF_E_COMM && strstr(sf_last_error(), what[dead_how]) && took < limit,
            "rank 0 when rank 2 left (%d): %d after %.2f s (%s)", dead_how, rc, took, sf_last_error());
    if (dead_how == 0)
        TCHECKF(strstr(sf_last_error(), "injected failure"), "the reason did not travel: %s", sf_last_error());
    /* only the network's verdict (a silent peer) counts as a peer lost: a job may roll back */
    TCHECKF((__atomic_load_n(&c->lost_peer, __ATOMIC_ACQUIRE) != 0) == (dead_how == 1),
            "rank 2 left (%d): lost_peer is %d", dead_how, c->lost_peer);
    printf("test_comm_net: peer gone (%s): recv failed after %.2f s: %s\n", what[dead_how], took, sf_last_error());
}

static void dead(void)
{
    for (dead_how = 0; dead_how < 3; dead_how++) {
        dead_exchanged = 0;
        trio t;
        static const int timeouts[R] = {10000, 10000, 10000};
        CHECK_OK(make_trio(&t, dead_how == 1, 1200));
        CHECK_OK(make_comms(&t, BASE + 64, NULL, timeouts));
        if (t.comm[R - 1]) run3(&t, dead_rank);
        if (dead_how == 1) { /* the stopped process resumes, learns it was given up, and goes */
            sf_comm_abort(t.comm[2], "resumed after being declared dead");
            sf_net_test_freeze(t.net[2], 0);
        }
        const double t0 = now_s();
        free_trio(&t);
        CHECKF(now_s() - t0 < 6, "freeing the communicators after rank 2 left (%d) took %.2f s", dead_how,
               now_s() - t0);
    }
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {{"ring", ring},     {"group", group}, {"lossy", lossy}, {"collectives", collectives},
                 {"silent", silent}, {"stuck", stuck}, {"dead", dead}};
    for (int i = 0; i < R; i++) CHECK_OK(sf_net_keypair(pub[i], sec[i]));
    alarm(60); /* a hang fails */
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++) run |= strcmp(argv[a], parts[k].name) == 0;
        if (!run) continue;
        const double t0 = now_s();
        parts[k].run();
        printf("test_comm_net: %s %.1f s\n", parts[k].name, now_s() - t0);
    }
    return check_finish("test_comm_net");
}
