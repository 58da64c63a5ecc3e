/* Which symbols libseqflow.so exports. The library is compiled with -fvisibility=hidden, so
 * that its internal functions stay internal; every public header opens its declarations with
 * SF_API_BEGIN and closes them with SF_API_END, which makes what it declares the exported
 * API (the sf_ functions of include/seqflow, nothing else). SF_API marks a single
 * declaration the same way. For an application these change nothing. */
#ifndef SEQFLOW_EXPORT_H
#define SEQFLOW_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define SF_API __attribute__((visibility("default")))
#define SF_API_BEGIN _Pragma("GCC visibility push(default)")
#define SF_API_END _Pragma("GCC visibility pop")
#else
#define SF_API
#define SF_API_BEGIN
#define SF_API_END
#endif

#endif
