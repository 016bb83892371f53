#ifndef ZEROD_TESTS_INTEGRATION_HEADLESS_CHROMIUM_H_
#define ZEROD_TESTS_INTEGRATION_HEADLESS_CHROMIUM_H_

// A real headless Chromium driven through the DevTools protocol over --remote-debugging-pipe
// (JSON messages ending in NUL on file descriptors 3 and 4): no websocket client and no port to
// find. One page; what a test needs of it: open a URL, evaluate JavaScript, take a screenshot,
// and every console error, uncaught exception and failed load the page produced.
//
// Owns the browser process; the destructor closes it (SIGKILL if it does not go).

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace zerod::testing {

class HeadlessChromium {
 public:
  // The chromium binary ($ZEROD_TEST_CHROMIUM, else chromium or chromium-browser on PATH), or ""
  // when none is installed.
  static std::string Find();

  // Starts `binary` with a fresh profile in `profile_dir`, its output to `log_path`, and opens one
  // blank page of `width` x `height` CSS pixels.
  static absl::StatusOr<std::unique_ptr<HeadlessChromium>> Start(const std::string& binary,
                                                                 const std::string& profile_dir,
                                                                 const std::string& log_path,
                                                                 int width = 1280,
                                                                 int height = 1000);
  ~HeadlessChromium();
  HeadlessChromium(const HeadlessChromium&) = delete;
  HeadlessChromium& operator=(const HeadlessChromium&) = delete;

  // Navigates the page to `url` and waits for its load event.
  absl::Status Open(const std::string& url, absl::Duration timeout);
  // Evaluates `expression` in the page (a promise is awaited) and returns its value as JSON; an
  // exception in it is an error naming it.
  absl::StatusOr<nlohmann::json> Evaluate(const std::string& expression, absl::Duration timeout);
  // Writes a PNG of the whole page (up to 4000 pixels tall) to `path`.
  absl::Status Screenshot(const std::string& path, absl::Duration timeout);

  // Console errors, uncaught exceptions and failed loads (Log "error" entries: a 404, a blocked
  // request, a Content-Security-Policy violation) seen so far, one line each.
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  HeadlessChromium() = default;

  // Sends a command (to the page's session when `to_page`) and waits for its answer, recording
  // the events that come before it.
  absl::StatusOr<nlohmann::json> Call(const std::string& method, nlohmann::json params,
                                      bool to_page, absl::Duration timeout);
  // Waits for the page's event `method`, recording the others.
  absl::Status WaitForEvent(const std::string& method, absl::Duration timeout);
  // The next message from the browser, or an error at `deadline`.
  absl::StatusOr<nlohmann::json> Read(absl::Time deadline);
  void Record(const nlohmann::json& event);

  pid_t pid_ = -1;
  int to_browser_ = -1;
  int from_browser_ = -1;
  std::string pending_;  // bytes read past the last message
  int64_t next_id_ = 1;
  std::string session_;                   // the page's
  std::vector<std::string> seen_events_;  // page events not yet waited for, by method
  std::vector<std::string> errors_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_INTEGRATION_HEADLESS_CHROMIUM_H_
