#include "runtime/checkpoint/internal/checksums.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace zerod::checkpoint::internal {

FileHasher::FileHasher(int64_t block_bytes)
    : block_bytes_(block_bytes), file_state_(XXH3_createState()), block_state_(XXH3_createState()) {
  XXH3_64bits_reset(file_state_);
  XXH3_64bits_reset(block_state_);
}

FileHasher::~FileHasher() {
  XXH3_freeState(file_state_);
  XXH3_freeState(block_state_);
}

void FileHasher::Update(const char* data, int64_t bytes) {
  XXH3_64bits_update(file_state_, data, static_cast<size_t>(bytes));
  while (bytes > 0) {
    const int64_t n = std::min(bytes, block_bytes_ - in_block_);
    XXH3_64bits_update(block_state_, data, static_cast<size_t>(n));
    in_block_ += n;
    data += n;
    bytes -= n;
    if (in_block_ == block_bytes_) {
      blocks_.push_back(XXH3_64bits_digest(block_state_));
      XXH3_64bits_reset(block_state_);
      in_block_ = 0;
    }
  }
}

void FileHasher::Finish() {
  if (in_block_ > 0) blocks_.push_back(XXH3_64bits_digest(block_state_));
  in_block_ = 0;
  whole_ = XXH3_64bits_digest(file_state_);
}

std::string HashHex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

bool ParseHashHex(const std::string& text, uint64_t* hash) {
  if (text.size() != 16) return false;
  uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  *hash = value;
  return true;
}

}  // namespace zerod::checkpoint::internal
