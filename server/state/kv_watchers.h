#ifndef ZEROD_SERVER_STATE_KV_WATCHERS_H_
#define ZEROD_SERVER_STATE_KV_WATCHERS_H_

// What every KvStore backend shares about its readers: the watchers of prefixes, told of committed
// changes in order, and a range read of an in-memory mirror by prefix.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "runtime/common/mutex.h"
#include "server/state/kv_store.h"

namespace zerod::server {

class KvWatchers {
 public:
  int64_t Add(const std::string& prefix, KvStore::WatchCallback callback);
  void Remove(int64_t id);
  // Calls every watcher with the events under its prefix (none when there are none), under the
  // list's lock, so that callbacks of one delivery never interleave with another's.
  void Deliver(const std::vector<KvEvent>& events);

 private:
  struct Watcher {
    std::string prefix;
    KvStore::WatchCallback callback;
  };
  Mutex mu_;
  std::map<int64_t, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// The mirror's records whose keys start with `prefix`, in key order.
std::vector<KeyValue> RangeOfMirror(const std::map<std::string, KeyValue>& data,
                                    const std::string& prefix);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_KV_WATCHERS_H_
