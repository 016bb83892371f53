#include "server/state/internal/etcd_txn.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/state/internal/etcd_client.h"

namespace zerod::server::internal {

CommitReads ReadsFor(const std::vector<KvOp>& ops) {
  CommitReads reads;
  for (size_t i = 0; i < ops.size(); ++i) {
    const KvOp& op = ops[i];
    if (op.kind == KvOp::Kind::kDelete || op.kind == KvOp::Kind::kAdd ||
        op.kind == KvOp::Kind::kCompareAndSwap) {
      reads.keys.insert(op.key);
    }
    if (op.kind != KvOp::Kind::kDeletePrefix) continue;
    for (size_t j = i + 1; j < ops.size(); ++j) {
      if (ops[j].kind != KvOp::Kind::kDelete && ops[j].kind != KvOp::Kind::kDeletePrefix &&
          absl::StartsWith(ops[j].key, op.key)) {
        reads.prefixes.insert(op.key);
      }
    }
  }
  return reads;
}

absl::StatusOr<CommitPlan> PlanCommit(const std::vector<KvOp>& ops, const CommitReads& reads,
                                      const CommitSnapshot& snapshot, const std::string& prefix) {
  // key -> value afterwards (nullopt: deleted), over the prefixes deleted so far.
  std::map<std::string, std::optional<std::string>> staged;
  std::vector<std::string> deleted_prefixes;
  auto lookup = [&](const std::string& key) -> std::optional<std::string> {
    if (auto it = staged.find(key); it != staged.end()) return it->second;
    for (const std::string& p : deleted_prefixes) {
      if (absl::StartsWith(key, p)) return std::nullopt;
    }
    if (auto it = snapshot.values.find(key); it != snapshot.values.end()) return it->second.first;
    return std::nullopt;
  };
  CommitPlan plan;
  for (const KvOp& op : ops) {
    KvOpResult r;
    switch (op.kind) {
      case KvOp::Kind::kPut:
        staged[op.key] = op.value;
        r.value = op.value;
        break;
      case KvOp::Kind::kDelete:
        r.applied = lookup(op.key).has_value();
        if (r.applied) staged[op.key] = std::nullopt;
        break;
      case KvOp::Kind::kDeletePrefix:
        for (auto it = staged.lower_bound(op.key);
             it != staged.end() && absl::StartsWith(it->first, op.key); ++it) {
          it->second = std::nullopt;
        }
        deleted_prefixes.push_back(op.key);
        break;
      case KvOp::Kind::kAdd: {
        int64_t value = 0;
        if (std::optional<std::string> prior = lookup(op.key)) {
          if (!absl::SimpleAtoi(*prior, &value)) {
            return absl::FailedPreconditionError(absl::StrCat(
                "key '", op.key, "' holds '", prior->substr(0, 32), "', not an integer"));
          }
        }
        if (__builtin_add_overflow(value, op.delta, &value)) {
          return absl::OutOfRangeError(absl::StrCat("key '", op.key, "': adding ", op.delta,
                                                    " would overflow a 64-bit integer"));
        }
        r.value = absl::StrCat(value);
        staged[op.key] = r.value;
        break;
      }
      case KvOp::Kind::kCompareAndSwap: {
        std::optional<std::string> prior = lookup(op.key);
        r.applied = op.expected ? (prior && *prior == *op.expected) : !prior;
        if (r.applied) {
          staged[op.key] = op.value;
          r.value = op.value;
        } else {
          r.value = prior;
        }
        break;
      }
    }
    plan.result.results.push_back(std::move(r));
  }
  if (staged.empty() && deleted_prefixes.empty()) return plan;

  etcdserverpb::TxnRequest& txn = plan.txn;
  for (const std::string& key : reads.keys) {
    // An absent key compares as mod_revision 0.
    auto it = snapshot.values.find(key);
    etcdserverpb::Compare* same = txn.add_compare();
    same->set_key(prefix + key);
    same->set_target(etcdserverpb::Compare::MOD);
    same->set_result(etcdserverpb::Compare::EQUAL);
    same->set_mod_revision(it == snapshot.values.end() ? 0 : it->second.second);
  }
  for (const std::string& p : reads.prefixes) {
    // Nothing under the prefix changed or appeared since the read.
    etcdserverpb::Compare* unchanged = txn.add_compare();
    unchanged->set_key(prefix + p);
    unchanged->set_range_end(PrefixEnd(prefix + p));
    unchanged->set_target(etcdserverpb::Compare::MOD);
    unchanged->set_result(etcdserverpb::Compare::LESS);
    unchanged->set_mod_revision(snapshot.revision + 1);
  }
  for (const std::string& p : deleted_prefixes) {
    if (reads.prefixes.count(p) == 0) {
      etcdserverpb::DeleteRangeRequest* range = txn.add_success()->mutable_request_delete_range();
      range->set_key(prefix + p);
      range->set_range_end(PrefixEnd(prefix + p));
      continue;
    }
    auto keys = snapshot.prefix_keys.find(p);
    if (keys == snapshot.prefix_keys.end()) continue;
    for (const std::string& key : keys->second) {
      auto it = staged.find(key);
      if (it != staged.end()) continue;  // its final state is written below
      txn.add_success()->mutable_request_delete_range()->set_key(prefix + key);
    }
  }
  for (const auto& [key, value] : staged) {
    if (value) {
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(prefix + key);
      put->set_value(*value);
      plan.puts = true;
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key(prefix + key);
    }
  }
  return plan;
}

}  // namespace zerod::server::internal
