# ZEROD_FUZZ=ON (clang only): libFuzzer builds. Every target of ours gets libFuzzer's coverage
# instrumentation and ASan+UBSan, so the fuzzer is guided by the parsers' branches, not only by
# the target file's; the targets themselves (tests/fuzz) link libFuzzer's main. Kept apart from
# ZEROD_SANITIZE so a fuzz build folder never mixes with the sanitizer suites' folders.
if(ZEROD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ZEROD_FUZZ needs clang (libFuzzer): configure with ZEROD_COMPILER=clang, "
                        "not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(ZEROD_SANITIZE)
    message(FATAL_ERROR "ZEROD_FUZZ brings its own sanitizers (address,undefined); "
                        "leave ZEROD_SANITIZE empty, not '${ZEROD_SANITIZE}'")
  endif()
  set(_zerod_fuzz_flags -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                        -fno-sanitize-recover=all)
  # -O1 and line tables only, as OSS-Fuzz builds: quicker to compile for CI's fuzz stage, and
  # stacks still name file and line.
  list(APPEND _zerod_fuzz_flags -O1 -gline-tables-only)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_zerod_fuzz_flags}>")
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "zerod: libFuzzer targets (tests/fuzz) with address,undefined")
endif()
