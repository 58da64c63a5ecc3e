# Which CPU the C code is compiled for.
#   SEQFLOW_ARCH=""         (default) the compiler's baseline for the target: x86-64 without
#                           AVX on amd64, armv8-a on arm64; the binary runs on any CPU of the
#                           architecture. On x86-64 the exp-bound row kernels
#                           (kernels/cpu/vector_rows.h) also have an AVX2 + FMA form, taken at
#                           run time where the CPU has both, and other hot loops (SF_CPU_DISPATCH
#                           in kernels/cpu/cpu_kernels.h) an x86-64-v3 copy that GCC's
#                           target_clones selects at load time. The two kernel forms agree
#                           within 1e-5 (relative, per row of the output), not to the bit
#   SEQFLOW_ARCH=native     this machine's CPU (-march=native): may die with SIGILL elsewhere
#   SEQFLOW_ARCH=x86-64-v3  (or any other -march value) that CPU level; one with AVX2 and FMA
#                           (x86-64-v3 has both) runs the AVX2 + FMA kernels only, and its output
#                           is the default build's on a CPU with them
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
