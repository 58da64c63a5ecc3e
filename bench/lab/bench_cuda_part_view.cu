/* A head-parallel rank's product written straight into the other GPU through a part view
 * (bench/lab/part_view.h) against the split sums' way: the product into this GPU's memory,
 * then the copy engine carrying the other rank's slice across. Does the product's own store over
 * the link cost it less than the copy that follows it?
 *
 *   bench_cuda_part_view [--rows N] [--reps R]
 *
 * The reference model's two products of a chunk (N = 4096 rows: one of two chunks of 8192) on a
 * rank of two: the output product (K = 512: 8 heads of 64) and W2 (K = 2048: half the MLP), bf16
 * in and out, D = 1024, through cuBLASLt with one algorithm for all three ways. Each way's part is
 * first checked bit for bit against the product into local memory (both slices, wherever they
 * landed), then timed, median of R (CUDA events from the product's start to the part's arrival):
 * on GPU 0 alone and with both GPUs at once, each writing into the other. Prints one line a
 * product and way, "RESULT ..." last. Exits 77 with fewer than two GPUs or no peer access. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/cuda_check.h"
#include "bench/lab/two_gpus.h"
#include "bench/lab/part_view.h"
#include "seqflow/error.h"

#define DIM 1024
#define LT_OK(x)                                                                                                       \
    do {                                                                                                               \
        cublasStatus_t st_ = (x);                                                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                            \
            fprintf(stderr, "%s:%d: cuBLASLt status %d\n", __FILE__, __LINE__, (int)st_);                              \
            exit(2);                                                                                                   \
        }                                                                                                              \
    } while (0)

enum way { LOCAL, COPY, VIEW };
static const char *way_name[] = {"product here", "product here, then copy", "product into the view"};

struct side {
    int device;
    cudaStream_t stream, copies;
    cudaEvent_t t0, t1, made;
    cublasLtHandle_t lt;
    void *work;
    __nv_bfloat16 *x, *w, *part, *inbox; /* inbox: the other side's slice lands here (COPY) */
    void *view;                          /* this side's part view */
};

static const size_t WORK = 32u << 20;

static void make_side(side &s, int device, int rows, int k, unsigned seed)
{
    s.device = device;
    CUDA_OK(cudaSetDevice(device));
    CUDA_OK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s.copies, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&s.t0));
    CUDA_OK(cudaEventCreate(&s.t1));
    CUDA_OK(cudaEventCreateWithFlags(&s.made, cudaEventDisableTiming));
    LT_OK(cublasLtCreate(&s.lt));
    CUDA_OK(cudaMalloc(&s.work, WORK));
    std::vector<__nv_bfloat16> h((size_t)rows * k > (size_t)DIM * k ? (size_t)rows * k : (size_t)DIM * k);
    srand(seed);
    for (auto &v : h) v = __float2bfloat16((float)rand() / RAND_MAX - 0.5f);
    CUDA_OK(cudaMalloc(&s.x, (size_t)rows * k * 2));
    CUDA_OK(cudaMemcpy(s.x, h.data(), (size_t)rows * k * 2, cudaMemcpyHostToDevice));
    for (auto &v : h) v = __float2bfloat16(((float)rand() / RAND_MAX - 0.5f) * 0.05f);
    CUDA_OK(cudaMalloc(&s.w, (size_t)DIM * k * 2));
    CUDA_OK(cudaMemcpy(s.w, h.data(), (size_t)DIM * k * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&s.part, (size_t)rows * DIM * 2));
}

/* the product's descriptors: part[rows, D] = x[rows, K] w[D, K]^T, row-major (column-major
 * D x rows = (K x D)^T (K x rows)) */
struct plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

static plan make_plan(side &s, int rows, int k)
{
    plan p;
    LT_OK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    LT_OK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, DIM, k));
    LT_OK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, rows, k));
    LT_OK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, DIM, rows, DIM));
    cublasLtMatmulPreference_t pref;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WORK, sizeof WORK));
    cublasLtMatmulHeuristicResult_t r = {};
    int found = 0;
    LT_OK(cublasLtMatmulAlgoGetHeuristic(s.lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &r, &found));
    if (!found) {
        fprintf(stderr, "cuBLASLt offers no algorithm for %d x %d x %d\n", rows, DIM, k);
        exit(2);
    }
    p.algo = r.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

static void product(side &s, const plan &p, void *out)
{
    const float one = 1.0f, zero = 0.0f;
    LT_OK(cublasLtMatmul(s.lt, p.op, &one, s.w, p.a, s.x, p.b, &zero, out, p.c, out, p.c, &p.algo, s.work, WORK,
                         s.stream));
}

/* one part of side s (rank `rank` of two) by way `how`; the other side `o` */
static void issue(side &s, side &o, int rank, const plan &p, int rows, way how)
{
    const size_t slice = (size_t)rows / 2 * DIM * 2;
    CUDA_OK(cudaSetDevice(s.device));
    CUDA_OK(cudaEventRecord(s.t0, s.stream));
    product(s, p, how == VIEW ? s.view : s.part);
    if (how == COPY) { /* the other rank's slice, as the exchange carries it */
        CUDA_OK(cudaEventRecord(s.made, s.stream));
        CUDA_OK(cudaStreamWaitEvent(s.copies, s.made, 0));
        CUDA_OK(cudaMemcpyPeerAsync(s.inbox, o.device, (const unsigned char *)s.part + (rank == 0 ? slice : 0),
                                    s.device, slice, s.copies));
        CUDA_OK(cudaEventRecord(s.made, s.copies));
        CUDA_OK(cudaStreamWaitEvent(s.stream, s.made, 0));
    }
    CUDA_OK(cudaEventRecord(s.t1, s.stream));
}

