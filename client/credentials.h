#ifndef ZEROD_CLIENT_CREDENTIALS_H_
#define ZEROD_CLIENT_CREDENTIALS_H_

// A user's credentials for zerod, found without being written into scripts.
//
// A job belongs to a token, a 256-bit secret made by whoever starts the job: zerorun (which gives
// it to its ranks as ZEROD_JOB_TOKEN), or the SDK itself when a rank joins with none. Made tokens
// are saved 0600 as CONFIG/jobs/<job>.token (CONFIG: $XDG_CONFIG_HOME/zerod, else
// ~/.config/zerod), so the same user's other processes on the node (more ranks, `zeroctl end`)
// find them. Ranks on other nodes need ZEROD_JOB_TOKEN (zerorun passes its own on).
//
// TLS (the TCP endpoint of a daemon started with --tls-cert): ZEROD_TLS_CA is the CA that signed
// the daemon's certificate; ZEROD_TLS_CERT and ZEROD_TLS_KEY the client's, when the daemon asks.

#include <string>

#include "absl/status/statusor.h"

namespace zerod::client {

// $XDG_CONFIG_HOME/zerod, else $HOME/.config/zerod (HOME from the password file when unset);
// empty when there is no home.
std::string ConfigDir();

// Where `job_id`'s token is saved (CONFIG/jobs/<escaped job>.token); empty without a config dir
// or for a job id too long to be a file name.
std::string JobTokenPath(const std::string& job_id);

// 32 random bytes from the kernel (getrandom), as 64 hex digits.
std::string NewToken();

// The first line of a token file, without surrounding whitespace. NOT_FOUND when it does not
// exist, PERMISSION_DENIED when it cannot be read.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The token a call about `job_id` carries: $ZEROD_JOB_TOKEN when set and $ZEROD_JOB is unset or
// names this job, else the saved one; empty when there is none.
std::string JobTokenFor(const std::string& job_id);

// JobTokenFor, or else a new token saved for the job (directories 0700, file 0600, created
// atomically: when another process saves one first, that one is returned).
absl::StatusOr<std::string> JobTokenOrNew(const std::string& job_id);

// Removes the saved token of `job_id` (zerorun, for a job id only it could have used).
void ForgetJobToken(const std::string& job_id);

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_CREDENTIALS_H_
