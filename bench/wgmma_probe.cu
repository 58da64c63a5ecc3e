/* Pins down what kernels/cuda/attention_wgmma.cu relies on, one wgmma at a time, against exact
 * host products (small integers: bf16 and float32 sums are exact, so any mismatch is layout):
 *   mode 0: A from shared (K-major, 128-byte swizzle), B K-major  (S = Q K^T, Q in shared)
 *   mode 1: A from registers, B K-major, N = 64                    (S = Q K^T)
 *   mode 2: A from registers, B MN-major ("transposed"), N = 64    (O = P V, V as [keys][d])
 *   mode 3: A from registers, B K-major, N = 128                   (S with 128-key tiles)
 * Each mode runs a 64 x N x 64 product as 4 k16 steps (K-major: +32 bytes in the swizzled row;
 * MN-major: +16 rows = +2048 bytes) for every candidate (LBO, SBO) and prints which match.
 * Build (sm_90a only): nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -I. -o wgmma_probe
 * bench/wgmma_probe.cu. Exit 0 when the encodings the kernel uses (LBO 16, SBO 1024) match in
 * every mode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_bf16.h>

#include "bench/cuda_check.h"
#include "kernels/cuda/attention_wgmma.cuh"


/* a: [64][64] row-major (M x K); b: mode 2 -> [64 keys (K)][64 (N)], else [N][64 (K)]; d: [64][N] */
template <int N>
__global__ void probe(int mode, uint32_t lbo, uint32_t sbo, const float *a, const float *b, float *d)
{
#if SF_WGMMA_ENABLED
    /* B at 16 KiB of a large buffer, so that every candidate stride stays inside it */
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char *sa = smem, *sb = smem + 16384;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int brows = mode == 2 ? 64 : N;
    for (int f = tid; f < 64 * 8; f += 128) {
        const int r = f / 8, c = f % 8;
        __nv_bfloat16 *dst = reinterpret_cast<__nv_bfloat16 *>(sa + sw128_offset(r, c));
        for (int e = 0; e < 8; e++) dst[e] = __float2bfloat16(a[r * 64 + c * 8 + e]);
    }
    for (int f = tid; f < brows * 8; f += 128) {
        const int r = f / 8, c = f % 8;
        __nv_bfloat16 *dst = reinterpret_cast<__nv_bfloat16 *>(sb + sw128_offset(r, c));
        for (int e = 0; e < 8; e++) dst[e] = __float2bfloat16(b[r * 64 + c * 8 + e]);
    }
    fence_proxy_async();
    __syncthreads();
    /* A fragments: rows 16*warp + g (+8), columns 2t (+8) of each k16 step */
    uint32_t af[4][4];
    for (int kc = 0; kc < 4; kc++)
        for (int reg = 0; reg < 4; reg++) {
            const int row = 16 * warp + g + 8 * (reg & 1), col = kc * 16 + 2 * t + 8 * (reg >> 1);
            __nv_bfloat162 p = __floats2bfloat162_rn(a[row * 64 + col], a[row * 64 + col + 1]);
            af[kc][reg] = *reinterpret_cast<uint32_t *>(&p);
        }
    float acc[N / 2];
    for (int i = 0; i < N / 2; i++) acc[i] = 0;
    const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(sa), b0 = (uint32_t)__cvta_generic_to_shared(sb);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        const uint64_t da = sw128_desc(a0 + kc * 32, lbo, sbo);
        if (N == 64) {
            if (mode == 0) wgmma_m64n64k16_ss<0>(acc, da, sw128_desc(b0 + kc * 32, lbo, sbo), kc > 0);
            if (mode == 1) wgmma_m64n64k16_rs<0>(acc, af[kc], sw128_desc(b0 + kc * 32, lbo, sbo), kc > 0);
            if (mode == 2) wgmma_m64n64k16_rs<1>(acc, af[kc], sw128_desc(b0 + kc * 2048, lbo, sbo), kc > 0);
        } else {
            wgmma_m64n128k16_rs<0>(acc, af[kc], sw128_desc(b0 + kc * 32, lbo, sbo), kc > 0);
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence<N / 2>(acc);
    /* accumulator layout: d[4j + 2h + e] = row 16*warp + g + 8h, column 8j + 2t + e */
    for (int i = 0; i < N / 2; i++) {
        const int j = i / 4, h = (i / 2) & 1, e = i & 1;
        d[(16 * warp + g + 8 * h) * N + 8 * j + 2 * t + e] = acc[i];
    }
#endif
}

static void fill(float *x, int n)
{
    for (int i = 0; i < n; i++) x[i] = (float)(rand() % 5 - 2);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    srand(7);
    float ha[64 * 64], hb[128 * 64], hd[64 * 128], ref[64 * 128];
    float *da, *db, *dd;
    CUDA_OK(cudaMalloc(&da, sizeof ha));
    CUDA_OK(cudaMalloc(&db, sizeof hb));
    CUDA_OK(cudaMalloc(&dd, sizeof hd));
    static const uint32_t cand[] = {16, 128, 1024, 2048, 8192};
    const int smem_bytes = 200 * 1024; /* 16 KiB + 3 * 2048 + 15 * 8192 + 8192 < 200 KiB */
    CUDA_OK(cudaFuncSetAttribute(probe<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    CUDA_OK(cudaFuncSetAttribute(probe<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    const char *what[4] = {"SS  B K-major  n64", "RS  B K-major  n64", "RS  B MN-major n64", "RS  B K-major  n128"};
    int primary_ok = 1;
    for (int mode = 0; mode < 4; mode++) {
        const int N = mode == 3 ? 128 : 64;
        fill(ha, 64 * 64);
        fill(hb, 128 * 64);
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < 64; k++) s += ha[m * 64 + k] * (mode == 2 ? hb[k * 64 + n] : hb[n * 64 + k]);
                ref[m * N + n] = (float)s;
            }
        CUDA_OK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
        int matches = 0;
        for (uint32_t lbo : cand)
            for (uint32_t sbo : cand) {
                CUDA_OK(cudaMemset(dd, 0xff, sizeof hd));
                if (N == 64)
                    probe<64><<<1, 128, smem_bytes>>>(mode, lbo, sbo, da, db, dd);
                else
                    probe<128><<<1, 128, smem_bytes>>>(mode, lbo, sbo, da, db, dd);
                CUDA_OK(cudaGetLastError());
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaMemcpy(hd, dd, sizeof(float) * 64 * N, cudaMemcpyDeviceToHost));
                double worst = 0;
                for (int i = 0; i < 64 * N; i++) {
                    double e = fabs((double)hd[i] - ref[i]);
                    if (!(e <= worst)) worst = e; /* NaN counts as worst */
                }
                const int ok = worst == 0;
                if (ok) {
                    matches++;
                    printf("mode %d (%s): LBO %5u SBO %5u  MATCH\n", mode, what[mode], lbo, sbo);
                }
                if (lbo == 16 && sbo == 1024) {
                    primary_ok &= ok;
                    if (!ok) printf("mode %d (%s): LBO 16 SBO 1024 (kernel's choice) max err %g\n", mode, what[mode], worst);
                }
            }
        if (!matches) printf("mode %d (%s): NO candidate matched\n", mode, what[mode]);
    }
    printf("wgmma probe: kernel encodings %s\n", primary_ok ? "verified" : "WRONG");
    cudaFree(da), cudaFree(db), cudaFree(dd);
    return primary_ok ? 0 : 1;
}
