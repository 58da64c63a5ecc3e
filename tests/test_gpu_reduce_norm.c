/* The ranks' sums that also norm the rows (kernels/comm.h, reduce_norm) on GPUs with the NCCL
 * communicator, as the head-parallel block issues them (stages/block_sums.c):
 *  - one rank (one GPU): the sum, then the add and the norm in one pass, bit for bit the
 *    backend's add_typed then rmsnorm_typed (bf16) on the same rows, for row widths the one-pass
 *    kernel takes (1024, 2048) and one it does not (1000: the composition);
 *  - two GPUs (threads of this process), two segments: each starts from rank 0's rows
 *    (first_rows; rank 1 holds other rows before it), then, in two chunks of rows, each chunk's
 *    sum with a norm, then each chunk's last sum without one (the end of a segment). With the
 *    copy engines the sums are split over the ranks (split 1 where the GPUs have peer access):
 *    rank 0's rows after the last sums are bit for bit the host's float32 sums in rank order;
 *    through NCCL (allow 0) every rank's rows are, within bf16 rounding of the sums. Both ranks'
 *    normed rows, after first_rows and after the first sums, are identical and within one bf16
 *    rounding of the host's norm of the rows.
 * Without a GPU this prints "skipped: no GPU" and exits 77; without NCCL, likewise. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "kernels/comm.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"

#define EPS 1e-6f

/* rank r's part of op k, the rows before, the norm's weights */
static float part_value(int r, int k, size_t i) { return (float)((int)((i * 7 + r * 13 + k * 5) % 97) - 48) / 64.0f; }
static float row_value(size_t i) { return (float)((int)(i % 41) - 20) * 0.25f; }
static float weight_value(size_t j) { return 0.5f + (float)(j % 7) * 0.125f; }

static void *dev_upload(sf_backend *be, const void *host, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes);
    CHECK(d != NULL);
    if (d && host) CHECK_OK(be->ops->upload(be, d, host, bytes));
    return d;
}

static uint16_t *bf16_of(size_t count, float (*f)(int, int, size_t), int r, int k)
{
    uint16_t *h = malloc(count * 2 + 2);
    for (size_t i = 0; i < count; i++) h[i] = check_bf16_bits(f(r, k, i));
    return h;
}

/* ---- one rank --------------------------------------------------------------------------------- */

