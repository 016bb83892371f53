#include "runtime/checkpoint/internal/checked_files.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint::internal {

CheckedFiles::CheckedFiles(std::string dir, const Manifest& manifest, int cached_blocks)
    : dir_(std::move(dir)),
      manifest_(manifest),
      files_(manifest.files.size()),
      cache_(static_cast<size_t>(std::max(cached_blocks, 1))) {}

std::string CheckedFiles::PathOf(int64_t index) const {
  return absl::StrCat(dir_, "/", manifest_.files[static_cast<size_t>(index)].name);
}

absl::Status CheckedFiles::Open(int64_t index) {
  OpenFile& open = files_[static_cast<size_t>(index)];
  if (open.file) return absl::OkStatus();
  const RankFile& want = manifest_.files[static_cast<size_t>(index)];
  absl::StatusOr<ReadOnlyFile> opened = ReadOnlyFile::Open(PathOf(index));
  // A file the manifest lists, missing: damage (any other failure to open it is not).
  if (absl::IsNotFound(opened.status())) return Damage(opened.status());
  ZEROD_ASSIGN_OR_RETURN(ReadOnlyFile file, std::move(opened));
  ZEROD_RETURN_IF_ERROR(CheckSize(PathOf(index), file.size(), want.bytes));
  open.file.emplace(std::move(file));
  open.verified.assign(want.block_xxh3.size(), false);
  return absl::OkStatus();
}

absl::StatusOr<const CheckedFiles::CachedBlock*> CheckedFiles::Block(int64_t index, int64_t block) {
  CachedBlock* slot = &cache_[0];
  for (CachedBlock& c : cache_) {
    if (c.file == index && c.block == block) {
      c.last_use = ++uses_;
      return &c;
    }
    if (c.last_use < slot->last_use) slot = &c;
  }
  ZEROD_RETURN_IF_ERROR(Open(index));
  OpenFile& open = files_[static_cast<size_t>(index)];
  const RankFile& want = manifest_.files[static_cast<size_t>(index)];
  const int64_t begin = block * kChecksumBlockBytes;
  const int64_t bytes = std::min(kChecksumBlockBytes, want.bytes - begin);
  slot->file = -1;  // until it holds a checked block
  slot->data.resize(static_cast<size_t>(bytes));
  ZEROD_RETURN_IF_ERROR(open.file->ReadAt(begin, bytes, slot->data.data()));
  if (!open.verified[static_cast<size_t>(block)]) {
    const uint64_t got = XXH3_64bits(slot->data.data(), static_cast<size_t>(bytes));
    if (got != want.block_xxh3[static_cast<size_t>(block)]) {
      return Damage(absl::DataLossError(absl::StrCat(PathOf(index), ": checksum mismatch in block ",
                                                     block, " (bytes ", begin, "-",
                                                     begin + bytes - 1, "): the file is damaged")));
    }
    open.verified[static_cast<size_t>(block)] = true;
  }
  slot->file = index;
  slot->block = block;
  slot->last_use = ++uses_;
  return slot;
}

absl::StatusOr<absl::string_view> CheckedFiles::ReadSome(int64_t index, int64_t offset,
                                                         int64_t bytes) {
  const RankFile& want = manifest_.files[static_cast<size_t>(index)];
  if (offset < 0 || bytes < 0 || bytes > want.bytes - offset) {
    return absl::InternalError(absl::StrCat(PathOf(index), ": bytes [", offset, ", +", bytes,
                                            ") are outside its ", want.bytes));
  }
  if (bytes == 0) return absl::string_view();
  const int64_t block = offset / kChecksumBlockBytes;
  ZEROD_ASSIGN_OR_RETURN(const CachedBlock* cached, Block(index, block));
  const int64_t in_block = offset - block * kChecksumBlockBytes;
  const int64_t n = std::min(bytes, static_cast<int64_t>(cached->data.size()) - in_block);
  return absl::string_view(cached->data.data() + in_block, static_cast<size_t>(n));
}

absl::Status CheckedFiles::Read(int64_t index, int64_t offset, int64_t bytes, char* out) {
  while (bytes > 0) {
    ZEROD_ASSIGN_OR_RETURN(absl::string_view part, ReadSome(index, offset, bytes));
    std::memcpy(out, part.data(), part.size());
    out += part.size();
    offset += static_cast<int64_t>(part.size());
    bytes -= static_cast<int64_t>(part.size());
  }
  return absl::OkStatus();
}

}  // namespace zerod::checkpoint::internal
