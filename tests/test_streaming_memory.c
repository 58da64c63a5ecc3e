/* An unbounded stream keeps bounded memory: 1,000,000 tokens through a small model, with the
 * resident set measured after the first segments and at the end. */
#include <math.h>
#include <stdlib.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/small_model.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

int main(void)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 1, 128, 8);
    CHECK_OK(sf_branches_parse("32:1,128:2", &cfg));
    sf_model *m;
    CHECK_OK(sf_model_create_random(&cfg, 7, &m));
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, &(sf_graph_options){.threads = 1}, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));

    const size_t total = 1000000, chunk = 1000;
    uint32_t *tokens = malloc(chunk * sizeof *tokens);
    check_rng rng = {42};
    size_t rows = 0, warm_rss = 0;
    int finite = 1;
    for (size_t sent = 0; sent < total; sent += chunk) {
        for (size_t i = 0; i < chunk; i++) tokens[i] = (uint32_t)(check_rng_next(&rng) % 256);
        if (sf_graph_push(g, 0, tokens, chunk) != SF_OK) {
            CHECKF(0, "push failed at %zu: %s", sent, sf_last_error());
            break;
        }
        for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
            for (size_t i = 0; i < p->n * p->width; i += 97) finite &= isfinite(p->x[i]);
            rows += p->n;
        }
        if (sent == 20 * chunk) warm_rss = check_rss_bytes();
    }
    CHECK_OK(sf_graph_end(g, 0));
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) rows += p->n;
    size_t end_rss = check_rss_bytes();
    CHECKF(rows == total, "%zu rows out of %zu tokens", rows, total);
    CHECK(finite);
    CHECK(sf_graph_tokens_out(g) == total);
    printf("resident after 20k tokens: %.2f MiB, after 1M: %.2f MiB\n", warm_rss / 1048576.0, end_rss / 1048576.0);
#ifdef UNDER_ASAN
    printf("(AddressSanitizer's quarantine holds freed blocks: the resident-memory bound is checked in the plain build)\n");
#else
    CHECKF(end_rss <= warm_rss + 2 * 1048576, "resident memory grew from %zu to %zu bytes", warm_rss, end_rss);
#endif
    free(tokens);
    sf_graph_free(g);
    sf_model_free(m);
    return check_finish("test_streaming_memory");
}
