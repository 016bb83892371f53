# ZEROD_SANITIZE=address,undefined | thread: applied to every target so that libraries and tests
# agree on the runtime. Sanitizer builds compile at -O1 whatever the build type. ASan+UBSan keeps
# line tables only (stacks still name file and line; the build costs a third of -O2 -g). TSan keeps
# full debug info: its suppressions (tests/tsan/suppressions.txt) and tests/tsan/filter.py match
# qualified function names, which line tables lose for inlined frames.
if(ZEROD_SANITIZE)
  if(ZEROD_SANITIZE MATCHES "thread" AND ZEROD_SANITIZE MATCHES "address")
    message(FATAL_ERROR "ZEROD_SANITIZE: thread cannot be combined with address")
  endif()
  set(_zerod_san_flags -fsanitize=${ZEROD_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_zerod_san_flags}>")
  add_link_options(${_zerod_san_flags})
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-O1>")
  if(ZEROD_SANITIZE MATCHES "thread")
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-g>")
  elseif(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-gline-tables-only>")
  else()
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-g1>")
  endif()
  if(ZEROD_SANITIZE MATCHES "thread")
    # Makes Debian's absl::Mutex (gRPC's lock) visible to TSan; every executable links it
    # (zerod_binary, zerod_test).
    add_library(zerod_tsan_absl_sync OBJECT ${CMAKE_SOURCE_DIR}/tests/tsan/absl_sync_annotations.cc)
  endif()
  message(STATUS "zerod: sanitizers ${ZEROD_SANITIZE} (${CMAKE_CXX_COMPILER_ID})")
endif()
