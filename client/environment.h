#ifndef ZEROD_CLIENT_ENVIRONMENT_H_
#define ZEROD_CLIENT_ENVIRONMENT_H_

#include <cstdlib>
#include <string>

namespace zerod::client {

// The value of the environment variable `name`; empty when it is unset.
inline std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_ENVIRONMENT_H_
