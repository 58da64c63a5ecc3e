/* Whole-file writes and reads, shared by the state store's spill files and the checkpoints:
 * one place for the write-all / fsync / rename sequence and the read-until-done loop.
 *
 * Ownership: every path is borrowed; sf_read_file_alloc gives the caller a malloc'd buffer
 * (free()). Errors name the file and, for a failed system call, strerror's text. */
#ifndef SEQFLOW_MEMORY_FILE_IO_H
#define SEQFLOW_MEMORY_FILE_IO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes data[0..len) to tmp_path (created with mode, truncated), fsyncs it when sync is
 * non-zero, closes it and renames it to path, so that path holds either what it held before
 * or all of data. On any failure tmp_path is removed and SF_E_IO returned. Making the rename
 * itself durable (fsync of the directory) is left to the caller. */
int sf_write_file_atomic(const char *path, const char *tmp_path, const void *data, size_t len,
                         int sync, unsigned mode);

/* Reads the whole file at path into *data (malloc'd, non-NULL even for an empty file; NULL on
 * failure) and its size into *len. SF_E_FRAME_TOO_LARGE when it holds more than limit bytes,
 * SF_E_FRAME_TRUNCATED when it shrinks while being read, SF_E_IO when it cannot be opened,
 * stat'ed or read, SF_E_NOMEM. */
int sf_read_file_alloc(const char *path, size_t limit, uint8_t **data, size_t *len);

/* Reads the file at path, which must hold exactly len bytes, into dst. SF_E_FRAME_TRUNCATED
 * when it holds another number of bytes (or shrinks while being read), SF_E_IO when it cannot
 * be opened, stat'ed or read. */
int sf_read_file_exact(const char *path, void *dst, size_t len);

#ifdef __cplusplus
}
#endif
#endif
