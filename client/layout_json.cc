#include "client/layout_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace zerod::client {
namespace {

using nlohmann::json;

absl::Status At(absl::string_view where, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; users need the rest.
std::string WithoutExceptionTag(const std::string& what) {
  const size_t close = what.find("] ");
  return close == std::string::npos ? what : what.substr(close + 2);
}

absl::StatusOr<plan::TensorSpec> ParseTensor(const json& item, const std::string& where,
                                             DType default_dtype) {
  if (!item.is_object()) return At(where, "expected an object with \"name\" and \"shape\"");
  for (const auto& [key, value] : item.items()) {
    if (key != "name" && key != "shape" && key != "dtype" && key != "unit") {
      return At(where,
                absl::StrCat("unknown field \"", key, "\" (expected name, shape, dtype, unit)"));
    }
  }
  plan::TensorSpec t;
  t.dtype = default_dtype;
  const auto name = item.find("name");
  if (name == item.end() || !name->is_string() || name->get<std::string>().empty()) {
    return At(where + ".name", "expected a non-empty string");
  }
  t.name = name->get<std::string>();
  const auto shape = item.find("shape");
  if (shape == item.end() || !shape->is_array()) {
    return At(where + ".shape", "expected a list of dimensions, e.g. [4096, 4096]");
  }
  for (size_t d = 0; d < shape->size(); ++d) {
    const json& dim = (*shape)[d];
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return At(absl::StrCat(where, ".shape[", d, "]"),
                absl::StrCat("expected a non-negative integer, got ", dim.dump()));
    }
    t.shape.push_back(dim.get<int64_t>());
  }
  if (const auto dtype = item.find("dtype"); dtype != item.end()) {
    if (!dtype->is_string()) return At(where + ".dtype", "expected \"fp32\", \"bf16\" or \"fp16\"");
    auto parsed = ParseDType(dtype->get<std::string>());
    if (!parsed.ok()) return At(where + ".dtype", parsed.status().message());
    t.dtype = *parsed;
  }
  if (const auto unit = item.find("unit"); unit != item.end()) {
    if (!unit->is_string()) return At(where + ".unit", "expected a string");
    t.unit = unit->get<std::string>();
  }
  return t;
}

}  // namespace

absl::StatusOr<std::vector<plan::TensorSpec>> ParseLayoutJson(absl::string_view text,
                                                              DType default_dtype) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    return absl::InvalidArgumentError(
        absl::StrCat("not valid JSON: ", WithoutExceptionTag(e.what())));
  }
  const json* list = &doc;
  std::string prefix = "";
  if (doc.is_object()) {
    const auto it = doc.find("tensors");
    if (it == doc.end()) return At("layout", "expected a \"tensors\" list");
    list = &*it;
    prefix = "tensors";
  }
  if (!list->is_array()) {
    return At(prefix.empty() ? "layout" : prefix, "expected a list of tensors");
  }
  if (list->empty()) return At(prefix.empty() ? "layout" : prefix, "has no tensors");
  std::vector<plan::TensorSpec> tensors;
  tensors.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    auto t = ParseTensor((*list)[i], absl::StrCat(prefix, "[", i, "]"), default_dtype);
    if (!t.ok()) return t.status();
    tensors.push_back(*std::move(t));
  }
  return tensors;
}

absl::StatusOr<std::vector<plan::TensorSpec>> ReadLayoutFile(const std::string& path,
                                                             DType default_dtype) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a layout file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open layout file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": cannot read layout file"));
  auto parsed = ParseLayoutJson(buffer.str(), default_dtype);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace zerod::client
