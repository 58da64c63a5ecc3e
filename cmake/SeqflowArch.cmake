# Which CPU the C code is compiled for.
#   SEQFLOW_ARCH=""         (default) the compiler's baseline for the target: x86-64 without
#                           AVX on amd64, armv8-a on arm64; the binary runs on any CPU of the
#                           architecture; the hot CPU loops (SF_CPU_DISPATCH in
#                           kernels/cpu/cpu_kernels.h) also have an x86-64-v3 copy that GCC's
#                           target_clones selects at load time, computing the same bits
#   SEQFLOW_ARCH=native     this machine's CPU (-march=native): fastest here, may die with
#                           SIGILL elsewhere; on x86-64 with AVX2 it also compiles the
#                           hand-written AVX2 softmax, whose FMA rounding changes the output's
#                           last bits (the digest) against the portable build
#   SEQFLOW_ARCH=x86-64-v3  (or any other -march value) that CPU level
set(SEQFLOW_ARCH "" CACHE STRING "-march value for the C code (empty: the portable baseline)")
if(SEQFLOW_ARCH)
  if(NOT (CMAKE_C_COMPILER_ID STREQUAL "GNU" OR CMAKE_C_COMPILER_ID MATCHES "Clang"))
    message(FATAL_ERROR "SEQFLOW_ARCH needs GCC or Clang")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-march=${SEQFLOW_ARCH}>")
  message(STATUS "seqflow: C code built for -march=${SEQFLOW_ARCH}")
else()
  message(STATUS "seqflow: C code built for the portable baseline (SEQFLOW_ARCH to change)")
endif()
