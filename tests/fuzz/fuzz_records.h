#ifndef ZEROD_TESTS_FUZZ_FUZZ_RECORDS_H_
#define ZEROD_TESTS_FUZZ_FUZZ_RECORDS_H_

// What the fuzz targets with structured input share. Their input format: strings in
// FuzzedDataProvider's encoding (a backslash followed by anything but a backslash ends a string;
// "\\" is one backslash), so that a seed is readable text even where a value is a binary
// PlanInputs; make_corpus writes it. A scratch directory per process. A known-issue filter.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/state/kv_store.h"

namespace zerod::fuzz {

inline constexpr size_t kMaxRecordBytes = 1 << 16;

// One string as FuzzedDataProvider::ConsumeRandomLengthString reads it back.
inline std::string EncodeString(absl::string_view s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\\') out += '\\';
  }
  out += "\\\n";
  return out;
}

// A fresh directory for this process's state (in /dev/shm when there is one: the targets write
// to it on every input), removed when the run ends normally; a crash leaves it for inspection.
inline std::filesystem::path ScratchDir(const std::string& name) {
  namespace fs = std::filesystem;
  static fs::path dir;  // one per process: the targets call this once
  const fs::path base = fs::exists("/dev/shm") ? "/dev/shm" : fs::temp_directory_path();
  dir = base / absl::StrCat(name, "-", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::atexit([] {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  });
  return dir;
}

}  // namespace zerod::fuzz

#endif  // ZEROD_TESTS_FUZZ_FUZZ_RECORDS_H_
