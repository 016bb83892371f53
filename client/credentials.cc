#include "client/credentials.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/environment.h"

namespace zerod::client {
namespace {

// A job id as a file name: safe bytes as they are, the others as %XX.
std::string Escape(const std::string& job_id) {
  std::string out;
  for (const char c : job_id) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
        (c == '.' && !out.empty())) {
      out += c;
    } else {
      out += absl::StrFormat("%%%02X", static_cast<unsigned char>(c));
    }
  }
  return out;
}

bool MakeDir(const std::string& path) { return mkdir(path.c_str(), 0700) == 0 || errno == EEXIST; }

}  // namespace

std::string ConfigDir() {
  if (const std::string xdg = Env("XDG_CONFIG_HOME"); !xdg.empty()) return xdg + "/zerod";
  std::string home = Env("HOME");
  if (home.empty()) {
    if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) {
      home = pw->pw_dir;
    }
  }
  return home.empty() ? "" : home + "/.config/zerod";
}

std::string JobTokenPath(const std::string& job_id) {
  const std::string dir = ConfigDir();
  const std::string name = Escape(job_id);
  if (dir.empty() || job_id.empty() || name.size() > 200) return "";
  return absl::StrCat(dir, "/jobs/", name, ".token");
}

std::string NewToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    // Without randomness no token can be trusted; this is not a state to go on in.
    if (n <= 0) std::abort();
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), 32));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no token file ", path));
    return absl::PermissionDeniedError(absl::StrCat("cannot read token file ", path));
  }
  std::string line;
  std::getline(in, line);
  std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) return absl::NotFoundError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

std::string JobTokenFor(const std::string& job_id) {
  if (const std::string token = Env("ZEROD_JOB_TOKEN"); !token.empty()) {
    const std::string job = Env("ZEROD_JOB");
    if (job.empty() || job == job_id) return token;
  }
  const std::string path = JobTokenPath(job_id);
  if (path.empty()) return "";
  auto saved = ReadTokenFile(path);
  return saved.ok() ? *saved : "";
}

absl::StatusOr<std::string> JobTokenOrNew(const std::string& job_id) {
  if (std::string token = JobTokenFor(job_id); !token.empty()) return token;
  const std::string path = JobTokenPath(job_id);
  if (path.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id.substr(0, 64),
                     ": no job token and nowhere to keep one (no home directory, "
                     "or a job id too long for a file name): set ZEROD_JOB_TOKEN"));
  }
  const std::string dir = ConfigDir();
  if (!MakeDir(dir.substr(0, dir.rfind('/'))) || !MakeDir(dir) || !MakeDir(dir + "/jobs")) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, "/jobs for job tokens: ",
                                                    std::strerror(errno), "; set ZEROD_JOB_TOKEN"));
  }
  // Written whole under a private name, then linked into place: a reader never sees half a
  // token, and of two processes saving at once the first link wins and both use its token.
  const std::string token = NewToken();
  // Named after the new token itself: unique to this call, even among threads of one process.
  const std::string staging = absl::StrCat(path, ".", token.substr(0, 16), ".new");
  const int fd = open(staging.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", staging, ": ", std::strerror(errno)));
  }
  const std::string line = token + "\n";
  const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  const bool linked = written && link(staging.c_str(), path.c_str()) == 0;
  const int link_errno = errno;
  unlink(staging.c_str());
  if (linked) return token;
  if (written && link_errno == EEXIST) return ReadTokenFile(path);
  return absl::PermissionDeniedError(
      absl::StrCat("cannot save the job token as ", path, ": ", std::strerror(link_errno)));
}

void ForgetJobToken(const std::string& job_id) {
  if (const std::string path = JobTokenPath(job_id); !path.empty()) unlink(path.c_str());
}

}  // namespace zerod::client
