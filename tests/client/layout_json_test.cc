#include "client/layout_json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace zerod::client {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& text) {
  auto parsed = ParseLayoutJson(text, DType::kBFloat16);
  EXPECT_FALSE(parsed.ok()) << text;
  return std::string(parsed.status().message());
}

TEST(LayoutJson, ParsesObjectAndBareList) {
  auto doc = ParseLayoutJson(
      R"({"tensors": [{"name": "wte", "shape": [50304, 768], "dtype": "fp32", "unit": "embed"},
                      {"name": "ln.b", "shape": [768]}]})",
      DType::kBFloat16);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ(doc->size(), 2u);
  EXPECT_EQ((*doc)[0].name, "wte");
  EXPECT_EQ((*doc)[0].numel(), 50304 * 768);
  EXPECT_EQ((*doc)[0].dtype, DType::kFloat32);
  EXPECT_EQ((*doc)[0].unit, "embed");
  EXPECT_EQ((*doc)[1].dtype, DType::kBFloat16);
  auto bare = ParseLayoutJson(R"([{"name": "w", "shape": []}])", DType::kFloat16);
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ((*bare)[0].numel(), 1);
}

TEST(LayoutJson, ErrorsNameThePosition) {
  EXPECT_THAT(ErrorOf("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf(R"({"layers": []})"), HasSubstr("\"tensors\""));
  EXPECT_THAT(ErrorOf(R"({"tensors": []})"), HasSubstr("no tensors"));
  EXPECT_THAT(ErrorOf(R"({"tensors": [{"name": "a", "shape": [2]}, {"shape": [3]}]})"),
              HasSubstr("tensors[1].name"));
  EXPECT_THAT(ErrorOf(R"({"tensors": [{"name": "a", "shape": [2, -4]}]})"),
              HasSubstr("tensors[0].shape[1]"));
  EXPECT_THAT(ErrorOf(R"({"tensors": [{"name": "a", "shape": [2.5]}]})"),
              HasSubstr("tensors[0].shape[0]"));
  EXPECT_THAT(ErrorOf(R"({"tensors": [{"name": "a", "shape": [2], "dtype": "fp8"}]})"),
              HasSubstr("tensors[0].dtype"));
  EXPECT_THAT(ErrorOf(R"({"tensors": [{"name": "a", "shape": [2], "size": 3}]})"),
              HasSubstr("unknown field \"size\""));
  EXPECT_THAT(ErrorOf(R"([{"name": "a", "shape": "2x2"}])"), HasSubstr("[0].shape"));
}

// Found by tests/fuzz/layout_json_fuzz: nlohmann throws out_of_range, not parse_error, for a
// number no double holds, and the exception escaped into zeroctl and the SDK.
TEST(LayoutJson, ANumberTooLargeForADoubleIsAnErrorNotACrash) {
  EXPECT_THAT(ErrorOf(R"([{"name": "w", "shape": [1e999]}])"),
              HasSubstr("not valid JSON: number overflow parsing '1e999'"));
}

TEST(LayoutJson, FileErrorsStartWithThePath) {
  testing::TempDir dir;
  auto missing = ReadLayoutFile(dir.path() + "/nope.json", DType::kBFloat16);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.json"));
  auto directory = ReadLayoutFile(dir.path(), DType::kBFloat16);
  ASSERT_FALSE(directory.ok());
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr("directory"));
  const std::string bad = dir.WriteFile("bad.json", "[{\"name\": 1, \"shape\": [1]}]");
  auto parsed = ReadLayoutFile(bad, DType::kBFloat16);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("bad.json: [0].name"));
}

}  // namespace
}  // namespace zerod::client
