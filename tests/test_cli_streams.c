/* Several inputs in one run (`-i a -i b -i c`): input k is stream k, the inputs take turns of one
 * segment each, so the output holds, round by round, each stream's next segment. Checked against
 * the same inputs run one at a time (each stream's rows are what its own run gives), against
 * itself with checkpoints on (the same bytes), and against a resume from an early checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/spawn.h"

#define N_INPUTS 3

static void write_random(const char *path, size_t len, unsigned seed)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    srand(seed);
    for (size_t i = 0; i < len; i++) fputc(rand() & 0xff, f);
    fclose(f);
}

static int run_ok(const char *const *argv, const char *what)
{
    spawn_result r;
    int ok = spawn_run(argv, NULL, 0, &r) == 0 && r.exit_code == 0;
    CHECKF(ok, "%s: exit %d: %s", what, r.exit_code, r.err);
    return ok;
}

int main(void)
{
    if (!spawn_binary()) return check_skip("SEQFLOW_BIN is not set");
    sf_model_config cfg; /* the built-in model's: what `seqflow run` uses without --model */
    sf_model_config_default(&cfg);
    const size_t seg = (size_t)cfg.segment, row = (size_t)cfg.dim * sizeof(float);

    /* lengths in segments: 3.5, 2 and a fraction, and less than one */
    const size_t lens[N_INPUTS] = {seg * 7 / 2, seg * 2 + 37, seg / 3};
    char in[N_INPUTS][512], out[N_INPUTS][512];
    for (int k = 0; k < N_INPUTS; k++) {
        char name[32];
        snprintf(name, sizeof name, "streams-in%d.bin", k);
        snprintf(in[k], sizeof in[k], "%s", check_tmp_path(name));
        write_random(in[k], lens[k], 11u + (unsigned)k);
        snprintf(name, sizeof name, "streams-out%d.f32", k);
        snprintf(out[k], sizeof out[k], "%s", check_tmp_path(name));
        const char *one[] = {"seqflow", "run", "-q", "-i", in[k], "-o", out[k], NULL};
        run_ok(one, "one input");
    }
    char all[512], ckpt_out[512], dir[512];
    snprintf(all, sizeof all, "%s", check_tmp_path("streams-all.f32"));
    snprintf(ckpt_out, sizeof ckpt_out, "%s", check_tmp_path("streams-ckpt.f32"));
    snprintf(dir, sizeof dir, "%s", check_tmp_path("streams-ckpt"));
    const char *several[] = {"seqflow", "run", "-q", "-i", in[0], "-i", in[1], "-i", in[2], "-o", all, NULL};
    run_ok(several, "three inputs");

    /* the expected bytes: round r holds segment r of every stream that has one */
    size_t len_all = 0;
    unsigned char *got = check_read_file(all, &len_all);
    unsigned char *one[N_INPUTS];
    size_t one_len[N_INPUTS], at[N_INPUTS] = {0}, total = 0;
    for (int k = 0; k < N_INPUTS; k++) {
        one[k] = check_read_file(out[k], &one_len[k]);
        CHECKF(one[k] && one_len[k] == lens[k] * row, "input %d alone: %zu bytes, want %zu", k, one[k] ? one_len[k] : 0,
               lens[k] * row);
        total += one_len[k];
    }
    CHECKF(got && len_all == total, "three inputs: %zu bytes, want %zu", got ? len_all : 0, total);
    if (got && len_all == total) {
        size_t pos = 0;
        int same = 1;
        while (pos < total && same) {
            for (int k = 0; k < N_INPUTS && same; k++) {
                size_t take = one_len[k] - at[k] < seg * row ? one_len[k] - at[k] : seg * row;
                if (!take) continue;
                same = memcmp(got + pos, one[k] + at[k], take) == 0;
                CHECKF(same, "three inputs: stream %d's rows from %zu differ from its own run", k, at[k] / row);
                pos += take;
                at[k] += take;
            }
        }
    }

    /* checkpoints on, every segment: the same bytes */
    const char *checkpointed[] = {"seqflow", "run", "-q", "-i", in[0], "-i", in[1], "-i", in[2], "-o", ckpt_out,
                                  "--checkpoint", dir, "--checkpoint-every", "1", NULL};
    if (run_ok(checkpointed, "three inputs, checkpoints"))
        CHECKF(check_same_file(ckpt_out, all), "three inputs: checkpoints changed the output");

    /* a resume from the oldest checkpoint kept (the newer ones removed): the same bytes again */
    char newest[3][1024];
    int kept = 0;
    FILE *ls = NULL;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s | grep '^ckpt-' | sort", dir);
    if ((ls = popen(cmd, "r")) != NULL) {
        char line[256];
        while (kept < 3 && fgets(line, sizeof line, ls)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(newest[kept++], sizeof newest[0], "%s/%s", dir, line);
        }
        pclose(ls);
    }
    CHECKF(kept == 3, "three inputs: %d checkpoints kept, want 3", kept);
    if (kept == 3) {
        unlink(newest[1]);
        unlink(newest[2]);
        const char *resumed[] = {"seqflow", "run", "-q", "-i", in[0], "-i", in[1], "-i", in[2], "-o", ckpt_out,
                                 "--checkpoint", dir, "--checkpoint-every", "1", "--resume", NULL};
        if (run_ok(resumed, "three inputs, resumed"))
            CHECKF(check_same_file(ckpt_out, all), "three inputs: the resumed run's output differs");
    }

    /* a name holding ',' cannot be one of several inputs */
    spawn_result r;
    const char *comma[] = {"seqflow", "run", "-q", "-i", "a,b", NULL};
    CHECK(spawn_run(comma, NULL, 0, &r) == 0 && r.exit_code == 2 && strstr(r.err, "','"));

    free(got);
    for (int k = 0; k < N_INPUTS; k++) free(one[k]);
    return check_finish("test_cli_streams");
}
