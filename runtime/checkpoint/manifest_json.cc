// manifest.json: the Manifest as JSON, and back. Checksums are 16 hex digits (a JSON number is
// not a safe place for a uint64); runs are [offset, numel] pairs. The manifest's own checksum,
// `manifest_xxh3`, is the XXH3-64 of the file's bytes with its 16 digits written as zeros: every
// other byte is covered, and the one place it can be in the text is known (inside a JSON string
// a quote is escaped, so `"manifest_xxh3": "` appears once, as the key).

#include <cmath>
#include <limits>
#include <stdexcept>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/checksums.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint {
namespace {

using nlohmann::json;

// A field that is missing or of the wrong kind, with its path in the document.
struct BadField : std::runtime_error {
  BadField(const std::string& field, const std::string& problem)
      : std::runtime_error(absl::StrCat("field '", field, "' ", problem)) {}
};

const json& At(const json& j, const std::string& path, const char* key) {
  if (!j.is_object()) throw BadField(path, "is not an object");
  auto it = j.find(key);
  if (it == j.end()) throw BadField(absl::StrCat(path, path.empty() ? "" : ".", key), "is missing");
  return *it;
}

std::string Join(const std::string& path, const char* key) {
  return absl::StrCat(path, path.empty() ? "" : ".", key);
}

int64_t Int(const json& j, const std::string& path, const char* key) {
  const json& v = At(j, path, key);
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() &&
       v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    throw BadField(Join(path, key), "is not an integer in range");
  }
  return v.get<int64_t>();
}

int64_t NonNegative(const json& j, const std::string& path, const char* key) {
  const int64_t v = Int(j, path, key);
  if (v < 0) throw BadField(Join(path, key), "is negative");
  return v;
}

std::string String(const json& j, const std::string& path, const char* key) {
  const json& v = At(j, path, key);
  if (!v.is_string()) throw BadField(Join(path, key), "is not a string");
  return v.get<std::string>();
}

const json& Array(const json& j, const std::string& path, const char* key) {
  const json& v = At(j, path, key);
  if (!v.is_array()) throw BadField(Join(path, key), "is not an array");
  return v;
}

DType DTypeField(const json& j, const std::string& path, const char* key) {
  auto d = ParseDType(String(j, path, key));
  if (!d.ok()) throw BadField(Join(path, key), "is not a dtype");
  return *d;
}

uint64_t Hash(const json& v, const std::string& path) {
  uint64_t h = 0;
  if (!v.is_string() || !internal::ParseHashHex(v.get<std::string>(), &h)) {
    throw BadField(path, "is not 16 hex digits");
  }
  return h;
}

bool ValidUtf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

json FileToJson(const RankFile& f) {
  json runs = json::array();
  for (const engine::ModelRun& r : f.runs) runs.push_back({r.offset, r.numel});
  json blocks = json::array();
  for (uint64_t h : f.block_xxh3) blocks.push_back(internal::HashHex(h));
  return {{"rank", f.rank},
          {"name", f.name},
          {"runs", runs},
          {"numel", f.numel},
          {"extra_bytes", f.extra_bytes},
          {"bytes", f.bytes},
          {"xxh3", internal::HashHex(f.xxh3)},
          {"block_xxh3", blocks}};
}

RankFile FileFromJson(const json& j, const std::string& path) {
  RankFile f;
  f.rank = NonNegative(j, path, "rank");
  f.name = String(j, path, "name");
  const json& runs = Array(j, path, "runs");
  for (size_t i = 0; i < runs.size(); ++i) {
    const json& r = runs[i];
    const std::string at = absl::StrCat(path, ".runs[", i, "]");
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer() ||
        r[0].get<int64_t>() < 0 || r[1].get<int64_t>() < 0) {
      throw BadField(at, "is not a pair of non-negative integers");
    }
    f.runs.push_back({r[0].get<int64_t>(), r[1].get<int64_t>()});
  }
  f.numel = NonNegative(j, path, "numel");
  f.extra_bytes = NonNegative(j, path, "extra_bytes");
  f.bytes = NonNegative(j, path, "bytes");
  f.xxh3 = Hash(At(j, path, "xxh3"), Join(path, "xxh3"));
  const json& blocks = Array(j, path, "block_xxh3");
  for (size_t i = 0; i < blocks.size(); ++i) {
    f.block_xxh3.push_back(Hash(blocks[i], absl::StrCat(path, ".block_xxh3[", i, "]")));
  }
  return f;
}

