# Installation: `cmake --install BUILD [--prefix DIR]` puts
#   bin/seqflow, include/seqflow/*.h,
#   lib/libseqflow.so.0 (+ libseqflow.so) and lib/libseqflow.a,
#   lib/pkgconfig/seqflow.pc (relocatable: its prefix is found from the file's own place),
#   lib/cmake/seqflow/ (find_package(seqflow): seqflow::seqflow, seqflow::seqflow_static),
#   share/man/man1/seqflow.1.
# `cpack -G DEB` in the build folder packs the same files as seqflow_VERSION_ARCH.deb.
include(CMakePackageConfigHelpers)

set_target_properties(seqflow_shared PROPERTIES EXPORT_NAME seqflow)
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  target_link_options(seqflow_shared PRIVATE "-Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/seqflow.map")
  set_property(TARGET seqflow_shared APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/seqflow.map)
endif()
set_target_properties(seqflow_static PROPERTIES EXPORT_NAME seqflow_static)

install(DIRECTORY include/seqflow DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(TARGETS seqflow RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS seqflow_shared seqflow_static EXPORT seqflowTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# the man page gzipped, as Debian installs man pages (-n: no time stamp, reproducible)
find_program(SEQFLOW_GZIP gzip)
if(SEQFLOW_GZIP)
  add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/seqflow.1.gz
                     COMMAND ${SEQFLOW_GZIP} -n -9 -c ${PROJECT_SOURCE_DIR}/docs/seqflow.1 > ${CMAKE_CURRENT_BINARY_DIR}/seqflow.1.gz
                     DEPENDS ${PROJECT_SOURCE_DIR}/docs/seqflow.1 VERBATIM)
  add_custom_target(seqflow_man ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/seqflow.1.gz)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/seqflow.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  install(FILES docs/seqflow.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()

# ---- pkg-config ------------------------------------------------------------------------------
# prefix relative to the .pc file, so that a copied or relocated tree (and a .deb) still works
set(SEQFLOW_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(SEQFLOW_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(SEQFLOW_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH SEQFLOW_PC_UP "/root/${SEQFLOW_PC_DIR}" "/root")
  string(REGEX REPLACE "/$" "" SEQFLOW_PC_UP "${SEQFLOW_PC_UP}")
  set(SEQFLOW_PC_PREFIX "\${pcfiledir}/${SEQFLOW_PC_UP}")
  set(SEQFLOW_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(SEQFLOW_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(SEQFLOW_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# what a static link needs beyond the Requires.private modules: libzmq (see seqflow.pc.in),
# OpenMP, threads, libm, libdl,
# and in a CUDA build --export-dynamic, so that the CUDA backend module (libseqflow-cuda.so.0,
# which links the CUDA libraries itself) finds the sf_ API in the program
set(SEQFLOW_PC_LIBS_PRIVATE "-lzmq ${OpenMP_C_FLAGS} -lpthread -lm -ldl")
if(SEQFLOW_HAVE_CUDA)
  string(APPEND SEQFLOW_PC_LIBS_PRIVATE " -Wl,--export-dynamic")
endif()
configure_file(seqflow.pc.in ${CMAKE_CURRENT_BINARY_DIR}/seqflow.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/seqflow.pc DESTINATION ${SEQFLOW_PC_DIR})

# ---- CMake package ---------------------------------------------------------------------------
set(SEQFLOW_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/seqflow)
install(EXPORT seqflowTargets NAMESPACE seqflow:: DESTINATION ${SEQFLOW_CMAKE_DIR})
configure_package_config_file(cmake/seqflowConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/seqflowConfig.cmake
                              INSTALL_DESTINATION ${SEQFLOW_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/seqflowConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/seqflowConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/seqflowConfigVersion.cmake
        DESTINATION ${SEQFLOW_CMAKE_DIR})

# ---- Debian package (cpack -G DEB) -----------------------------------------------------------
set(CPACK_PACKAGE_NAME seqflow)
set(CPACK_PACKAGE_VENDOR "seqflow")
set(CPACK_PACKAGE_CONTACT "seqflow maintainers <seqflow@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Streaming pipeline framework for unbounded token sequences")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Depends: the run-time libraries from dpkg-shlibdeps (libopenblas0, libzstd1, ...), and since
# the one package also holds the headers, seqflow.pc and the static library, the -dev packages
# that pkg-config (Requires.private) and find_package(seqflow) look up
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libopenblas-dev, libcjson-dev, libzmq3-dev, liblz4-dev, libzstd-dev, libxxhash-dev")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "pkg-config")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
include(CPack)

# ---- tests of the installed tree -------------------------------------------------------------
# (not in sanitizer builds: an application built without the sanitizers cannot link them)
if(SEQFLOW_BUILD_TESTS AND NOT SEQFLOW_SANITIZE)
  # installs into a temporary prefix, then builds examples/ against it with pkg-config
  # (shared and --static) and find_package(seqflow), and runs the three programs
  add_test(NAME install_consumer COMMAND sh ${PROJECT_SOURCE_DIR}/tests/install_consumer.sh
           ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR}/examples ${PROJECT_BINARY_DIR}/tests/tmp/install)
  set_tests_properties(install_consumer PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
  # libseqflow.so exports the functions of the public headers and nothing else, under its soname
  if(NOT SEQFLOW_HAVE_CUDA)
    add_test(NAME cpu_only COMMAND sh ${PROJECT_SOURCE_DIR}/tests/cpu_only.sh $<TARGET_FILE:seqflow>
             $<TARGET_FILE:seqflow_shared>)
  else()
    # the CUDA backend is a module: CPU runs need no CUDA library, even hidden ones
    add_test(NAME cuda_module COMMAND sh ${PROJECT_SOURCE_DIR}/tests/cuda_module.sh $<TARGET_FILE:seqflow>
             $<TARGET_FILE:seqflow_shared> $<TARGET_FILE:seqflow_cuda>)
  endif()
  # the CUDA compiler launcher drops ptxas's C7519 note and nothing else
  add_test(NAME cuda_quiet COMMAND sh ${PROJECT_SOURCE_DIR}/tests/cuda_quiet.sh ${PROJECT_SOURCE_DIR}/cmake/cuda_quiet.sh
           ${PROJECT_BINARY_DIR}/tests/tmp/cuda_quiet)
  # cpack -G DEB builds a package whose Depends name the run-time libraries and whose
  # contents work from where they are unpacked (skipped without dpkg-deb)
  add_test(NAME deb_package COMMAND sh ${PROJECT_SOURCE_DIR}/tests/deb_package.sh ${CMAKE_BINARY_DIR}
           ${PROJECT_SOURCE_DIR}/examples ${PROJECT_BINARY_DIR}/tests/tmp/deb)
  set_tests_properties(deb_package PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 RUN_SERIAL ON)
  # the portable build runs without AVX (baseline kernels) and with AVX2 (AVX2 + FMA kernels),
  # the outputs within 1e-5 of each other
  if(NOT SEQFLOW_ARCH)
    add_test(NAME portable_cpu COMMAND sh ${PROJECT_SOURCE_DIR}/tests/portable_cpu.sh $<TARGET_FILE:seqflow>)
    set_tests_properties(portable_cpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
  endif()
  # the C code compiles for arm64 with Debian's cross gcc (skipped without it)
  add_test(NAME cross_aarch64 COMMAND sh ${PROJECT_SOURCE_DIR}/tests/cross_aarch64.sh ${PROJECT_SOURCE_DIR}
           ${PROJECT_BINARY_DIR}/tests/tmp/cross_aarch64)
  set_tests_properties(cross_aarch64 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
  add_test(NAME shared_exports COMMAND sh ${PROJECT_SOURCE_DIR}/tests/shared_exports.sh
           $<TARGET_FILE:seqflow_shared> ${PROJECT_SOURCE_DIR}/include/seqflow)
endif()
