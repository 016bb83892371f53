#include "tests/util/small_filesystem.h"

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace zerod::testing {

SmallFilesystem::SmallFilesystem(const std::string& dir, const std::string& size) : dir_(dir) {
  std::filesystem::create_directories(dir);
  const std::string options = "size=" + size + ",mode=0700";
  if (mount("zerod-test", dir.c_str(), "tmpfs", 0, options.c_str()) == 0) {
    mounted_ = true;
  } else {
    error_ = std::string("mount -t tmpfs ") + dir + ": " + std::strerror(errno);
  }
}

SmallFilesystem::~SmallFilesystem() {
  if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
}

}  // namespace zerod::testing
