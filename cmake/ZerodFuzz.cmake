# ZEROD_FUZZ=ON (clang only): libFuzzer targets beside an ASan+UBSan build. Every target of ours
# gets libFuzzer's coverage instrumentation, so the fuzzer is guided by the parsers' branches, not
# only by the target file's; the targets themselves (tests/fuzz) link libFuzzer's main. The same
# folder serves the ASan+UBSan test suite, so CI builds the sanitized tree once for both.
if(ZEROD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ZEROD_FUZZ needs clang (libFuzzer): configure with ZEROD_COMPILER=clang, "
                        "not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(ZEROD_SANITIZE STREQUAL "")
    set(ZEROD_SANITIZE "address,undefined")
  elseif(NOT ZEROD_SANITIZE STREQUAL "address,undefined")
    message(FATAL_ERROR "ZEROD_FUZZ runs under address,undefined; "
                        "leave ZEROD_SANITIZE empty or set it to that, not '${ZEROD_SANITIZE}'")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
  message(STATUS "zerod: libFuzzer targets (tests/fuzz) with address,undefined")
endif()
