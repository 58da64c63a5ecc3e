/* seqflow error convention: every fallible call returns int, 0 (SF_OK) on success and a
 * negative sf_status on failure. The one-line human message of the most recent failure on
 * the calling thread is kept by sf_last_error(); graphs keep the first failure of any of
 * their threads (sf_graph_error). */
#ifndef SEQFLOW_ERROR_H
#define SEQFLOW_ERROR_H

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef enum sf_status {
    SF_OK = 0,
    SF_E_NOMEM = -1,        /* allocation failed or a size bound was exceeded */
    SF_E_INVAL = -2,        /* a caller passed an invalid argument */
    SF_E_IO = -3,           /* reading or writing a file or stream failed */
    SF_E_MODEL = -4,        /* a model file is malformed (names the tensor or key) */
    SF_E_CONFIG = -5,       /* an inconsistent model configuration */
    SF_E_TOKEN = -6,        /* a token id outside the vocabulary */
    SF_E_INPUT = -7,        /* malformed token input (e.g. uint32 length not a multiple of 4) */
    SF_E_PARSE = -8,        /* a pipeline string could not be parsed */
    SF_E_STAGE = -9,        /* unknown stage name */
    SF_E_OPTION = -10,      /* unknown option or invalid option value */
    SF_E_BACKEND = -11,     /* a compute backend failed or is unavailable */
    SF_E_INTERRUPTED = -12, /* the run was interrupted (SIGINT); output was flushed */
    SF_E_CLOSED = -13,      /* the graph or queue was closed */
    SF_E_UNSUPPORTED = -14, /* valid request this build cannot serve */
    SF_E_STATE = -15,       /* saved state does not match the stage or model */
    SF_E_FRAME = -16,       /* a frame is malformed or fails its checksum */
    SF_E_FRAME_TRUNCATED = -17, /* a frame ends before its header says it does */
    SF_E_FRAME_VERSION = -18,   /* a frame of an unknown or newer format version */
    SF_E_FRAME_TOO_LARGE = -19, /* a frame claims more bytes than the caller allows */
    SF_E_BUDGET = -20,      /* a state store cannot stay within its byte budget */
    SF_E_NONFINITE = -21,   /* a computed value is NaN or infinite (weights or input overflow float32) */
    SF_E_PEER = -22         /* a network peer is dead, silent, unreachable, refused us or broke the protocol */
} sf_status;

/* Static description of a status code; never NULL, never to be freed. */
const char *sf_strerror(int code);

/* The detailed message of the last failure recorded on this thread (or "" if none).
 * The pointer stays valid until the next seqflow call on this thread. */
const char *sf_last_error(void);

/* Records a formatted message for this thread and returns code, so that a failing path can
 * read `return sf_error(SF_E_MODEL, "tensor %s missing", name);`. For stage authors. */
int sf_error(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Forgets this thread's last message. */
void sf_clear_error(void);

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
