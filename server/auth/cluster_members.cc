#include "server/auth/cluster_members.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <ctime>
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

// When `certificate` expires (its notAfter); InfinitePast when it cannot be read.
absl::Time NotAfter(const X509* certificate) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(certificate), &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterMembers>> ClusterMembers::FromPem(const std::string& ca_pem,
                                                                        const Clock* clock) {
  const std::vector<X509*> anchors = ReadCertificates(ca_pem);
  if (anchors.empty()) {
    return absl::InvalidArgumentError("--cluster-ca: holds no PEM certificate");
  }
  X509_STORE* store = X509_STORE_new();
  if (store == nullptr) {
    FreeAll(anchors);
    return absl::ResourceExhaustedError("--cluster-ca: OpenSSL could not make a certificate store");
  }
  for (X509* anchor : anchors) X509_STORE_add_cert(store, anchor);
  FreeAll(anchors);
  // An intermediate CA that signs only members may be given alone, without its root.
  X509_STORE_set_flags(store, X509_V_FLAG_PARTIAL_CHAIN);
  X509_STORE_set_purpose(store, X509_PURPOSE_SSL_CLIENT);
  return std::unique_ptr<ClusterMembers>(new ClusterMembers(store, clock));
}

ClusterMembers::ClusterMembers(X509_STORE* store, const Clock* clock)
    : store_(store), clock_(clock != nullptr ? clock : &real_clock_) {}

ClusterMembers::~ClusterMembers() { X509_STORE_free(store_); }

ClusterMembers::Verdict ClusterMembers::Verify(absl::string_view leaf_pem,
                                               absl::string_view chain_pem, absl::Time now) const {
  Verdict verdict{.member = false, .until = now + kVerdictLifetime};
  const std::vector<X509*> leaf = ReadCertificates(leaf_pem);
  const std::vector<X509*> chain = ReadCertificates(chain_pem);
  STACK_OF(X509)* untrusted = sk_X509_new_null();
  for (X509* certificate : chain) {
    if (untrusted != nullptr) sk_X509_push(untrusted, certificate);
  }
  X509_STORE_CTX* context = X509_STORE_CTX_new();
  if (leaf.size() == 1 && context != nullptr && untrusted != nullptr &&
      X509_STORE_CTX_init(context, store_, leaf[0], untrusted) == 1) {
    X509_VERIFY_PARAM_set_time(X509_STORE_CTX_get0_param(context), absl::ToTimeT(now));
    verdict.member = X509_verify_cert(context) == 1;
    // Believed until the first certificate of the chain expires, at the latest.
    STACK_OF(X509)* verified = verdict.member ? X509_STORE_CTX_get0_chain(context) : nullptr;
    for (int i = 0; verified != nullptr && i < sk_X509_num(verified); ++i) {
      verdict.until = std::min(verdict.until, NotAfter(sk_X509_value(verified, i)));
    }
  }
  X509_STORE_CTX_free(context);
  sk_X509_free(untrusted);
  FreeAll(chain);
  FreeAll(leaf);
  ERR_clear_error();
  return verdict;
}

bool ClusterMembers::IsMember(absl::string_view leaf_pem, absl::string_view chain_pem) const {
  if (leaf_pem.empty()) return false;
  const std::string key = TokenDigest(absl::StrCat(leaf_pem, "\n", chain_pem));
  const absl::Time now = clock_->Now();
  {
    MutexLock lock(&mu_);
    auto it = verdicts_.find(key);
    if (it != verdicts_.end() && now < it->second.until) return it->second.member;
  }
  const Verdict verdict = Verify(leaf_pem, chain_pem, now);
  MutexLock lock(&mu_);
  if (verdicts_.size() >= kMaxVerdicts) verdicts_.clear();
  verdicts_[key] = verdict;
  return verdict.member;
}

bool ClusterMembers::Covers(absl::string_view pem) const {
  const std::vector<X509*> certificates = ReadCertificates(pem);
  STACK_OF(X509)* untrusted = sk_X509_new_null();
  for (X509* certificate : certificates) {
    if (untrusted != nullptr) sk_X509_push(untrusted, certificate);
  }
  bool covered = false;
  for (X509* certificate : certificates) {
    X509_STORE_CTX* context = X509_STORE_CTX_new();
    if (context != nullptr && untrusted != nullptr &&
        X509_STORE_CTX_init(context, store_, certificate, untrusted) == 1) {
      X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(context);
      X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_ANY);
      X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_NO_CHECK_TIME);
      covered = covered || X509_verify_cert(context) == 1;
    }
    X509_STORE_CTX_free(context);
  }
  sk_X509_free(untrusted);
  FreeAll(certificates);
  ERR_clear_error();
  return covered;
}

}  // namespace zerod::server::auth
