#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_CHECKSUMS_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_CHECKSUMS_H_

// The checksums of a checkpoint file, computed as its bytes stream past (written or read once):
// XXH3-64 of the whole file and of each kChecksumBlockBytes block.

#include <xxhash.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::checkpoint::internal {

class FileHasher {
 public:
  explicit FileHasher(int64_t block_bytes);
  ~FileHasher();
  FileHasher(const FileHasher&) = delete;
  FileHasher& operator=(const FileHasher&) = delete;

  void Update(const char* data, int64_t bytes);
  // Ends the last (shorter) block. Call once, after the last Update.
  void Finish();
  uint64_t whole() const { return whole_; }
  const std::vector<uint64_t>& blocks() const { return blocks_; }

 private:
  const int64_t block_bytes_;
  XXH3_state_t* file_state_;
  XXH3_state_t* block_state_;
  int64_t in_block_ = 0;
  uint64_t whole_ = 0;
  std::vector<uint64_t> blocks_;
};

// Sixteen lower-case hex digits, and back (false when `text` is not that).
std::string HashHex(uint64_t hash);
bool ParseHashHex(const std::string& text, uint64_t* hash);

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_CHECKSUMS_H_
