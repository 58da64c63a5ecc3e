/* Shared by the libFuzzer targets: a failed property aborts, so that libFuzzer keeps the input
 * that broke it, after naming the check and the library's last error. */
#ifndef SEQFLOW_FUZZ_SUPPORT_H
#define SEQFLOW_FUZZ_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>

#include "seqflow/error.h"

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond,    \
                    sf_last_error());                                                        \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#endif
