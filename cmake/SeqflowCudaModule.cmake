# The CUDA backend is a module, libseqflow-cuda.so.0, that libseqflow loads with dlopen the first
# time a "cuda" backend is created (kernels/backend.c). libseqflow and the seqflow binary link no
# CUDA library: a CPU run starts, and runs, where the CUDA runtime or cuBLAS are missing.
#
# The module needs from the library only public API (sf_error, sf_clear_error,
# sf_packet_set_host_allocator); it leaves them undefined and takes them from the process:
# from libseqflow.so, or from a program linked with libseqflow.a, which exports its symbols
# for it (ENABLE_EXPORTS; seqflow.pc and the CMake package add -Wl,--export-dynamic to a
# static link). The tests and benchmarks of this tree link the module directly, to reach the
# CUDA backend's internal functions.
if(NOT SEQFLOW_HAVE_CUDA)
  return()
endif()
add_library(seqflow_cuda SHARED ${SEQFLOW_CUDA_SOURCES} ${SEQFLOW_EXTRA_OBJECTS})
set_target_properties(seqflow_cuda PROPERTIES OUTPUT_NAME seqflow-cuda VERSION ${PROJECT_VERSION} SOVERSION 0
                      CUDA_SEPARABLE_COMPILATION OFF)
target_include_directories(seqflow_cuda PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
target_compile_definitions(seqflow_cuda PRIVATE SEQFLOW_HAVE_CUDA=1 _POSIX_C_SOURCE=200809L _DEFAULT_SOURCE)
target_link_libraries(seqflow_cuda PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt Threads::Threads ${CMAKE_DL_LIBS})
# a program of this tree that links the module directly gets libseqflow.a after it on the link
# line, so that the API the module calls is pulled out of the archive
target_link_libraries(seqflow_cuda INTERFACE seqflow_static)

# where the library looks for the module besides its own folder: the install's libdir, relative
# to the folder of the binary or library that holds kernels/backend.c (bin/ -> lib/)
file(RELATIVE_PATH SEQFLOW_BIN_TO_LIB "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}"
     "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
target_compile_definitions(seqflow_objects PRIVATE SEQFLOW_CUDA_MODULE="libseqflow-cuda.so.0"
                           SEQFLOW_BIN_TO_LIB="${SEQFLOW_BIN_TO_LIB}")

# the binary: the module resolves the public API against it; built with it (scripts/run.sh
# builds the seqflow target only)
set_target_properties(seqflow PROPERTIES ENABLE_EXPORTS ON)
add_dependencies(seqflow seqflow_cuda)
# a program linked with libseqflow.a exports the API for the module too
target_link_options(seqflow_static INTERFACE "-Wl,--export-dynamic")

install(TARGETS seqflow_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_SKIP)
