#include "server/auth/cluster_members.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/auth/token_digest.h"

namespace zerod::server::auth {
namespace {

constexpr absl::Duration kVerdictLifetime = absl::Minutes(1);
// More distinct certificates than a cluster has members: the cache is cleared rather than grown.
constexpr size_t kMaxVerdicts = 1024;

// Every certificate in `pem`, in order.
std::vector<X509*> ReadCertificates(absl::string_view pem) {
  std::vector<X509*> certificates;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return certificates;
  while (X509* certificate = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    certificates.push_back(certificate);
  }
  BIO_free(bio);
  ERR_clear_error();  // the end of the input reads as an error
  return certificates;
}

void FreeAll(const std::vector<X509*>& certificates) {
  for (X509* certificate : certificates) X509_free(certificate);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterMembers>> ClusterMembers::FromPem(const std::string& ca_pem) {
  const std::vector<X509*> anchors = ReadCertificates(ca_pem);
  if (anchors.empty()) {
    return absl::InvalidArgumentError("--cluster-ca: holds no PEM certificate");
  }
  X509_STORE* store = X509_STORE_new();
  for (X509* anchor : anchors) X509_STORE_add_cert(store, anchor);
  FreeAll(anchors);
  // An intermediate CA that signs only members may be given alone, without its root.
  X509_STORE_set_flags(store, X509_V_FLAG_PARTIAL_CHAIN);
  X509_STORE_set_purpose(store, X509_PURPOSE_SSL_CLIENT);
  return std::unique_ptr<ClusterMembers>(new ClusterMembers(store));
}

ClusterMembers::~ClusterMembers() { X509_STORE_free(store_); }

bool ClusterMembers::Verify(absl::string_view leaf_pem, absl::string_view chain_pem) const {
  const std::vector<X509*> leaf = ReadCertificates(leaf_pem);
  if (leaf.size() != 1) {
    FreeAll(leaf);
    return false;
  }
  const std::vector<X509*> chain = ReadCertificates(chain_pem);
  STACK_OF(X509)* untrusted = sk_X509_new_null();
  for (X509* certificate : chain) sk_X509_push(untrusted, certificate);
  X509_STORE_CTX* context = X509_STORE_CTX_new();
  const bool verified = context != nullptr && untrusted != nullptr &&
                        X509_STORE_CTX_init(context, store_, leaf[0], untrusted) == 1 &&
                        X509_verify_cert(context) == 1;
  X509_STORE_CTX_free(context);
  sk_X509_free(untrusted);
  FreeAll(chain);
  FreeAll(leaf);
  ERR_clear_error();
  return verified;
}

bool ClusterMembers::IsMember(absl::string_view leaf_pem, absl::string_view chain_pem) const {
  if (leaf_pem.empty()) return false;
  const std::string key = TokenDigest(absl::StrCat(leaf_pem, "\n", chain_pem));
  const absl::Time now = absl::Now();
  {
    MutexLock lock(&mu_);
    auto it = verdicts_.find(key);
    if (it != verdicts_.end() && now - it->second.second < kVerdictLifetime) {
      return it->second.first;
    }
  }
  const bool member = Verify(leaf_pem, chain_pem);
  MutexLock lock(&mu_);
  if (verdicts_.size() >= kMaxVerdicts) verdicts_.clear();
  verdicts_[key] = {member, now};
  return member;
}

}  // namespace zerod::server::auth
