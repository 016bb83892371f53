// Percent-encoding both ways and query parameters, as the status routes and the access gate use
// them.

#include "server/http/query_string.h"

#include "gtest/gtest.h"

namespace zerod::http {
namespace {

TEST(QueryString, AValueIsFoundDecodedAndAMissingOneIsNotEmpty) {
  EXPECT_EQ(QueryValue("a=1&id=my%20job+x&b=", "id"), "my job x");
  EXPECT_EQ(QueryValue("a=1&b=", "b"), "");
  EXPECT_EQ(QueryValue("a=1&b", "b"), std::nullopt) << "a name without '=' is no value";
  EXPECT_EQ(QueryValue("", "a"), std::nullopt);
  EXPECT_EQ(QueryValue("ab=1", "a"), std::nullopt);
  EXPECT_EQ(QueryValue("a=1&a=2", "a"), "1") << "the first one";
}

TEST(QueryString, ABadEscapeIsKeptAsItIs) {
  EXPECT_EQ(FormDecode("100%"), "100%");
  EXPECT_EQ(FormDecode("%zz%4a"), "%zzJ");
}

TEST(QueryString, WithoutANameTheOthersStayAsSent) {
  EXPECT_EQ(QueryWithout("id=a%20b&token=x&y=1", "token"), "id=a%20b&y=1");
  EXPECT_EQ(QueryWithout("token=x", "token"), "");
  EXPECT_EQ(QueryWithout("token&&tokens=1", "token"), "tokens=1");
}

TEST(QueryString, EncodingKeepsUnreservedAndWhatIsAskedAndEscapesTheRest) {
  EXPECT_EQ(PercentEncode("aZ09-._~"), "aZ09-._~");
  EXPECT_EQ(PercentEncode("/a b/\r\n", "/"), "/a%20b/%0D%0A");
  EXPECT_EQ(PercentEncode("/", ""), "%2F");
  EXPECT_EQ(PercentEncode("\xff"), "%FF");
  EXPECT_EQ(FormDecode(PercentEncode("t;o=k\"e n+")), "t;o=k\"e n+");
}

}  // namespace
}  // namespace zerod::http
