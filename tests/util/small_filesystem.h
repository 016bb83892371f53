#ifndef ZEROD_TESTS_UTIL_SMALL_FILESYSTEM_H_
#define ZEROD_TESTS_UTIL_SMALL_FILESYSTEM_H_

// A real, small filesystem for full-disk tests: a tmpfs of `size` ("3m") mounted on `dir` for the
// object's life (lazily unmounted: a process may still hold its files when this goes). Mounting
// needs CAP_SYS_ADMIN; where it is refused, mounted() is false and error() says why, for the test
// to skip with.

#include <string>

namespace zerod::testing {

class SmallFilesystem {
 public:
  SmallFilesystem(const std::string& dir, const std::string& size);
  ~SmallFilesystem();
  SmallFilesystem(const SmallFilesystem&) = delete;
  SmallFilesystem& operator=(const SmallFilesystem&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_SMALL_FILESYSTEM_H_
