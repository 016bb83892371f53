// The C API's JSON options (zerod_session_start, zerod_engine_create): the text Python passes,
// checked field by field. The parsers are file-local to zerod_c.cc and the public functions go on
// to join a job, so the file is compiled into this target to reach them without a daemon.
// (A split of zerod_c.cc's option parsing into its own file would let this include a header.)

#include <cstddef>
#include <cstdint>
#include <string>

#include "client/c_api/zerod_c.cc"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);  // NUL-terminated, as from C
  (void)ParseSessionOptions(text.c_str());
  (void)ParseEngineOptions(text.c_str());
  return 0;
}
