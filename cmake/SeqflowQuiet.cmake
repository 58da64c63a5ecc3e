# Every CUDA object created after this is compiled through cmake/cuda_quiet.sh, which drops
# ptxas's advisory note C7519 (and nothing else) from the compiler's output. A launcher the
# user set (CMAKE_CUDA_COMPILER_LAUNCHER, e.g. ccache) still runs, inside it.
if(NOT SEQFLOW_CUDA_QUIET_SET)
  set(SEQFLOW_CUDA_QUIET_SET ON)
  set(CMAKE_CUDA_COMPILER_LAUNCHER sh ${CMAKE_CURRENT_LIST_DIR}/cuda_quiet.sh ${CMAKE_CUDA_COMPILER_LAUNCHER})
endif()
