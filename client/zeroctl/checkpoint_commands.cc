#include "client/zeroctl/checkpoint_commands.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/units.h"

namespace zerod::zeroctl {
namespace {

int Failed(std::ostream& err, const absl::Status& status) {
  err << "zeroctl: " << status.message() << "\n";
  return 1;
}

int64_t SizeOf(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

int VerifyCommand(const CheckpointFlags& flags, std::ostream& out, std::ostream& err) {
  absl::Status status = checkpoint::Verify(flags.dir);
  if (!status.ok()) return Failed(err, status);
  auto manifest = checkpoint::ReadManifest(flags.dir);
  if (!manifest.ok()) return Failed(err, manifest.status());
  int64_t bytes = SizeOf(absl::StrCat(flags.dir, "/", checkpoint::kManifestName));
  for (const checkpoint::RankFile& f : manifest->files) bytes += f.bytes;
  out << flags.dir << ": ok, step " << manifest->step << ", " << manifest->world_size << " ranks, "
      << manifest->files.size() + 1 << " files, " << bytes << " bytes\n";
  return 0;
}

int ExportCommand(const CheckpointFlags& flags, std::ostream& out, std::ostream& err) {
  // What --out names is looked at first: a typo that names a device or a link is a usage error
  // that changes nothing (the write looks again before its rename).
  if (absl::Status target = CheckRegularFileTarget(flags.out); !target.ok()) {
    err << "zeroctl: " << target.message() << "\n";
    return 2;
  }
  auto manifest = checkpoint::ReadManifest(flags.dir);
  if (!manifest.ok()) return Failed(err, manifest.status());
  absl::Status status = checkpoint::ExportSafetensors(flags.dir, flags.out);
  if (!status.ok()) return Failed(err, status);
  out << "wrote " << flags.out << ": " << manifest->layout.size() << " tensors, "
      << FormatCount(manifest->total_numel) << " fp32 parameters of step " << manifest->step << ", "
      << SizeOf(flags.out) << " bytes\n";
  return 0;
}

int UpgradeCommand(const CheckpointFlags& flags, std::ostream& out, std::ostream& err) {
  if (checkpoint::ReadManifest(flags.dir).ok()) {
    out << flags.dir << ": its manifest already has a checksum (format "
        << checkpoint::kFormatVersion << "); nothing to do\n";
    return 0;
  }
  absl::Status status = checkpoint::UpgradeManifest(flags.dir);
  if (!status.ok()) return Failed(err, status);
  auto manifest = checkpoint::ReadManifest(flags.dir);
  if (!manifest.ok()) return Failed(err, manifest.status());
  out << flags.dir << ": checked " << manifest->files.size()
      << " rank files against its format-1 manifest and gave it a checksum (format "
      << checkpoint::kFormatVersion << "), step " << manifest->step << "\n";
  return 0;
}

}  // namespace

CLI::App* AddCheckpointCommand(CLI::App& app, CheckpointFlags& flags) {
  CLI::App* checkpoint =
      app.add_subcommand("checkpoint", "check or export a sharded checkpoint directory (offline)");
  checkpoint->require_subcommand(1);
  CLI::App* verify = checkpoint->add_subcommand(
      "verify", "read every file of a checkpoint and check its sizes and checksums");
  verify->add_option("DIR", flags.dir, "the checkpoint directory (.../step-NNNNNNNNNNNN)")
      ->required();
  CLI::App* export_command = checkpoint->add_subcommand(
      "export", "write the full fp32 parameters by name as one safetensors file");
  export_command->add_option("DIR", flags.dir, "the checkpoint directory")->required();
  export_command->add_option("--out", flags.out, "the safetensors file to write")->required();
  CLI::App* upgrade = checkpoint->add_subcommand(
      "upgrade",
      "check every file of a checkpoint saved before manifests had a checksum, then give its "
      "manifest one, so that it loads");
  upgrade->add_option("DIR", flags.dir, "the checkpoint directory")->required();
  return checkpoint;
}

int RunCheckpoint(const CLI::App& checkpoint, const CheckpointFlags& flags, std::ostream& out,
                  std::ostream& err) {
  if (checkpoint.got_subcommand("verify")) return VerifyCommand(flags, out, err);
  if (checkpoint.got_subcommand("export")) return ExportCommand(flags, out, err);
  if (checkpoint.got_subcommand("upgrade")) return UpgradeCommand(flags, out, err);
  err << "zeroctl: checkpoint needs a subcommand: verify, export or upgrade\n";
  return 2;
}

}  // namespace zerod::zeroctl
