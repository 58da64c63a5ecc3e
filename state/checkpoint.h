/* Checkpoint files: one directory holds DIR/ckpt-<seq, 20 digits>.sqf, each a single frame of
 * kind SF_FRAME_CHECKPOINT (compress/frame.h) whose u8 payload is opaque here (the graph's
 * layout lives in pipeline/checkpointing.c). The frame's checksums catch truncation and
 * flipped bits; the sequence number is also the frame's segment index.
 *
 * Writing is atomic against a crash at any moment: the frame goes to DIR/.ckpt-<seq>.tmp, is
 * fsync'ed, renamed into place and the directory is fsync'ed; only then are checkpoints older
 * than the newest `keep` deleted. A reader therefore sees either the complete new file or none.
 *
 * Ownership: paths are borrowed; sf_checkpoint_load_newest gives the caller a malloc'd payload
 * (free()). */
#ifndef SEQFLOW_MEMORY_CHECKPOINT_H
#define SEQFLOW_MEMORY_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "compress/frame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates dir (one level) when it does not exist. */
int sf_checkpoint_dir_prepare(const char *dir);

/* Writes payload[0..len) as checkpoint seq (replacing a file of that number) and keeps the
 * newest `keep` (>= 1) checkpoints. */
int sf_checkpoint_write(const char *dir, uint64_t seq, const void *payload, size_t len, sf_codec codec,
                        int keep);

/* A checkpoint directory belongs to one run at a time: sf_checkpoint_lock takes an exclusive
 * flock on DIR/seqflow.lock (created when missing) and writes the caller's PID into it. The
 * kernel drops the lock when the process dies, however it dies, so a killed run never blocks
 * the resume that follows. When another process holds it, fails at once with SF_E_IO naming
 * that process's PID. On success *fd is the open lock file, to be passed to
 * sf_checkpoint_unlock (which accepts -1) when the run is over; the lock file stays. */
int sf_checkpoint_lock(const char *dir, int *fd);
void sf_checkpoint_unlock(int fd);

/* Sequence numbers of the checkpoint files in dir, ascending (*seqs malloc'd, free(); NULL when
 * *n is 0). A missing directory holds none. */
int sf_checkpoint_list(const char *dir, uint64_t **seqs, size_t *n);

/* Deletes every checkpoint file (and leftover temp file) of dir. */
int sf_checkpoint_clear(const char *dir);

/* Reports one line for each damaged checkpoint that was skipped. */
typedef void (*sf_checkpoint_report_fn)(void *user, const char *line);

/* Loads the newest checkpoint that decodes (frame checks pass, at most max_bytes); every newer
 * damaged one is reported (naming the file and the problem) and skipped. SF_OK with *payload
 * NULL and *seq 0 when dir holds no checkpoint; SF_E_STATE when it holds some but none is
 * valid. */
int sf_checkpoint_load_newest(const char *dir, size_t max_bytes, sf_checkpoint_report_fn report, void *user,
                              uint64_t *seq, uint8_t **payload, size_t *len);

/* Writes "DIR/ckpt-<seq>.sqf" into buf (SF_E_INVAL when it does not fit). */
int sf_checkpoint_path(const char *dir, uint64_t seq, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
