#include "tests/integration/headless_chromium.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/util/test_time.h"

namespace zerod::testing {
namespace {

using nlohmann::json;

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// One line for an exception or console call: its text and where it came from.
std::string Describe(const json& details) {
  std::string text = details.value("text", "");
  if (details.contains("exception") && details["exception"].contains("description")) {
    text += ": " + details["exception"]["description"].get<std::string>();
  }
  return absl::StrCat(text, " (", details.value("url", ""), ":", details.value("lineNumber", 0),
                      ")");
}

}  // namespace

std::string HeadlessChromium::Find() {
  if (const char* chosen = std::getenv("ZEROD_TEST_CHROMIUM"); chosen != nullptr && *chosen) {
    return Executable(chosen) ? chosen : "";
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (const char* name : {"chromium", "chromium-browser"}) {
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const std::string candidate = dirs.substr(start, end - start) + "/" + name;
      if (end > start && Executable(candidate)) return candidate;
      start = end + 1;
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<HeadlessChromium>> HeadlessChromium::Start(
    const std::string& binary, const std::string& profile_dir, const std::string& log_path,
    int width, int height) {
  int commands[2], answers[2];  // [read end, write end]
  if (pipe2(commands, O_CLOEXEC) != 0 || pipe2(answers, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const std::vector<std::string> args = {
      binary, "--headless=new",
      // As root (CI containers) Chromium's sandbox cannot start.
      "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--user-data-dir=" + profile_dir,
      "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
      "--disable-component-update", "--disable-extensions", "--disable-sync", "--hide-scrollbars",
      absl::StrCat("--window-size=", width, ",", height), "about:blank"};
  // Built before the fork: the child of a threaded process may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Its own process group, so that the renderers and helpers it starts go with it.
    setpgid(0, 0);
    // The pipe ends first go above 4, so that placing them at 3 and 4 cannot overwrite each other.
    const int in = fcntl(commands[0], F_DUPFD, 10);
    const int out = fcntl(answers[1], F_DUPFD, 10);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || log < 0 || dup2(in, 3) < 0 || dup2(out, 4) < 0 || dup2(log, 1) < 0 ||
        dup2(log, 2) < 0) {
      _exit(127);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(commands[0]);
  close(answers[1]);
  std::unique_ptr<HeadlessChromium> browser(new HeadlessChromium());
  browser->pid_ = pid;
  browser->to_browser_ = commands[1];
  browser->from_browser_ = answers[0];
  // Chromium's first start on a loaded machine takes seconds; a minute is ample.
  const absl::Duration startup = Scaled(absl::Seconds(60));
  auto target = browser->Call("Target.createTarget", {{"url", "about:blank"}}, false, startup);
  if (!target.ok()) return target.status();
  auto attached =
      browser->Call("Target.attachToTarget",
                    {{"targetId", (*target)["targetId"]}, {"flatten", true}}, false, startup);
  if (!attached.ok()) return attached.status();
  browser->session_ = (*attached)["sessionId"].get<std::string>();
  for (const char* domain : {"Runtime.enable", "Log.enable", "Page.enable"}) {
    if (auto r = browser->Call(domain, json::object(), true, startup); !r.ok()) return r.status();
  }
  auto metrics = browser->Call(
      "Emulation.setDeviceMetricsOverride",
      {{"width", width}, {"height", height}, {"deviceScaleFactor", 1}, {"mobile", false}}, true,
      startup);
  if (!metrics.ok()) return metrics.status();
  return browser;
}

HeadlessChromium::~HeadlessChromium() {
  if (pid_ <= 0) return;
  // Asked to close, then killed: a browser left behind would outlive the test.
  (void)Call("Browser.close", json::object(), false, absl::Seconds(10));
  close(to_browser_);
  close(from_browser_);
  bool exited = false;
  for (int i = 0; i < 200 && !exited; ++i) {
    exited = waitpid(pid_, nullptr, WNOHANG) == pid_;
    if (!exited) absl::SleepFor(absl::Milliseconds(50));
  }
  // Whatever of its group is left (a helper process that outlived it).
  kill(-pid_, SIGKILL);
  if (!exited) waitpid(pid_, nullptr, 0);
}

absl::StatusOr<json> HeadlessChromium::Read(absl::Time deadline) {
  while (true) {
    if (const size_t end = pending_.find('\0'); end != std::string::npos) {
      json message = json::parse(pending_.substr(0, end), nullptr, /*allow_exceptions=*/false);
      pending_.erase(0, end + 1);
      if (message.is_discarded())
        return absl::InternalError("the browser sent a message that is not JSON");
      return message;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("no answer from the browser in time");
    }
    pollfd p{from_browser_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    char buffer[65536];
    const ssize_t n = read(from_browser_, buffer, sizeof(buffer));
    if (n == 0) return absl::UnavailableError("the browser closed its pipe (did it crash?)");
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    }
    if (n > 0) pending_.append(buffer, static_cast<size_t>(n));
  }
}

void HeadlessChromium::Record(const json& event) {
  const std::string method = event.value("method", "");
  const json& params = event.contains("params") ? event["params"] : json::object();
  if (method == "Runtime.exceptionThrown") {
    errors_.push_back("uncaught exception: " + Describe(params["exceptionDetails"]));
  } else if (method == "Runtime.consoleAPICalled" &&
             (params.value("type", "") == "error" || params.value("type", "") == "assert")) {
    std::string text;
    for (const json& arg : params["args"]) {
      text += (text.empty() ? "" : " ") +
              (arg.contains("value") ? arg["value"].dump() : arg.value("description", "?"));
    }
    errors_.push_back("console." + params.value("type", "") + ": " + text);
  } else if (method == "Log.entryAdded" && params["entry"].value("level", "") == "error") {
    const json& entry = params["entry"];
    errors_.push_back(absl::StrCat("log (", entry.value("source", ""),
                                   "): ", entry.value("text", ""), " ", entry.value("url", "")));
  }
  if (!method.empty() && event.value("sessionId", "") == session_) seen_events_.push_back(method);
}

absl::StatusOr<json> HeadlessChromium::Call(const std::string& method, json params, bool to_page,
                                            absl::Duration timeout) {
  const int64_t id = next_id_++;
  json command = {{"id", id}, {"method", method}, {"params", std::move(params)}};
  if (to_page) command["sessionId"] = session_;
  std::string bytes = command.dump();
  bytes.push_back('\0');
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = write(to_browser_, bytes.data() + sent, bytes.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat(method, ": ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<json> message = Read(deadline);
    if (!message.ok()) {
      return absl::Status(message.status().code(),
                          absl::StrCat(method, ": ", message.status().message()));
    }
    if (!message->contains("id")) {
      Record(*message);
      continue;
    }
    if ((*message)["id"] != id) continue;  // the answer to a call given up on
    if (message->contains("error")) {
      return absl::InternalError(absl::StrCat(method, ": ", (*message)["error"].dump()));
    }
    return (*message)["result"];
  }
}

absl::Status HeadlessChromium::WaitForEvent(const std::string& method, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (auto it = std::find(seen_events_.begin(), seen_events_.end(), method);
        it != seen_events_.end()) {
      seen_events_.erase(seen_events_.begin(), it + 1);
      return absl::OkStatus();
    }
    absl::StatusOr<json> message = Read(deadline);
    if (!message.ok()) {
      return absl::Status(message.status().code(),
                          absl::StrCat("waiting for ", method, ": ", message.status().message()));
    }
    if (!message->contains("id")) Record(*message);
  }
}

absl::Status HeadlessChromium::Open(const std::string& url, absl::Duration timeout) {
  seen_events_.clear();
  auto navigated = Call("Page.navigate", {{"url", url}}, true, timeout);
  if (!navigated.ok()) return navigated.status();
  if (navigated->contains("errorText")) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", url, ": ", (*navigated)["errorText"].get<std::string>()));
  }
  return WaitForEvent("Page.loadEventFired", timeout);
}

absl::StatusOr<json> HeadlessChromium::Evaluate(const std::string& expression,
                                                absl::Duration timeout) {
  auto result = Call("Runtime.evaluate",
                     {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}},
                     true, timeout);
  if (!result.ok()) return result.status();
  if (result->contains("exceptionDetails")) {
    return absl::InternalError(
        absl::StrCat("evaluating ", expression, ": ", Describe((*result)["exceptionDetails"])));
  }
  const json& value = (*result)["result"];
  return value.contains("value") ? value["value"] : json(nullptr);
}

absl::Status HeadlessChromium::Screenshot(const std::string& path, absl::Duration timeout) {
  auto height = Evaluate("document.documentElement.scrollHeight", timeout);
  if (!height.ok()) return height.status();
  auto width = Evaluate("window.innerWidth", timeout);
  if (!width.ok()) return width.status();
  auto resized = Call("Emulation.setDeviceMetricsOverride",
                      {{"width", *width},
                       {"height", std::min<int64_t>(height->get<int64_t>(), 4000)},
                       {"deviceScaleFactor", 1},
                       {"mobile", false}},
                      true, timeout);
  if (!resized.ok()) return resized.status();
  auto shot = Call("Page.captureScreenshot", {{"format", "png"}}, true, timeout);
  if (!shot.ok()) return shot.status();
  std::string png;
  if (!absl::Base64Unescape((*shot)["data"].get<std::string>(), &png)) {
    return absl::InternalError("the screenshot is not base64");
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace zerod::testing