// The fields of a manifest of `format_version` (kFormatVersion, or 1 for UpgradeManifest).
Manifest FromJson(const json& j, int format_version) {
  Manifest m;
  m.format_version = format_version;
  m.job_id = String(j, "", "job_id");
  m.step = NonNegative(j, "", "step");
  const json& c = At(j, "", "counters");
  m.counters.applied_steps = NonNegative(c, "counters", "applied_steps");
  m.counters.steps_taken = NonNegative(c, "counters", "steps_taken");
  const json& scale = At(c, "counters", "loss_scale");
  if (!scale.is_number()) throw BadField("counters.loss_scale", "is not a number");
  m.counters.loss_scaler.scale = scale.get<double>();
  m.counters.loss_scaler.clean_steps = NonNegative(c, "counters", "clean_steps");
  m.counters.loss_scaler.hysteresis_left = NonNegative(c, "counters", "hysteresis_left");
  // A restored run takes these as they are: a scale of 0 would zero every gradient.
  if (!std::isfinite(m.counters.loss_scaler.scale) || m.counters.loss_scaler.scale <= 0) {
    throw BadField("counters.loss_scale", "is not a finite number above 0");
  }
  if (m.counters.applied_steps > m.counters.steps_taken) {
    throw BadField("counters.applied_steps", "is more than counters.steps_taken");
  }
  if (m.step != m.counters.steps_taken) {
    throw BadField("step", "is not counters.steps_taken");
  }
  // Absent from checkpoints written before tensors had their own step counts: every tensor is
  // then at applied_steps.
  if (c.contains("tensor_steps")) {
    for (const json& steps : Array(c, "counters", "tensor_steps")) {
      if (!steps.is_number_integer() || steps.get<int64_t>() < 0 ||
          steps.get<int64_t>() > m.counters.applied_steps) {
        throw BadField("counters.tensor_steps",
                       "is not a list of integers from 0 to counters.applied_steps");
      }
      m.counters.tensor_steps.push_back(steps.get<int64_t>());
    }
  }
  m.world_size = NonNegative(j, "", "world_size");
  const int64_t stage = Int(j, "", "stage");
  if (stage < 0 || stage > 3) throw BadField("stage", "is not 0-3");
  m.stage = static_cast<int>(stage);
  m.param_dtype = DTypeField(j, "", "param_dtype");
  m.grad_dtype = DTypeField(j, "", "grad_dtype");
  const json& layout = Array(j, "", "layout");
  for (size_t i = 0; i < layout.size(); ++i) {
    const std::string at = absl::StrCat("layout[", i, "]");
    plan::TensorSpec t;
    t.name = String(layout[i], at, "name");
    const json& shape = Array(layout[i], at, "shape");
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        throw BadField(Join(at, "shape"), "is not a list of non-negative integers");
      }
      t.shape.push_back(d.get<int64_t>());
    }
    t.dtype = DTypeField(layout[i], at, "dtype");
    t.unit = String(layout[i], at, "unit");
    m.layout.push_back(std::move(t));
  }
  absl::Status layout_ok = plan::ValidatePlanInput({m.layout, plan::PlanOptions{}});
  if (!layout_ok.ok()) throw BadField("layout", std::string(layout_ok.message()));
  if (!m.counters.tensor_steps.empty() && m.counters.tensor_steps.size() != m.layout.size()) {
    throw BadField("counters.tensor_steps",
                   absl::StrCat("has ", m.counters.tensor_steps.size(), " entries for ",
                                m.layout.size(), " tensors"));
  }
  m.layout_digest = String(j, "", "layout_digest");
  m.plan_digest = String(j, "", "plan_digest");
  m.total_numel = NonNegative(j, "", "total_numel");
  const json& files = Array(j, "", "files");
  for (size_t i = 0; i < files.size(); ++i) {
    m.files.push_back(FileFromJson(files[i], absl::StrCat("files[", i, "]")));
  }
  if (j.contains("user_base64")) {
    if (!absl::Base64Unescape(String(j, "", "user_base64"), &m.user)) {
      throw BadField("user_base64", "is not base64");
    }
  } else {
    m.user = String(j, "", "user");
  }
  m.created_unix_ms = Int(j, "", "created_unix_ms");
  if (format_version >= 2) {
    const json& recorded = At(j, "", "recorded");
    if (!recorded.is_boolean()) throw BadField("recorded", "is not true or false");
    m.recorded = recorded.get<bool>();
  }
  return m;
}

