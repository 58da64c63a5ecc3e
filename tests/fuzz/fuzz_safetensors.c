/* Fuzzes the safetensors model loader (model/safetensors.c). sf_model_load takes a path, so
 * the input is written to a memfd and loaded through /proc/self/fd/N: the loader runs exactly
 * as on a real file, fstat included. A model that loads must be valid, and must survive a
 * save/load round trip unchanged (configuration and every weight bit; F16/BF16 inputs come
 * back as the same float32 values). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/model_internal.h"
#include "seqflow/error.h"
#include "seqflow/model.h"

#include "tests/fuzz/fuzz_support.h"

static int input_fd = -1;
static char input_path[64];
static char roundtrip_dir[64];
static char roundtrip_path[96];

static void remove_roundtrip_dir(void)
{
    unlink(roundtrip_path);
    rmdir(roundtrip_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    input_fd = memfd_create("fuzz_safetensors", MFD_CLOEXEC);
    FUZZ_CHECK(input_fd >= 0);
    snprintf(input_path, sizeof input_path, "/proc/self/fd/%d", input_fd);
    const char *tmp = getenv("TMPDIR");
    snprintf(roundtrip_dir, sizeof roundtrip_dir, "%s/seqflow-fuzz-XXXXXX",
             tmp && *tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    FUZZ_CHECK(mkdtemp(roundtrip_dir) != NULL);
    snprintf(roundtrip_path, sizeof roundtrip_path, "%s/model.safetensors", roundtrip_dir);
    atexit(remove_roundtrip_dir);
    return 0;
}

static void write_input(const uint8_t *data, size_t size)
{
    FUZZ_CHECK(ftruncate(input_fd, 0) == 0);
    size_t done = 0;
    while (done < size) {
        ssize_t k = pwrite(input_fd, data + done, size - done, (off_t)done);
        FUZZ_CHECK(k > 0);
        done += (size_t)k;
    }
}

static void check_same_config(const sf_model_config *a, const sf_model_config *b)
{
    FUZZ_CHECK(a->dim == b->dim && a->heads == b->heads && a->head_dim == b->head_dim);
    FUZZ_CHECK(a->vocab == b->vocab && a->layers == b->layers && a->segment == b->segment);
    FUZZ_CHECK(a->n_branches == b->n_branches);
    for (int i = 0; i < a->n_branches; i++)
        FUZZ_CHECK(a->branches[i].window == b->branches[i].window &&
                   a->branches[i].dilation == b->branches[i].dilation);
    FUZZ_CHECK(a->causal == b->causal && a->memory == b->memory);
    FUZZ_CHECK(a->global_tokens == b->global_tokens && a->summary_tokens == b->summary_tokens);
    FUZZ_CHECK(memcmp(&a->norm_eps, &b->norm_eps, sizeof a->norm_eps) == 0);
    FUZZ_CHECK(a->mlp_hidden == b->mlp_hidden && a->final_norm == b->final_norm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_input(data, size);
    sf_model *m = NULL;
    sf_clear_error();
    int rc = sf_model_load(input_path, &m);
    if (rc != SF_OK) {
        FUZZ_CHECK(m == NULL);
        FUZZ_CHECK(rc == SF_E_MODEL || rc == SF_E_CONFIG || rc == SF_E_NOMEM || rc == SF_E_IO);
        FUZZ_CHECK(sf_last_error()[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(m != NULL);
    FUZZ_CHECK(sf_model_config_validate(sf_model_get_config(m)) == SF_OK);
    /* Every weight came out of the file, so they cannot outnumber its bytes / 2 (F16). */
    FUZZ_CHECK(m->arena_floats <= size / 2);

    FUZZ_CHECK(sf_model_save(m, roundtrip_path) == SF_OK);
    sf_model *again = NULL;
    FUZZ_CHECK(sf_model_load(roundtrip_path, &again) == SF_OK);
    check_same_config(sf_model_get_config(m), sf_model_get_config(again));
    FUZZ_CHECK(m->arena_floats == again->arena_floats);
    FUZZ_CHECK(memcmp(m->arena, again->arena, m->arena_floats * sizeof(float)) == 0);
    sf_model_free(again);
    sf_model_free(m);
    unlink(roundtrip_path);
    return 0;
}
