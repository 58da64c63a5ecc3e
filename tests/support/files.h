/* File helpers shared by the tests that check what a run left on disk. */
#ifndef SEQFLOW_TEST_FILES_H
#define SEQFLOW_TEST_FILES_H

#include <stddef.h>

/* The whole file, NUL-terminated (so that stderr captures can be searched as text); *len is
 * its size without the NUL. NULL when it cannot be opened. The caller frees the result. */
unsigned char *check_read_file(const char *path, size_t *len);

/* 1 when path names anything (file or directory). */
int check_path_exists(const char *path);

/* 1 when both files open and hold the same bytes. */
int check_same_file(const char *a, const char *b);

/* Entries of dir not starting with '.', or -1 when it cannot be opened. A subdirectory whose
 * name starts with descend_prefix (a state store's own spill folder) is counted through,
 * as its entries instead of one; NULL counts every entry as one. */
int check_count_files(const char *dir, const char *descend_prefix);

#endif