constexpr char kChecksumKey[] = "\"manifest_xxh3\": \"";
constexpr char kNoChecksum[] = "0000000000000000";

// `text` with the checksum's digits at `at` zeroed, hashed.
uint64_t ChecksumOf(std::string text, size_t at) {
  text.replace(at, 16, kNoChecksum);
  return XXH3_64bits(text.data(), text.size());
}

// Checks `text`'s own checksum (`claimed`): DATA_LOSS naming `source` when the bytes differ.
absl::Status CheckChecksum(const std::string& text, uint64_t claimed, const std::string& source) {
  const std::string key = absl::StrCat(kChecksumKey, internal::HashHex(claimed), "\"");
  const size_t at = text.find(key);
  if (at == std::string::npos || text.find(key, at + 1) != std::string::npos) {
    return absl::DataLossError(
        absl::StrCat(source,
                     ": checksum field is not where a save writes it: the manifest was edited or "
                     "damaged"));
  }
  const uint64_t actual = ChecksumOf(text, at + sizeof(kChecksumKey) - 1);
  if (actual != claimed) {
    return absl::DataLossError(
        absl::StrCat(source, ": checksum mismatch: its bytes hash to ", internal::HashHex(actual),
                     ", its manifest_xxh3 says ", internal::HashHex(claimed),
                     " (the manifest was edited or damaged after its save)"));
  }
  return absl::OkStatus();
}

// The directory a manifest at `source` belongs to, for messages.
std::string DirectoryOf(const std::string& source) {
  const std::string suffix = absl::StrCat("/", kManifestName);
  if (source.size() > suffix.size() &&
      source.compare(source.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return source.substr(0, source.size() - suffix.size());
  }
  return source;
}

// Parses and checks `text`; `legacy`: a format-1 manifest is read too. Every failure of its
// content is damage (internal/damage.h); a manifest of another format is not.
absl::StatusOr<Manifest> Parse(const std::string& text, const std::string& source, bool legacy) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return internal::Damage(
        absl::DataLossError(absl::StrCat(source, " is not valid JSON: ", e.what())));
  }
  Manifest m;
  try {
    const int version = static_cast<int>(Int(j, "", "format_version"));
    if (version == 1 && !legacy) {
      return absl::FailedPreconditionError(absl::StrCat(
          source,
          " is of format 1, written before manifests had a checksum: no checksum covers "
          "its step, counters or user data, so it is not loaded as it is; check it and "
          "add one with `zeroctl checkpoint upgrade ",
          DirectoryOf(source), "`"));
    }
    if (version == 1 && (j.contains("manifest_xxh3") || j.contains("recorded"))) {
      // Format 1 never had these: a newer manifest relabelled, which an upgrade would re-bless.
      return internal::Damage(absl::DataLossError(absl::StrCat(
          source,
          " says format 1 but carries format 2's manifest_xxh3 or recorded: a format-2 manifest "
          "relabelled (edited), not one written before the checksum; not upgraded")));
    }
    if (version != kFormatVersion && !(legacy && version == 1)) {
      return absl::FailedPreconditionError(absl::StrCat(source, ": format_version is ", version,
                                                        "; this build reads ", kFormatVersion,
                                                        legacy ? " (and upgrades 1)" : ""));
    }
    if (version >= 2) {
      m.manifest_xxh3 = Hash(At(j, "", "manifest_xxh3"), "manifest_xxh3");
      ZEROD_RETURN_IF_ERROR(internal::Damage(CheckChecksum(text, m.manifest_xxh3, source)));
    }
    const uint64_t checksum = m.manifest_xxh3;
    m = FromJson(j, version);
    m.manifest_xxh3 = checksum;
  } catch (const BadField& e) {
    return internal::Damage(absl::DataLossError(absl::StrCat(source, ": ", e.what())));
  } catch (const json::exception& e) {
    return internal::Damage(absl::DataLossError(absl::StrCat(source, ": ", e.what())));
  }
  ZEROD_RETURN_IF_ERROR(internal::Damage(internal::CheckManifest(m, source)));
  return m;
}

}  // namespace

