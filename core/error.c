#include "seqflow/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_message[512];

const char *sf_strerror(int code)
{
    switch (code) {
    case SF_OK: return "success";
    case SF_E_NOMEM: return "out of memory or size limit exceeded";
    case SF_E_INVAL: return "invalid argument";
    case SF_E_IO: return "input/output error";
    case SF_E_MODEL: return "malformed model file";
    case SF_E_CONFIG: return "invalid model configuration";
    case SF_E_TOKEN: return "token id outside the vocabulary";
    case SF_E_INPUT: return "malformed token input";
    case SF_E_PARSE: return "pipeline syntax error";
    case SF_E_STAGE: return "unknown stage";
    case SF_E_OPTION: return "unknown or invalid option";
    case SF_E_BACKEND: return "compute backend error";
    case SF_E_INTERRUPTED: return "interrupted";
    case SF_E_CLOSED: return "closed";
    case SF_E_UNSUPPORTED: return "unsupported";
    case SF_E_STATE: return "saved state does not match";
    case SF_E_FRAME: return "malformed or corrupt frame";
    case SF_E_FRAME_TRUNCATED: return "truncated frame";
    case SF_E_FRAME_VERSION: return "unsupported frame version";
    case SF_E_FRAME_TOO_LARGE: return "frame larger than allowed";
    case SF_E_BUDGET: return "state budget exceeded";
    case SF_E_NONFINITE: return "non-finite value";
    case SF_E_PEER: return "network peer failed";
    default: return "unknown error";
    }
}

const char *sf_last_error(void) { return last_message; }

void sf_clear_error(void) { last_message[0] = '\0'; }

int sf_error(int code, const char *fmt, ...)
{
    /* format aside first: callers often pass sf_last_error() itself as an argument */
    char message[sizeof last_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    memcpy(last_message, message, sizeof message);
    return code;
}
