# Helpers that declare a target in one line with the project's warnings (abseil's absl_cc_test).

# Under clang, -Wthread-safety checks every ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED against
# zerod::Mutex (runtime/common/mutex.h); GCC has no such analysis.
function(zerod_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wthread-safety>)
endfunction()

# In a TSan build, every executable carries tests/tsan/absl_sync_annotations.cc (cmake/ZerodSanitize).
function(zerod_tsan_runtime target)
  if(TARGET zerod_tsan_absl_sync)
    target_link_libraries(${target} PRIVATE zerod_tsan_absl_sync)
  endif()
endfunction()

# zerod_library(NAME SOURCES ... DEPS ...)
function(zerod_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  zerod_warnings(${name})
endfunction()

# zerod_binary(NAME SOURCES ... DEPS ...)
function(zerod_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  zerod_warnings(${name})
  zerod_tsan_runtime(${name})
endfunction()

# Where tests keep what the SDK would save under ~/.config (XDG_CONFIG_HOME).
set(ZEROD_TEST_CONFIG_HOME ${CMAKE_BINARY_DIR}/tests/config)

# zerod_test(NAME SOURCES ... DEPS ... [LABELS ...]): a GoogleTest binary whose cases ctest lists.
# SINGLE_THREADED: the code under test runs on the caller's thread alone, so ThreadSanitizer has
# nothing to check there and a TSan build leaves the test out (ASan and the plain build run it).
function(zerod_test name)
  cmake_parse_arguments(ARG "SINGLE_THREADED" "" "SOURCES;DEPS;LABELS" ${ARGN})
  if(ARG_SINGLE_THREADED AND ZEROD_SANITIZE MATCHES "thread")
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  zerod_warnings(${name})
  zerod_tsan_runtime(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # Job tokens the SDK saves for ranks started without zerorun go to the build folder, not to the
  # user's ~/.config/zerod.
  set(env ENVIRONMENT "XDG_CONFIG_HOME=${ZEROD_TEST_CONFIG_HOME}")
  if("gpu" IN_LIST ARG_LABELS)
    # Without a device these tests print "skipped: no CUDA device": ctest counts them skipped.
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "${ARG_LABELS}" ${env}
                         SKIP_REGULAR_EXPRESSION "skipped: no CUDA device")
  elseif(ARG_LABELS)
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "${ARG_LABELS}" ${env})
  else()
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES ${env})
  endif()
endfunction()