static void check_one_rank(int rows, int dim)
{
    sf_backend *be = NULL;
    CHECK_OK(sf_backend_create_ex("cuda", 0, SF_PRECISION_BF16, &be));
    if (!be) return;
    unsigned char id[SF_COMM_NCCL_ID_BYTES];
    CHECK_OK(sf_comm_nccl_unique_id(id));
    sf_comm *c = NULL;
    CHECK_OK(sf_comm_nccl_create(be, id, 0, 1, 10000, &c));
    const size_t n = (size_t)rows * dim;
    float *hx = malloc(n * 4), *hw = malloc((size_t)dim * 4);
    for (size_t i = 0; i < n; i++) hx[i] = row_value(i);
    for (int j = 0; j < dim; j++) hw[j] = weight_value((size_t)j);
    uint16_t *hp = bf16_of(n, part_value, 0, 0);
    float *x = dev_upload(be, hx, n * 4), *x2 = dev_upload(be, hx, n * 4), *w = dev_upload(be, hw, (size_t)dim * 4);
    void *p = dev_upload(be, hp, n * 2), *p2 = dev_upload(be, hp, n * 2);
    void *u = dev_upload(be, NULL, n * 2), *u2 = dev_upload(be, NULL, n * 2);
    int split = -1, ticket = 0;
    if (c) {
        CHECK_OK(sf_comm_reduce_norm_reserve(c, rows, dim, SF_DTYPE_BF16, x, u, 1, &split));
        CHECK_OK(sf_comm_reduce_norm_start(c, p, rows, dim, SF_DTYPE_BF16, &ticket));
        CHECK_OK(sf_comm_reduce_norm_end(c, ticket, x, p, rows, dim, SF_DTYPE_BF16, w, EPS, u));
        CHECK_OK(sf_comm_wait(c));
    }
    CHECK_OK(sf_be_add_typed(be, n, x2, SF_DTYPE_BF16, p2));
    CHECK_OK(sf_be_rmsnorm_typed(be, rows, dim, x2, w, EPS, SF_DTYPE_BF16, u2));
    float *gx = malloc(n * 4), *gx2 = malloc(n * 4);
    uint16_t *gu = malloc(n * 2), *gu2 = malloc(n * 2);
    CHECK_OK(be->ops->download(be, gx, x, n * 4));
    CHECK_OK(be->ops->download(be, gx2, x2, n * 4));
    CHECK_OK(be->ops->download(be, gu, u, n * 2));
    CHECK_OK(be->ops->download(be, gu2, u2, n * 2));
    CHECKF(split == 0, "one rank: split %d", split);
    CHECKF(memcmp(gx, gx2, n * 4) == 0, "one rank, %d x %d: the rows differ from add_typed's", rows, dim);
    CHECKF(memcmp(gu, gu2, n * 2) == 0, "one rank, %d x %d: the normed rows differ from rmsnorm_typed's", rows, dim);
    printf("  one rank, %d rows of %d: rows and normed rows bit for bit the composition's\n", rows, dim);
    void *bufs[] = {x, x2, w, p, p2, u, u2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
    free(hx), free(hw), free(hp), free(gx), free(gx2), free(gu), free(gu2);
    sf_comm_free(c);
    sf_backend_free(be);
}

/* ---- two GPUs --------------------------------------------------------------------------------- */

#define ROWS 301 /* chunks of 151 and 150 rows: slices of 75 and 76 */
#define DIM 1024
#define SEGMENTS 2

typedef struct norm_job {
    int rank, allow, split, rc;
    const unsigned char *id;
    float *rows[SEGMENTS];      /* [ROWS, DIM] after the sums */
    uint16_t *normed[SEGMENTS]; /* [ROWS, DIM] after the first sums */
    uint16_t *first[SEGMENTS];  /* [ROWS, DIM] after first_rows */
} norm_job;

/* segment s's rows on rank 0 (rank 1 starts from others: first_rows replaces them) */
static float start_value(int rank, int s, size_t i) { return rank == 0 ? row_value(i) + (float)s : 1000.0f; }

/* ops 0, 1: the chunks' sums, normed; 2, 3: the same chunks' last sums; each pair's ends both
 * issued before their joins, as the block does */
static int run_sums(norm_job *j, sf_backend *be, sf_comm *c, float *x, const float *w, unsigned char *part,
                    unsigned char *u, int seg)
{
    const size_t n = (size_t)ROWS * DIM;
    const int r0[2] = {0, 151}, nr[2] = {151, ROWS - 151};
    int ticket[4] = {0}, rc = SF_OK;
    for (int k = 0; k < 4 && rc == SF_OK; k++) {
        const int q = k % 2;
        const size_t at = (size_t)r0[q] * DIM, cnt = (size_t)nr[q] * DIM;
        uint16_t *h = malloc(cnt * 2 + 2);
        for (size_t i = 0; i < cnt; i++) h[i] = check_bf16_bits(part_value(j->rank, k, at + i));
        rc = be->ops->upload(be, part + at * 2, h, cnt * 2);
        free(h);
        if (rc == SF_OK) rc = sf_comm_reduce_norm_start(c, part + at * 2, nr[q], DIM, SF_DTYPE_BF16, &ticket[k]);
        if (q == 0) continue;
        const float *norm = k == 1 ? w : NULL;
        for (int e = k - 1; e <= k && rc == SF_OK; e++) {
            const size_t off = (size_t)r0[e % 2] * DIM;
            rc = sf_comm_reduce_norm_end(c, ticket[e], x + off, part + off * 2, nr[e % 2], DIM, SF_DTYPE_BF16, norm,
                                         EPS, norm ? u + off * 2 : NULL);
        }
        for (int e = k - 1; e <= k && rc == SF_OK; e++) rc = sf_comm_reduce_norm_join(c, ticket[e]);
        if (k == 1 && rc == SF_OK) rc = sf_comm_wait(c);
        if (k == 1 && rc == SF_OK) rc = be->ops->download(be, j->normed[seg], u, n * 2);
    }
    if (rc == SF_OK) rc = sf_comm_wait(c);
    if (rc == SF_OK) rc = be->ops->download(be, j->rows[seg], x, n * 4);
    return rc;
}

static void *norm_main(void *arg)
{
    norm_job *j = arg;
    const size_t n = (size_t)ROWS * DIM;
    sf_backend *be = NULL;
    sf_comm *c = NULL;
    j->rc = sf_backend_create_ex("cuda", j->rank, SF_PRECISION_BF16, &be);
    if (j->rc == SF_OK) j->rc = sf_comm_nccl_create(be, j->id, j->rank, 2, 10000, &c);
    float *x = NULL, *w = NULL;
    unsigned char *part = NULL, *u = NULL;
    if (j->rc == SF_OK) {
        float *hw = malloc(DIM * 4);
        for (int i = 0; i < DIM; i++) hw[i] = weight_value((size_t)i);
        x = dev_upload(be, NULL, n * 4), w = dev_upload(be, hw, DIM * 4);
        part = dev_upload(be, NULL, n * 2), u = dev_upload(be, NULL, n * 2);
        free(hw);
        j->rc = sf_comm_reduce_norm_reserve(c, ROWS, DIM, SF_DTYPE_BF16, x, u, j->allow, &j->split);
    }
    for (int seg = 0; seg < SEGMENTS && j->rc == SF_OK; seg++) {
        float *start = j->rows[seg];
        for (size_t i = 0; i < n; i++) start[i] = start_value(j->rank, seg, i);
        j->rc = be->ops->upload(be, x, start, n * 4);
        /* as the block does: the rows registered again (rank 0's move with each packet) */
        int split = 0;
        if (j->rc == SF_OK && j->split)
            j->rc = sf_comm_reduce_norm_reserve(c, ROWS, DIM, SF_DTYPE_BF16, x, u, 1, &split);
        if (j->rc == SF_OK) j->rc = sf_comm_first_rows(c, ROWS, DIM, x, w, EPS, u);
        if (j->rc == SF_OK) j->rc = sf_comm_wait(c);
        if (j->rc == SF_OK) j->rc = be->ops->download(be, j->first[seg], u, n * 2);
        if (j->rc == SF_OK) j->rc = run_sums(j, be, c, x, w, part, u, seg);
    }
    if (be) {
        void *bufs[] = {x, w, part, u};
        for (size_t i = 0; i < 4; i++) be->ops->free(be, bufs[i]);
    }
    sf_comm_free(c);
    sf_backend_free(be);
    return NULL;
}

/* the host's float32 sum of op k's parts at element i, in rank order */
static float host_sum(int k, size_t i)
{
    float s = check_bf16_float(check_bf16_bits(part_value(0, k, i)));
    return s + check_bf16_float(check_bf16_bits(part_value(1, k, i)));
}

/* The largest relative error of normed rows against the host's norm of rows x. */
static double norm_error(const float *x, const uint16_t *normed)
{
    double worst = 0;
    for (int row = 0; row < ROWS; row++) {
        const float *xr = x + (size_t)row * DIM;
        double ss = 0;
        for (int c = 0; c < DIM; c++) ss += (double)xr[c] * xr[c];
        const double rs = 1.0 / sqrt(ss / DIM + (double)EPS);
        for (int c = 0; c < DIM; c++) {
            const double ref = xr[c] * rs * weight_value((size_t)c);
            const double d = fabs(check_bf16_float(normed[(size_t)row * DIM + c]) - ref) / (fabs(ref) + 1e-3);
            if (d > worst) worst = d;
        }
    }
    return worst;
}

static void check_two_gpus(void)
{
    const size_t n = (size_t)ROWS * DIM;
    float *start = malloc(n * 4), *after_first = malloc(n * 4), *want = malloc(n * 4);
    const int peer = check_gpu_peer(0, 1);
    for (int allow = 1; allow >= 0; allow--) {
        unsigned char id[SF_COMM_NCCL_ID_BYTES];
        CHECK_OK(sf_comm_nccl_unique_id(id));
        norm_job jobs[2];
        pthread_t t[2];
        for (int r = 0; r < 2; r++) {
            jobs[r] = (norm_job){.rank = r, .allow = allow, .id = id, .split = -1};
            for (int seg = 0; seg < SEGMENTS; seg++)
                jobs[r].rows[seg] = malloc(n * 4), jobs[r].normed[seg] = malloc(n * 2),
                jobs[r].first[seg] = malloc(n * 2);
            pthread_create(&t[r], NULL, norm_main, &jobs[r]);
        }
        for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
        for (int r = 0; r < 2; r++)
            CHECKF(jobs[r].rc == SF_OK, "reduce_norm (allow %d), rank %d: %d (%s)", allow, r, jobs[r].rc,
                   sf_last_error());
        const int split = jobs[0].split;
        CHECKF(split == (allow && peer) && jobs[1].split == split, "reduce_norm (allow %d): split %d and %d, peer %d",
               allow, jobs[0].split, jobs[1].split, peer);
        for (int seg = 0; seg < SEGMENTS && jobs[0].rc == SF_OK && jobs[1].rc == SF_OK; seg++) {
            for (size_t i = 0; i < n; i++) {
                const int q = i >= (size_t)151 * DIM;
                start[i] = start_value(0, seg, i);
                after_first[i] = start[i] + host_sum(q, i);
                want[i] = after_first[i] + host_sum(2 + q, i);
            }
            CHECKF(memcmp(jobs[0].first[seg], jobs[1].first[seg], n * 2) == 0,
                   "first_rows (allow %d), segment %d: normed rows differ", allow, seg);
            CHECKF(memcmp(jobs[0].normed[seg], jobs[1].normed[seg], n * 2) == 0,
                   "reduce_norm (allow %d), segment %d: normed rows differ", allow, seg);
            if (!split)
                CHECKF(memcmp(jobs[0].rows[seg], jobs[1].rows[seg], n * 4) == 0,
                       "reduce_norm (allow %d), segment %d: ranks' rows differ", allow, seg);
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                const double d = fabs((double)jobs[0].rows[seg][i] - want[i]) / (fabs(want[i]) + 1.0);
                if (d > worst) worst = d;
            }
            const double worst_first = norm_error(start, jobs[0].first[seg]);
            const double worst_u = norm_error(after_first, jobs[0].normed[seg]);
            if (split)
                CHECKF(worst == 0, "reduce_norm split, segment %d: rank 0's rows %.3g from the host's float32 sums",
                       seg, worst);
            else
                CHECKF(worst <= 1e-2, "reduce_norm by NCCL, segment %d: %.3g from the host's float32 sums (bf16 sums)",
                       seg, worst);
            CHECKF(worst_first <= 8e-3, "first_rows (allow %d), segment %d: normed rows %.3g from the host's norm",
                   allow, seg, worst_first);
            CHECKF(worst_u <= 8e-3, "reduce_norm (allow %d), segment %d: normed rows %.3g from the host's norm", allow,
                   seg, worst_u);
            printf("  segment %d on 2 GPUs, %s: rows %.2e from the host's sums; normed rows %.2e (first rows), %.2e "
                   "(after the first sums), identical on both\n",
                   seg, split ? "split by the copy engines" : "NCCL", worst, worst_first, worst_u);
        }
        for (int r = 0; r < 2; r++)
            for (int seg = 0; seg < SEGMENTS; seg++)
                free(jobs[r].rows[seg]), free(jobs[r].normed[seg]), free(jobs[r].first[seg]);
    }
    free(start), free(after_first), free(want);
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    if (!sf_comm_nccl_available()) return check_skip("this build has no NCCL");
    check_one_rank(37, 1024);
    check_one_rank(5, 2048);
    check_one_rank(9, 1000);
    if (check_gpu_count() >= 2)
        check_two_gpus();
    else
        printf("  one GPU: the two-GPU sums are skipped (they need two GPUs)\n");
    return check_finish("test_gpu_reduce_norm");
}
