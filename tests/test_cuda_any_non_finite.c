/* The CUDA backend's any_non_finite (the scan behind --check-finite 1 on a GPU) against the
 * host's sf_first_non_finite, in float32 and bf16, for both precisions. Without a GPU this
 * prints "skipped: no GPU" and exits 77. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"

/* any_non_finite against the host's sf_first_non_finite: clean rows, then a NaN, +inf or -inf at
 * the first, a middle and the last element, in float32 and bf16, at even and odd counts (a bf16
 * tail element is half a word); a hit past `count` is not one. */
static void test_any_non_finite(sf_backend *be, const char *label)
{
    static const size_t counts[] = {1, 7, 4096, 100003};
    const uint32_t bad_bits[] = {0x7fc00000u, 0x7f800000u, 0xff800000u};
    for (int bf = 0; bf < 2; bf++)
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
            const size_t n = counts[c], elem = bf ? 2 : 4;
            unsigned char *h = calloc(n + 1, elem);
            for (size_t i = 0; i <= n; i++) {
                const float v = (float)(i % 13) - 6.0f;
                uint32_t bits;
                memcpy(&bits, &v, 4);
                if (bf) {
                    const uint16_t hb = (uint16_t)(bits >> 16);
                    memcpy(h + 2 * i, &hb, 2);
                } else {
                    memcpy(h + 4 * i, &bits, 4);
                }
            }
            /* one element past the end is non-finite: it must not count */
            if (bf) {
                const uint16_t nan16 = 0x7fc0u;
                memcpy(h + 2 * n, &nan16, 2);
            } else {
                memcpy(h + 4 * n, &bad_bits[0], 4);
            }
            void *d = be->ops->alloc(be, (n + 1) * elem);
            CHECK(d != NULL);
            if (!d) {
                free(h);
                return;
            }
            const sf_dtype type = bf ? SF_DTYPE_BF16 : SF_DTYPE_F32;
            int found = -1;
            CHECK_OK(be->ops->upload(be, d, h, (n + 1) * elem));
            CHECK_OK(sf_be_any_non_finite(be, d, type, n, &found));
            CHECKF(found == 0, "%s any_non_finite, %s clean n=%zu: found %d", label, bf ? "bf16" : "f32", n, found);
            const size_t at[] = {0, n / 2, n - 1};
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++) {
                    unsigned char saved[4];
                    memcpy(saved, h + at[a] * elem, elem);
                    if (bf) {
                        const uint16_t hb = (uint16_t)(bad_bits[b] >> 16);
                        memcpy(h + at[a] * elem, &hb, 2);
                    } else {
                        memcpy(h + at[a] * elem, &bad_bits[b], 4);
                    }
                    CHECK_OK(be->ops->upload(be, d, h, (n + 1) * elem));
                    found = -1;
                    CHECK_OK(sf_be_any_non_finite(be, d, type, n, &found));
                    CHECKF(found == 1 && sf_first_non_finite(h, type, n) == at[a],
                           "%s any_non_finite, %s n=%zu, bad at %zu: found %d", label, bf ? "bf16" : "f32", n, at[a],
                           found);
                    memcpy(h + at[a] * elem, saved, elem);
                }
            be->ops->free(be, d);
            free(h);
        }
}

/* The two halves as the stages use them, around a download: several checks in flight at once
 * (begun in one order, ended in another) each answer for their own rows, and ticket slots are
 * given back (more checks than the backend has slots, in sequence). */
static void test_checks_in_flight(sf_backend *be, const char *label)
{
    enum { K = 5, N = 4096 };
    float *h = malloc(sizeof(float) * N * K), *back = malloc(sizeof(float) * N);
    float *d = be->ops->alloc(be, sizeof(float) * N * K);
    CHECK(h && back && d);
    if (!h || !back || !d) goto done;
    for (int i = 0; i < N * K; i++) h[i] = (float)(i % 11) - 5.0f;
    const uint32_t nan_bits = 0x7fc00000u;
    memcpy(&h[1 * N + 17], &nan_bits, 4); /* rows 1 and 3 hold a NaN */
    memcpy(&h[3 * N + N - 1], &nan_bits, 4);
    CHECK_OK(be->ops->upload(be, d, h, sizeof(float) * N * K));
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_ON));
    for (int round = 0; round < 40; round++) { /* 200 checks: more than the slots */
        sf_rows_check chk[K];
        for (int k = 0; k < K; k++) CHECK_OK(sf_be_check_rows_begin(be, d + k * N, SF_DTYPE_F32, N, &chk[k]));
        CHECK_OK(be->ops->download(be, back, d + 4 * N, sizeof(float) * N));
        for (int k = K - 1; k >= 0; k--) {
            int found = -1;
            CHECK_OK(sf_be_check_rows_end(be, &chk[k], &found));
            CHECKF(found == (k == 1 || k == 3), "%s checks in flight, round %d, rows %d: found %d", label, round, k,
                   found);
        }
    }
done:
    if (d) be->ops->free(be, d);
    free(h);
    free(back);
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    const sf_precision precisions[] = {SF_PRECISION_F32, SF_PRECISION_BF16};
    for (int p = 0; p < 2; p++) {
        sf_backend *be = NULL;
        CHECK_OK(sf_backend_create_ex("cuda", 0, precisions[p], &be));
        if (!be) continue;
        test_any_non_finite(be, p ? "bf16" : "f32");
        test_checks_in_flight(be, p ? "bf16" : "f32");
        sf_backend_free(be);
    }
    return check_finish("test_cuda_any_non_finite");
}
