#include "server/state/kv_watchers.h"

#include "absl/strings/match.h"

namespace zerod::server {

int64_t KvWatchers::Add(const std::string& prefix, KvStore::WatchCallback callback) {
  MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  watchers_.emplace(id, Watcher{prefix, std::move(callback)});
  return id;
}

void KvWatchers::Remove(int64_t id) {
  MutexLock lock(&mu_);
  watchers_.erase(id);
}

void KvWatchers::Deliver(const std::vector<KvEvent>& events) {
  MutexLock lock(&mu_);
  for (const auto& [id, watcher] : watchers_) {
    std::vector<KvEvent> mine;
    for (const KvEvent& e : events) {
      if (absl::StartsWith(e.key, watcher.prefix)) mine.push_back(e);
    }
    if (!mine.empty()) watcher.callback(mine);
  }
}

std::vector<KeyValue> RangeOfMirror(const std::map<std::string, KeyValue>& data,
                                    const std::string& prefix) {
  std::vector<KeyValue> out;
  for (auto it = data.lower_bound(prefix); it != data.end() && absl::StartsWith(it->first, prefix);
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

}  // namespace zerod::server
