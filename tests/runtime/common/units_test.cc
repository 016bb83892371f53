#include "runtime/common/units.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/dtype.h"

namespace zerod {
namespace {

using ::testing::HasSubstr;

TEST(ParseCount, AcceptsTheSpellingsUsersWrite) {
  EXPECT_EQ(*ParseCount("7.5e9"), 7'500'000'000);
  EXPECT_EQ(*ParseCount("7.5B"), 7'500'000'000);
  EXPECT_EQ(*ParseCount("7.5b"), 7'500'000'000);
  EXPECT_EQ(*ParseCount("128B"), 128'000'000'000);
  EXPECT_EQ(*ParseCount("1T"), 1'000'000'000'000);
  EXPECT_EQ(*ParseCount("350M"), 350'000'000);
  EXPECT_EQ(*ParseCount("4K"), 4'000);
  EXPECT_EQ(*ParseCount("1000000"), 1'000'000);
  EXPECT_EQ(*ParseCount(" 64 "), 64);
}

TEST(ParseCount, RejectsWhatIsNotAPositiveWholeCount) {
  for (const char* bad :
       {"0", "-5", "abc", "", "1.5", "7.5X", "nan", "inf", "0x10", "1e30", "2.5e-1", "B"}) {
    auto parsed = ParseCount(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseCount("1.5").status().message()), HasSubstr("'1.5'"));
  EXPECT_THAT(std::string(ParseCount("-5").status().message()), HasSubstr("positive"));
}

TEST(ParseBytes, BinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseBytes("80GiB"), 80ll << 30);
  EXPECT_EQ(*ParseBytes("80gib"), 80ll << 30);
  EXPECT_EQ(*ParseBytes("512MiB"), 512ll << 20);
  EXPECT_EQ(*ParseBytes("80GB"), 80'000'000'000);
  EXPECT_EQ(*ParseBytes("80G"), 80'000'000'000);
  EXPECT_EQ(*ParseBytes("1.5TiB"), 3ll << 39);
  EXPECT_EQ(*ParseBytes("4096"), 4096);
  EXPECT_FALSE(ParseBytes("0GiB").ok());
  EXPECT_FALSE(ParseBytes("-1GiB").ok());
  EXPECT_FALSE(ParseBytes("12 parsecs").ok());
}

TEST(FormatBytes, DecimalUnitsLikeThePaper) {
  EXPECT_EQ(FormatBytes(120e9), "120.00 GB");
  EXPECT_EQ(FormatBytes(1.875e9), "1.88 GB");
  EXPECT_EQ(FormatBytes(512e6), "512.00 MB");
  EXPECT_EQ(FormatBytes(16e12), "16.00 TB");
  EXPECT_EQ(FormatBytes(12), "12 B");
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    EXPECT_EQ(*ParseDType(DTypeName(t)), t);
  }
  EXPECT_EQ(DTypeBytes(DType::kFloat32), 4);
  EXPECT_EQ(DTypeBytes(DType::kBFloat16), 2);
  EXPECT_EQ(*ParseDType("Half"), DType::kFloat16);
  EXPECT_THAT(std::string(ParseDType("fp8").status().message()), HasSubstr("'fp8'"));
}

}  // namespace
}  // namespace zerod
