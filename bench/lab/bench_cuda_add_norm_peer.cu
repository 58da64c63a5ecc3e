/* The split sums' add-and-norm kernel (sf_cuda_add_parts_norm, kernels/cuda/elementwise.cu) with
 * its normed rows also stored into another GPU's memory, in the shapes sf_cuda_add_parts_norm_shaped
 * offers: rows a warp, warps a block, and whether a warp loads its next row before it stores this
 * one; and the lab's kernel that sends the normed rows by bulk copies from shared memory instead
 * (add_norm_bulk.cu). Which keeps both the local memory and the link to the other GPU busy?
 *
 *   bench_cuda_add_norm_peer [--rows N] [--reps R]
 *
 * Two bf16 parts [N, 1024] (N = 2048 by default: a rank's slice of one of two chunks of the
 * reference model's 8192 rows), float32 rows, the norm's weight; the normed rows go to this GPU
 * and, with peer access, to GPU 1. Every shape is first checked bit for bit against the product's
 * shape without copies ({1, 8, no prefetch}): the rows, the normed rows here and the copy there.
 * Then timed, median of R (CUDA events), the rows put back before each run: on GPU 0 alone, and
 * with both GPUs at once, each storing into the other (the two ranks of a sum). Prints one line a
 * way (the product's kernel without copies first: the local memory's time) and "RESULT ..." last.
 * Exits 77 with fewer than two GPUs or no peer access. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/cuda_check.h"
#include "bench/lab/lab_kernels.h"
#include "bench/lab/two_gpus.h"
#include "kernels/cuda/cuda_backend.h"

#define DIM 1024

struct side {
    int device;
    cudaStream_t stream;
    cudaEvent_t t0, t1;
    __nv_bfloat16 *parts[2], *u, *peer_u; /* peer_u: this side's copies land there (the other GPU) */
    float *rows, *pristine, *weight;
};

static void make_side(side &s, int device, int rows, unsigned seed)
{
    s.device = device;
    CUDA_OK(cudaSetDevice(device));
    CUDA_OK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&s.t0));
    CUDA_OK(cudaEventCreate(&s.t1));
    const size_t n = (size_t)rows * DIM;
    std::vector<__nv_bfloat16> hp(n);
    std::vector<float> hr(n), hw(DIM);
    srand(seed);
    for (int q = 0; q < 2; q++) {
        for (size_t i = 0; i < n; i++) hp[i] = __float2bfloat16((float)rand() / RAND_MAX - 0.5f);
        CUDA_OK(cudaMalloc(&s.parts[q], n * 2));
        CUDA_OK(cudaMemcpy(s.parts[q], hp.data(), n * 2, cudaMemcpyHostToDevice));
    }
    for (size_t i = 0; i < n; i++) hr[i] = 4.0f * ((float)rand() / RAND_MAX - 0.5f);
    for (int i = 0; i < DIM; i++) hw[i] = 0.5f + (float)rand() / RAND_MAX;
    CUDA_OK(cudaMalloc(&s.rows, n * 4));
    CUDA_OK(cudaMalloc(&s.pristine, n * 4));
    CUDA_OK(cudaMalloc(&s.weight, DIM * 4));
    CUDA_OK(cudaMalloc(&s.u, n * 2));
    CUDA_OK(cudaMemcpy(s.pristine, hr.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(s.weight, hw.data(), DIM * 4, cudaMemcpyHostToDevice));
}

/* one sum on side s: the rows put back, then (timed) the kernel of `shape`, copies to peer_u
 * (none when peer is 0) */
/* what is timed: the product's kernel in a shape, storing into the other GPU (peer) or not, or
 * the lab's kernel with bulk stores (bulk: the shape's rows a warp and warps a block) */
struct way {
    sf_cuda_add_norm_shape shape;
    int peer, bulk;
};

static void issue(side &s, int rows, const way &w)
{
    CUDA_OK(cudaSetDevice(s.device));
    CUDA_OK(cudaMemcpyAsync(s.rows, s.pristine, (size_t)rows * DIM * 4, cudaMemcpyDeviceToDevice, s.stream));
    CUDA_OK(cudaEventRecord(s.t0, s.stream));
    const void *ps[2] = {s.parts[0], s.parts[1]};
    __nv_bfloat16 *also[1] = {s.peer_u};
    if (w.bulk) {
        if (sf_lab_add_norm_bulk(s.parts[0], s.parts[1], rows, DIM, s.rows, s.weight, 1e-5f, s.u, s.peer_u,
                                 w.shape.rows_per_warp, w.shape.warps_per_block, s.stream) != 0) {
            fprintf(stderr, "bulk add and norm failed\n");
            exit(2);
        }
    } else if (sf_cuda_add_parts_norm_shaped(ps, 2, rows, DIM, s.rows, s.weight, 1e-5f, s.u, also, w.peer ? 1 : 0,
                                             w.shape, s.stream) != SF_OK) {
        fprintf(stderr, "add and norm failed: %s\n", sf_last_error());
        exit(2);
    }
    CUDA_OK(cudaEventRecord(s.t1, s.stream));
}

