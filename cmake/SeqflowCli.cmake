# The seqflow command's sources beside tools/seqflow.c: messages, progress and JSON output, the
# steady rate of --stats-json.
target_sources(seqflow PRIVATE ${PROJECT_SOURCE_DIR}/tools/cli_output.c ${PROJECT_SOURCE_DIR}/tools/steady_rate.c)
if(SEQFLOW_BUILD_TESTS AND TARGET test_cli_output)
  # the test calls the functions of tools/cli_output.c directly, besides running the binary
  target_sources(test_cli_output PRIVATE ${PROJECT_SOURCE_DIR}/tools/cli_output.c)
endif()
if(SEQFLOW_BUILD_TESTS)
  # the JSON outputs against tests/schema (skipped without python3-jsonschema)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    add_test(NAME json_schema COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/json_schema.py
             $<TARGET_FILE:seqflow> ${PROJECT_SOURCE_DIR}/tests/schema ${PROJECT_BINARY_DIR}/tests/tmp)
    set_tests_properties(json_schema PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endif()
if(SEQFLOW_BUILD_TESTS)
  # docs/seqflow.1 keeps up with `seqflow --help`
  add_test(NAME man_page COMMAND sh ${PROJECT_SOURCE_DIR}/tests/man_page.sh $<TARGET_FILE:seqflow>
           ${PROJECT_SOURCE_DIR}/docs/seqflow.1)
endif()