std::string ManifestToJson(const Manifest& m) {
  json layout = json::array();
  for (const plan::TensorSpec& t : m.layout) {
    layout.push_back({{"name", t.name},
                      {"shape", t.shape},
                      {"dtype", std::string(DTypeName(t.dtype))},
                      {"unit", t.unit}});
  }
  json files = json::array();
  for (const RankFile& f : m.files) files.push_back(FileToJson(f));
  json j = {{"format_version", m.format_version},
            {"job_id", m.job_id},
            {"step", m.step},
            {"counters",
             {{"applied_steps", m.counters.applied_steps},
              {"steps_taken", m.counters.steps_taken},
              {"loss_scale", m.counters.loss_scaler.scale},
              {"clean_steps", m.counters.loss_scaler.clean_steps},
              {"hysteresis_left", m.counters.loss_scaler.hysteresis_left},
              {"tensor_steps", m.counters.tensor_steps}}},
            {"world_size", m.world_size},
            {"stage", m.stage},
            {"param_dtype", std::string(DTypeName(m.param_dtype))},
            {"grad_dtype", std::string(DTypeName(m.grad_dtype))},
            {"layout", layout},
            {"layout_digest", m.layout_digest},
            {"plan_digest", m.plan_digest},
            {"total_numel", m.total_numel},
            {"files", files},
            {"created_unix_ms", m.created_unix_ms},
            {"recorded", m.recorded},
            {"manifest_xxh3", kNoChecksum}};
  // The trainer's bytes are opaque: text when JSON can hold them, base64 when not.
  if (ValidUtf8(m.user)) {
    j["user"] = m.user;
  } else {
    j["user_base64"] = absl::Base64Escape(m.user);
  }
  // A format-1 manifest (as builds before the checksum wrote them) has neither field.
  if (m.format_version < 2) {
    j.erase("manifest_xxh3");
    j.erase("recorded");
    return j.dump(1) + "\n";
  }
  std::string text = j.dump(1) + "\n";
  const size_t at = text.find(absl::StrCat(kChecksumKey, kNoChecksum)) + sizeof(kChecksumKey) - 1;
  text.replace(at, 16, internal::HashHex(ChecksumOf(text, at)));
  return text;
}

absl::StatusOr<Manifest> ManifestFromJson(const std::string& text, const std::string& source) {
  return Parse(text, source, /*legacy=*/false);
}

namespace internal {

absl::StatusOr<Manifest> LegacyManifestFromJson(const std::string& text,
                                                const std::string& source) {
  return Parse(text, source, /*legacy=*/true);
}

}  // namespace internal

}  // namespace zerod::checkpoint
