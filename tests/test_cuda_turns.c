/* Threads enter the CUDA backend in turn (kernels/cuda/cuda_enter.cu): a thread issuing op after
 * op does not hold another thread's op back. One thread issues small ops as fast as it can while
 * another issues a few, counting how many of the first thread's ops went by while each of its
 * own waited to enter: in turn, a couple at most. The median over the few is taken, so that
 * the other thread being descheduled now and then (a loaded machine) does not count. (Ops that enter again inside one, the composed ones, take no turn of their own:
 * every GPU test runs them.) Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"

enum { MANY = 200000, FEW = 200 };

static int by_value(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

typedef struct shared {
    sf_backend *be;
    float *buf;
    atomic_int many_done; /* ops the busy thread has issued so far */
    atomic_int few_over;  /* the other thread's ops are all issued */
    int passed[FEW];      /* the busy thread's ops during each of the other's */
    int rc_many, rc_few;
} shared;

static void *busy(void *arg)
{
    shared *s = arg;
    int rc = SF_OK;
    for (int i = 0; i < MANY && rc == SF_OK && !atomic_load(&s->few_over); i++) {
        rc = s->be->ops->zero(s->be, s->buf, 64);
        atomic_store(&s->many_done, i + 1);
    }
    s->rc_many = rc;
    return NULL;
}

static void *few(void *arg)
{
    shared *s = arg;
    int rc = SF_OK;
    for (int i = 0; i < FEW && rc == SF_OK; i++) {
        const int before = atomic_load(&s->many_done);
        rc = s->be->ops->zero(s->be, s->buf + 64, 64);
        s->passed[i] = atomic_load(&s->many_done) - before;
    }
    s->rc_few = rc;
    atomic_store(&s->few_over, 1);
    return NULL;
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    shared s = {0};
    CHECK_OK(sf_backend_create("cuda", 0, &s.be));
    if (!s.be) return check_finish("test_cuda_turns");
    s.buf = s.be->ops->alloc(s.be, 1024 * sizeof(float));
    CHECK(s.buf != NULL);
    for (int round = 0; round < 3 && s.buf; round++) {
        atomic_store(&s.many_done, 0);
        atomic_store(&s.few_over, 0);
        pthread_t a, b;
        pthread_create(&a, NULL, busy, &s);
        while (atomic_load(&s.many_done) < 100) {
        } /* the busy thread is at it */
        pthread_create(&b, NULL, few, &s);
        pthread_join(b, NULL);
        pthread_join(a, NULL);
        CHECK_OK(s.rc_many);
        CHECK_OK(s.rc_few);
        qsort(s.passed, FEW, sizeof *s.passed, by_value);
        const int median = s.passed[FEW / 2], most = s.passed[FEW - 1];
        CHECKF(median <= 4, "round %d: the busy thread's ops while one of the other's waited: median %d, most %d",
               round, median, most);
        printf("  round %d: the busy thread's ops while one of the other's waited: median %d, most %d\n", round, median,
               most);
    }
    if (s.buf) s.be->ops->free(s.be, s.buf);
    sf_backend_free(s.be);
    return check_finish("test_cuda_turns");
}