int main(int argc, char **argv)
{
    int rows = 2048, reps = 50;
    if (lab_args(argc, argv, "bench_cuda_add_norm_peer", "rows", &rows, &reps)) return 2;
    const int two = lab_two_gpus("bench_cuda_add_norm_peer");
    if (two) return two;
    side a, b;
    make_side(a, 0, rows, 1);
    make_side(b, 1, rows, 2);
    /* each side's copies go to a buffer of their own on the other GPU */
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc(&a.peer_u, (size_t)rows * DIM * 2));
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc(&b.peer_u, (size_t)rows * DIM * 2));

    const way plain = {{1, 8, 0}, 0, 0};
    const way ways[] = {{{1, 8, 0}, 0, 0}, {{4, 4, 1}, 0, 0}, /* no copies: the local memory's time */
                        {{1, 8, 0}, 1, 0}, {{2, 8, 0}, 1, 0},  {{4, 8, 0}, 1, 0}, {{2, 8, 1}, 1, 0}, {{4, 8, 1}, 1, 0},
                        {{2, 4, 1}, 1, 0}, {{4, 4, 1}, 1, 0},  {{8, 4, 1}, 1, 0}, {{2, 4, 0}, 1, 0}, {{4, 4, 0}, 1, 0},
                        {{8, 2, 1}, 1, 0}, {{16, 2, 1}, 1, 0}, {{1, 8, 1}, 1, 1}, {{2, 8, 1}, 1, 1}, {{4, 8, 1}, 1, 1},
                        {{2, 4, 1}, 1, 1}, {{4, 4, 1}, 1, 1},  {{8, 4, 1}, 1, 1}, {{16, 2, 1}, 1, 1}};
    const size_t n = (size_t)rows * DIM;
    /* the reference bits: the product's shape without copies */
    issue(a, rows, plain);
    const std::vector<unsigned char> ref_rows = lab_fetch(0, a.rows, n * 4), ref_u = lab_fetch(0, a.u, n * 2);
    printf("add and norm, %d rows of %d, 2 bf16 parts; the normed rows also stored into GPU 1 (peer access) by the "
           "threads or by bulk copies; median of %d\n",
           rows, DIM, reps);
    printf("rows/warp warps/block prefetch  into GPU 1   check      alone ms   GB/s local   both GPUs ms\n");
    double best_alone = 1e30, best_both = 1e30, bulk_alone = 1e30, bulk_both = 1e30;
    int failed = 0;
    for (const way &w : ways) {
        if (w.bulk && !sf_lab_add_norm_bulk_usable(DIM)) continue;
        CUDA_OK(cudaSetDevice(1));
        CUDA_OK(cudaMemset(a.peer_u, 0, n * 2));
        issue(a, rows, w);
        const bool ok = lab_fetch(0, a.rows, n * 4) == ref_rows && lab_fetch(0, a.u, n * 2) == ref_u &&
                        (!w.peer || lab_fetch(1, a.peer_u, n * 2) == ref_u);
        failed += !ok;
        std::vector<float> alone, both;
        for (int r = 0; r < reps + 3; r++) {
            issue(a, rows, w);
            const float ms = lab_elapsed(a.device, a.t0, a.t1);
            if (r >= 3) alone.push_back(ms);
        }
        for (int r = 0; r < reps + 3; r++) {
            issue(a, rows, w);
            issue(b, rows, w);
            const float ms = std::max(lab_elapsed(a.device, a.t0, a.t1), lab_elapsed(b.device, b.t0, b.t1));
            if (r >= 3) both.push_back(ms);
        }
        const double ma = lab_median(alone), mb = lab_median(both);
        /* local bytes: the parts read, the rows read and written, the normed rows written */
        const double local = (double)n * (2 * 2 + 4 + 4 + 2);
        printf("%9d %11d %8s  %-11s  %-8s %9.4f   %10.0f   %12.4f\n", w.shape.rows_per_warp, w.shape.warps_per_block,
               w.shape.prefetch ? "yes" : "no",
               !w.peer  ? "no"
               : w.bulk ? "bulk"
                        : "threads",
               ok ? "ok" : "FAILED", ma, local / (ma * 1e6), mb);
        if (ok && w.peer && !w.bulk) best_alone = std::min(best_alone, ma), best_both = std::min(best_both, mb);
        if (ok && w.bulk) bulk_alone = std::min(bulk_alone, ma), bulk_both = std::min(bulk_both, mb);
    }
    printf("RESULT best_alone=%.4f best_both=%.4f bulk_alone=%.4f bulk_both=%.4f checks_failed=%d\n", best_alone,
           best_both, bulk_alone, bulk_both, failed);
    return failed ? 1 : 0;
}
