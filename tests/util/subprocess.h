#ifndef ZEROD_TESTS_UTIL_SUBPROCESS_H_
#define ZEROD_TESTS_UTIL_SUBPROCESS_H_

// Runs a program to completion and captures its exit code, stdout and stderr (tests of the CLIs
// and daemons run the real binaries).

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by one
  std::string out;
  std::string err;
};

ProcessResult RunProcess(const std::vector<std::string>& argv);

// A fresh directory under $TMPDIR, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `contents` to path()/name and returns the full path.
  std::string WriteFile(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

// Flips one bit of the byte at `offset` of the file at `path`, in place: damage for checksums to
// find.
void FlipBit(const std::string& path, int64_t offset);

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_SUBPROCESS_H_
