// Flag sources without a daemon: the variable each flag gets, and the one order of the sources
// over a CLI11 app like zerod's.

#include "server/service/flag_sources.h"

#include <stdlib.h>

#include <fstream>

#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace zerod::server::service {
namespace {

TEST(FlagSources, AFlagsVariableIsZerodAndItsNameInCapitalsExceptForTheClientSidesNames) {
  EXPECT_EQ(EnvironmentVariableOf("--data-dir"), "ZEROD_DATA_DIR");
  EXPECT_EQ(EnvironmentVariableOf("--max-world-size"), "ZEROD_MAX_WORLD_SIZE");
  EXPECT_EQ(EnvironmentVariableOf("--config"), "ZEROD_CONFIG");
  // Read by the SDK, zeroctl or zerorun for the client's side, or an action for one start.
  for (const char* flag : {"--tls-cert", "--tls-key", "--tls-client-ca", "--admin-token-file",
                           "--viewer-token-file", "--reset-state", "--help"}) {
    EXPECT_EQ(EnvironmentVariableOf(flag), "") << flag;
  }
}

struct App {
  CLI::App app{"test"};
  std::string mode = "0660", tls_cert;
  bool no_auth = false;
  App() {
    app.add_option("--socket-mode", mode);
    app.add_option("--tls-cert", tls_cert);
    app.add_flag("--no-auth", no_auth);
  }
  std::optional<int> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "zerod");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return ParseFlagSources(app, static_cast<int>(argv.size()), argv.data());
  }
};

TEST(FlagSources, FlagBeatsEnvironmentBeatsFileBeatsDefault) {
  zerod::testing::TempDir dir;
  const std::string file =
      dir.WriteFile("z.toml", "socket-mode = \"0600\"\nno-auth = true\ntls-cert = \"/f.crt\"\n");
  unsetenv("ZEROD_SOCKET_MODE");
  {
    App a;
    EXPECT_EQ(a.Parse({}), std::nullopt);
    EXPECT_EQ(a.mode, "0660");
    EXPECT_FALSE(a.no_auth);
  }
  {
    App a;
    EXPECT_EQ(a.Parse({"--config", file}), std::nullopt);
    EXPECT_EQ(a.mode, "0600");
    EXPECT_TRUE(a.no_auth);
    EXPECT_EQ(a.tls_cert, "/f.crt");
  }
  setenv("ZEROD_SOCKET_MODE", "0640", 1);
  setenv("ZEROD_TLS_CERT", "/client.crt", 1);  // a client's certificate: not the daemon's
  {
    App a;
    EXPECT_EQ(a.Parse({"--config", file}), std::nullopt);
    EXPECT_EQ(a.mode, "0640");
    EXPECT_EQ(a.tls_cert, "/f.crt");
  }
  {
    App a;
    EXPECT_EQ(a.Parse({"--config", file, "--socket-mode", "0620"}), std::nullopt);
    EXPECT_EQ(a.mode, "0620");
  }
  unsetenv("ZEROD_SOCKET_MODE");
  unsetenv("ZEROD_TLS_CERT");
}

TEST(FlagSources, AnUnknownKeyOrSectionOrAMissingFileIsAUsageError) {
  zerod::testing::TempDir dir;
  for (const char* text : {"socket-mdoe = \"0600\"\n", "[daemon]\nsocket-mode = \"0600\"\n",
                           "config = \"/other.toml\"\n"}) {
    App a;
    EXPECT_EQ(a.Parse({"--config", dir.WriteFile("bad.toml", text)}), 2) << text;
    EXPECT_EQ(a.mode, "0660") << text;
  }
  App a;
  EXPECT_EQ(a.Parse({"--config", dir.path() + "/missing.toml"}), 2);
}

}  // namespace
}  // namespace zerod::server::service