int main(int argc, char **argv)
{
    int rows = 4096, reps = 50;
    if (lab_args(argc, argv, "bench_cuda_part_view", "rows", &rows, &reps)) return 2;
    const int two = lab_two_gpus("bench_cuda_part_view");
    if (two) return two;
    const int devices[2] = {0, 1};
    size_t gran = 0;
    if (sf_cuda_part_views_granularity(devices, 2, &gran) != SF_OK) {
        printf("skipped: %s\n", sf_last_error());
        return 77;
    }
    const size_t slice = (size_t)rows / 2 * DIM * 2;
    if (rows % 2 || slice % gran) {
        fprintf(stderr, "a slice of %zu bytes is not a multiple of the granularity %zu: choose --rows\n", slice, gran);
        return 2;
    }
    sf_cuda_part_views *views = NULL;
    if (sf_cuda_part_views_create(devices, 2, 1, slice, &views) != SF_OK) {
        fprintf(stderr, "part views: %s\n", sf_last_error());
        return 1;
    }
    printf("part view: %d rows of %d (bf16) a rank, slices of %zu bytes (granularity %zu), median of %d\n", rows, DIM,
           slice, gran, reps);
    printf("%-8s %-26s %-8s %10s %13s\n", "product", "way", "check", "alone ms", "both GPUs ms");
    const int ks[2] = {512, 2048};
    const char *names[2] = {"output", "W2"};
    int failed = 0;
    double best[2][3];
    for (int q = 0; q < 2; q++) {
        side a, b;
        make_side(a, 0, rows, ks[q], 1 + q);
        make_side(b, 1, rows, ks[q], 11 + q);
        a.view = sf_cuda_part_view(views, 0, 0), b.view = sf_cuda_part_view(views, 1, 0);
        CUDA_OK(cudaSetDevice(1));
        CUDA_OK(cudaMalloc(&a.inbox, slice));
        CUDA_OK(cudaSetDevice(0));
        CUDA_OK(cudaMalloc(&b.inbox, slice));
        const plan pa = make_plan(a, rows, ks[q]), pb = make_plan(b, rows, ks[q]);
        issue(a, b, 0, pa, rows, LOCAL);
        const std::vector<unsigned char> ref = lab_fetch(0, a.part, (size_t)rows * DIM * 2);
        const std::vector<unsigned char> ref_low(ref.begin(), ref.begin() + slice),
            ref_high(ref.begin() + slice, ref.end());
        for (int how = LOCAL; how <= VIEW; how++) {
            CUDA_OK(cudaSetDevice(1));
            CUDA_OK(cudaMemset(a.inbox, 0, slice));
            CUDA_OK(cudaMemset((unsigned char *)a.view + slice, 0, slice));
            CUDA_OK(cudaSetDevice(0));
            CUDA_OK(cudaMemset(a.part, 0, (size_t)rows * DIM * 2));
            issue(a, b, 0, pa, rows, (way)how);
            bool ok;
            if (how == LOCAL)
                ok = lab_fetch(0, a.part, (size_t)rows * DIM * 2) == ref;
            else if (how == COPY)
                ok = lab_fetch(0, a.part, (size_t)rows * DIM * 2) == ref && lab_fetch(1, a.inbox, slice) == ref_high;
            else /* slice 0 on GPU 0, slice 1 on GPU 1: read each where it lies */
                ok = lab_fetch(0, a.view, slice) == ref_low &&
                     lab_fetch(1, (unsigned char *)a.view + slice, slice) == ref_high;
            failed += !ok;
            std::vector<float> alone, both;
            for (int r = 0; r < reps + 3; r++) {
                issue(a, b, 0, pa, rows, (way)how);
                const float ms = lab_elapsed(a.device, a.t0, a.t1);
                if (r >= 3) alone.push_back(ms);
            }
            for (int r = 0; r < reps + 3; r++) {
                issue(a, b, 0, pa, rows, (way)how);
                issue(b, a, 1, pb, rows, (way)how);
                const float ms = std::max(lab_elapsed(a.device, a.t0, a.t1), lab_elapsed(b.device, b.t0, b.t1));
                if (r >= 3) both.push_back(ms);
            }
            best[q][how] = lab_median(both);
            printf("%-8s %-26s %-8s %10.4f %13.4f\n", names[q], way_name[how], ok ? "ok" : "FAILED", lab_median(alone),
                   lab_median(both));
        }
    }
    printf("RESULT output_copy=%.4f output_view=%.4f w2_copy=%.4f w2_view=%.4f checks_failed=%d\n", best[0][COPY],
           best[0][VIEW], best[1][COPY], best[1][VIEW], failed);
    sf_cuda_part_views_free(views);
    return failed ? 1 : 0;
}
