#include "server/service/flag_sources.h"

#include <cctype>
#include <iostream>
#include <set>
#include <vector>

namespace zerod::server::service {
namespace {

constexpr char kConfigFlag[] = "--config";

// See the header: one action, and the names the client side owns.
const std::set<std::string>& WithoutVariable() {
  static const auto* flags = new std::set<std::string>{
      "--help",     kConfigFlag, "--reset-state",   "--admin-token-file",
      "--tls-cert", "--tls-key", "--tls-client-ca", "--viewer-token-file"};
  return *flags;
}

int UsageError(std::string message) {
  for (char& c : message) c = c == '\n' ? ' ' : c;
  std::cerr << "zerod: " << message << "\n";
  return 2;
}

// Gives each option still unset the file's value, as if it had been on the command line.
void ApplyConfigFile(CLI::App& app, const std::string& path) {
  CLI::ConfigTOML format;
  const std::vector<CLI::ConfigItem> items = format.from_file(path);  // FileError if unreadable
  for (const CLI::ConfigItem& item : items) {
    if (!item.parents.empty()) {
      if (item.name == "++" || item.name == "--") {
        throw CLI::ConfigError("config file " + path + ": unknown section [" +
                               item.fullname().substr(0, item.fullname().rfind('.')) +
                               "] (zerod's keys are flags at the top level)");
      }
      throw CLI::ConfigError("config file " + path + ": unknown key '" + item.fullname() + "'");
    }
    CLI::Option* option = app.get_option_no_throw("--" + item.name);
    if (option == nullptr || option->get_name() == kConfigFlag || item.name == "help") {
      throw CLI::ConfigError("config file " + path + ": unknown key '" + item.name +
                             "' (keys are zerod's flags without the dashes, e.g. data-dir)");
    }
    if (option->count() > 0) continue;  // the command line or the environment has it
    if (option->get_expected_min() == 0) {
      option->add_result(option->get_flag_value(item.name, format.to_flag(item)));
    } else {
      option->add_result(item.inputs);
    }
    option->run_callback();
  }
}

}  // namespace

std::string EnvironmentVariableOf(const std::string& flag) {
  if (flag == kConfigFlag) return "ZEROD_CONFIG";
  if (WithoutVariable().count(flag) != 0 || flag.rfind("--", 0) != 0) return "";
  std::string name = "ZEROD_";
  for (char c : flag.substr(2)) {
    name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

std::optional<int> ParseFlagSources(CLI::App& app, int argc, char** argv) {
  std::string config_path;
  app.add_option(kConfigFlag, config_path,
                 "TOML file of settings: flag names without the dashes, e.g. data-dir = \"/x\" "
                 "(command line > ZEROD_* environment > this file > defaults)");
  for (CLI::Option* option : app.get_options()) {
    const std::string flag = option->get_name();  // the long name, "--data-dir"
    const std::string variable = EnvironmentVariableOf(flag);
    if (!variable.empty()) option->envname(variable);
  }
  try {
    app.parse(argc, argv);
    if (!config_path.empty()) ApplyConfigFile(app, config_path);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::FileError& e) {
    return UsageError("config file " + config_path + ": cannot read it (" + e.what() + ")");
  } catch (const CLI::Error& e) {
    return UsageError(e.what());
  }
  return std::nullopt;
}

}  // namespace zerod::server::service
