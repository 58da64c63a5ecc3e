/* `seqflow worker --sequence`: one rank of a sequence-parallel job (stages/block_seq.h) over the
 * job's network (tools/sequence_cli.c; docs/DISTRIBUTED.md, "Sequence parallelism"). Every rank
 * reads its own chunks of the input file and writes its rows into the output file at their
 * place; what crosses between ranks is only the exchange of states. */
#ifndef SEQFLOW_TOOLS_SEQUENCE_CLI_H
#define SEQFLOW_TOOLS_SEQUENCE_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "pipeline/net.h"
#include "pipeline/topology.h"
#include "seqflow/buffer.h"
#include "tools/run_common.h"

#define SEQ_MAX_RANKS 256

typedef struct seq_args {
    int on;                       /* --sequence given */
    int handoff;                  /* --sequence handoff (else scan) */
    int federation;               /* --federation */
    int balance;                  /* --balance */
    int chunks[SEQ_MAX_RANKS];    /* --chunks: segments a round per rank */
    int n_chunks;                 /* how many were given (1: the same for every rank) */
} seq_args;

/* Parses --sequence MODE, --chunks LIST, --balance or --federation at argv[*i] (advancing *i past its
 * value). Returns 1 when it took the option, 0 when argv[*i] is not one of them, or -2 after
 * printing a message (exit status 2). */
int seq_parse_option(int argc, char **argv, int *i, seq_args *s);

/* The text every rank's rendezvous compares (its hash): mode and chunks. */
void seq_describe(const seq_args *s, char *buf, size_t size);

/* Rank 0 with --resume: the newest saved state in the checkpoint folder into out (round index
 * first, then sf_seq_state_save's bytes); nothing (out empty) when there is none. */
int seq_load_resume(const char *dir, sf_buffer *out);

/* The checks a rank makes before the rendezvous: input a regular file in bytes or u32, output
 * raw or npy float32, a model on the cpu. Returns 0 or the exit status (message printed). */
int seq_check(const run_ctx *c, const seq_args *s, int world);

/* Runs this rank's part once the network is up: resume is the payload rank 0 handed out
 * (seq_load_resume's bytes; NULL or empty: from the start). Returns the exit status. */
int seq_run(run_ctx *c, const seq_args *s, sf_net *net, const sf_topology *topology, int rank, int world,
            const uint8_t *resume, size_t resume_len, const char *label);

#endif
