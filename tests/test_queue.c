/* Bounded queue links: order, back-pressure, close-then-drain and abort. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/link.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

static sf_packet *numbered(uint64_t i)
{
    sf_packet *p = sf_packet_new(SF_PACKET_TOKENS, 1, 0);
    p->segment = i;
    return p;
}

typedef struct producer {
    sf_link *link;
    int count;
    volatile int pushed;
} producer;

static void *produce(void *arg)
{
    producer *pr = arg;
    for (int i = 0; i < pr->count; i++) {
        if (pr->link->ops->push(pr->link, numbered((uint64_t)i)) != SF_OK) break;
        __atomic_add_fetch(&pr->pushed, 1, __ATOMIC_SEQ_CST);
    }
    pr->link->ops->close(pr->link);
    return NULL;
}

int main(void)
{
    /* FIFO order and end of stream after close */
    sf_link *q = sf_queue_link_create(4);
    CHECK(q != NULL);
    for (uint64_t i = 0; i < 3; i++) CHECK_OK(q->ops->push(q, numbered(i)));
    q->ops->close(q);
    for (uint64_t i = 0; i < 3; i++) {
        sf_packet *p = q->ops->pop(q);
        CHECKF(p && p->segment == i, "expected packet %llu", (unsigned long long)i);
        sf_packet_free(p);
    }
    CHECK(q->ops->pop(q) == NULL);
    CHECK(q->ops->push(q, numbered(9)) == SF_E_CLOSED);
    sf_link_destroy(q);

    /* back-pressure: a producer of 100 packets into a depth-2 queue stalls at 2 until popped */
    q = sf_queue_link_create(2);
    producer pr = {q, 100, 0};
    pthread_t t;
    pthread_create(&t, NULL, produce, &pr);
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECKF(__atomic_load_n(&pr.pushed, __ATOMIC_SEQ_CST) == 2, "producer pushed %d into a queue of 2",
           __atomic_load_n(&pr.pushed, __ATOMIC_SEQ_CST));
    uint64_t expect = 0;
    int in_order = 1;
    for (sf_packet *p; (p = q->ops->pop(q)); sf_packet_free(p)) in_order &= p->segment == expect++;
    pthread_join(t, NULL);
    CHECK(in_order);
    CHECK(expect == 100);
    sf_link_destroy(q);

    /* abort unblocks a producer stuck on a full queue and drops what was queued */
    q = sf_queue_link_create(1);
    producer stuck = {q, 10, 0};
    pthread_create(&t, NULL, produce, &stuck);
    nanosleep(&pause, NULL);
    q->ops->abort(q);
    pthread_join(t, NULL);
    CHECK(stuck.pushed == 1);
    CHECK(q->ops->pop(q) == NULL);
    sf_link_destroy(q);
    return check_finish("test_queue");
}
