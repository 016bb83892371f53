// Join admission: every check of a join's arguments and every decision, from plain values.

#include "server/join_admission.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;

std::vector<v1::TensorSpec> Layout(int64_t params) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
  rpc::ToProto(plan::SyntheticLayout(params, DType::kBFloat16, 4), &wire);
  return {wire.begin(), wire.end()};
}

std::string DigestOf(const std::vector<v1::TensorSpec>& layout) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(layout.begin(), layout.end());
  return plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
}

JoinArgs Args(int64_t rank, int64_t world = 4) {
  JoinArgs a;
  a.job_id = "llama";
  a.world_size = world;
  a.rank = rank;
  a.host = "host" + std::to_string(rank);
  a.device = "cuda:0";
  a.layout = Layout(1 << 16);
  a.layout_digest = DigestOf(a.layout);
  return a;
}

// A job of 4 ranks formed by Args(): `live` ranks live, the next free one `lowest_free`.
JobAdmissionView Job(int64_t live, std::optional<int64_t> lowest_free) {
  static const std::string digest = DigestOf(Layout(1 << 16));
  JobAdmissionView v;
  v.job_id = "llama";
  v.live_members = live;
  v.world_size = 4;
  v.generation = 3;
  v.layout_digest = digest;
  v.layout_digest_rank = 0;
  v.lowest_free_rank = lowest_free;
  return v;
}

Member Holder(const JoinArgs& args, v1::MemberState state) {
  Member m;
  m.state = state;
  m.host = args.host;
  m.device = args.device;
  return m;
}

absl::Status Refusal(const JoinDecision& d) {
  const auto* refuse = std::get_if<RefuseJoin>(&d);
  return refuse == nullptr ? absl::OkStatus() : refuse->status;
}

void ExpectAwait(const JoinDecision& d, int64_t rank, bool reform, bool supersede) {
  const auto* await = std::get_if<AwaitFormation>(&d);
  ASSERT_NE(await, nullptr) << "refused: " << Refusal(d);
  EXPECT_EQ(await->rank, rank);
  EXPECT_EQ(await->reform, reform);
  EXPECT_EQ(await->supersede, supersede);
}

TEST(CheckJoinArgs, AcceptsAJoinWithOrWithoutItsLayout) {
  EXPECT_TRUE(CheckJoinArgs(Args(0)).ok());
  JoinArgs digest_only = Args(-1);
  digest_only.layout.clear();
  EXPECT_TRUE(CheckJoinArgs(digest_only).ok());
}

TEST(CheckJoinArgs, RefusesBadJobIds) {
  for (const std::string& id : std::vector<std::string>{"", std::string(129, 'a'), "a/b", "a b"}) {
    JoinArgs a = Args(0);
    a.job_id = id;
    EXPECT_EQ(CheckJoinArgs(a).code(), absl::StatusCode::kInvalidArgument) << "'" << id << "'";
  }
  EXPECT_TRUE(ValidateJobId("Llama-7b_v2.1").ok());
}

TEST(CheckJoinArgs, RefusesWorldSizesOutOfRange) {
  for (int64_t world : {int64_t{0}, int64_t{-3}, (int64_t{1} << 24) + 1}) {
    JoinArgs a = Args(-1);
    a.world_size = world;
    const absl::Status s = CheckJoinArgs(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << world;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("got ", world)));
  }
}

TEST(CheckJoinArgs, RefusesWorldsAndJobIdsOverTheDaemonsLimits) {
  const JoinLimits limits{.max_world_size = 64, .max_job_id_bytes = 8};
  JoinArgs big = Args(-1, 65);
  EXPECT_THAT(std::string(CheckJoinArgs(big, limits).message()),
              HasSubstr("world size must be 1..64 (--max-world-size), got 65"));
  big.world_size = 64;
  EXPECT_TRUE(CheckJoinArgs(big, limits).ok());
  // The limit is never above what job records accept.
  const JoinLimits lax{.max_world_size = int64_t{1} << 40};
  JoinArgs huge = Args(-1, kHardMaxWorldSize + 1);
  EXPECT_EQ(CheckJoinArgs(huge, lax).code(), absl::StatusCode::kInvalidArgument);
  JoinArgs named = Args(0);
  named.job_id = "llama-7b-v2";
  EXPECT_THAT(std::string(CheckJoinArgs(named, limits).message()),
              HasSubstr("is 11 bytes, longer than 8 (--max-job-id-bytes)"));
}

TEST(CheckJoinArgs, RefusesALayoutDigestLongerThanANameWithoutEchoingIt) {
  JoinArgs a = Args(0);
  a.layout.clear();
  a.layout_digest = std::string(40 << 20, 'f');
  const absl::Status s = CheckJoinArgs(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("layout digest is 41943040 bytes, over 256"));
  EXPECT_LT(s.message().size(), 200u);
}

TEST(ShownKey, IsWholeUpTo64BytesElseAPrefixAndTheLength) {
  EXPECT_EQ(ShownKey("rank0/addr"), "rank0/addr");
  EXPECT_EQ(ShownKey(std::string(64, 'k')), std::string(64, 'k'));
  EXPECT_EQ(ShownKey(std::string(1 << 20, 'k')), std::string(64, 'k') + "... (1048576 bytes)");
}

TEST(CheckJoinArgs, RefusesRanksOutsideTheWorld) {
  for (int64_t rank : {int64_t{-2}, int64_t{4}}) {
    const absl::Status s = CheckJoinArgs(Args(rank));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("rank ", rank, " is out of range for world size 4")));
  }
}

TEST(CheckJoinArgs, RefusesAMissingOrFalseLayoutDigest) {
  JoinArgs none = Args(1);
  none.layout_digest.clear();
  EXPECT_THAT(std::string(CheckJoinArgs(none).message()), HasSubstr("rank 1: no layout digest"));
  JoinArgs lying = Args(1);
  lying.layout_digest = "00000000deadbeef";
  const absl::Status s = CheckJoinArgs(lying);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("layout digest 00000000deadbeef does not match its layout (" +
                        DigestOf(lying.layout) + ")"));
}

TEST(CheckJoinArgs, RefusesPlanOptionsNoPlanMeans) {
  auto refused = [](const std::function<void(JoinArgs&)>& change) {
    JoinArgs a = Args(0);
    change(a);
    const absl::Status s = CheckJoinArgs(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_param_dtype(static_cast<v1::DType>(99)); }),
              HasSubstr("job llama: rank 0: plan options: param_dtype 99 is unknown"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_grad_dtype(static_cast<v1::DType>(7)); }),
              HasSubstr("grad_dtype 7 is unknown"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_optimizer(static_cast<v1::Optimizer>(5)); }),
              HasSubstr("optimizer 5 is unknown"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_stage(7); }),
              HasSubstr("stage must be 0, 1, 2, 3 or auto (-1), got 7"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_partition_alignment_numel(-16); }),
              HasSubstr("partition_alignment_numel must be 0 (the default) or positive, got -16"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_reduce_bucket_bytes(-1); }),
              HasSubstr("reduce_bucket_bytes must be 0 (the default) or positive"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_partition_alignment_numel(1 << 30); }),
              HasSubstr("partition alignment: must be 1..2^20 elements, got 1073741824"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.budget_bytes = -5; }),
              HasSubstr("budget must be 0 (unbounded) or positive, got -5"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.host = std::string(40 << 20, 'h'); }),
              HasSubstr("host is 41943040 bytes, over 256"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.device = std::string(300, 'd'); }),
              HasSubstr("device is 300 bytes, over 256"));
  EXPECT_THAT(refused([](JoinArgs& a) {
                a.layout[0].set_dtype(static_cast<v1::DType>(42));
                a.layout_digest = DigestOf(a.layout);
              }),
              HasSubstr("has unknown dtype 42"));
  EXPECT_TRUE(CheckJoinArgs(Args(0)).ok());  // the defaults (0, UNSPECIFIED) are fine
}

TEST(DecideJoin, AJobStoringItsPlanAsksForARetry) {
  JobAdmissionView job = Job(4, std::nullopt);
  job.forming = true;
  const absl::Status s = Refusal(DecideJoin(job, Args(1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("job llama is storing its plan; retry"));
}

TEST(DecideJoin, ANamedRankOfAJobNobodyHoldsReformsIt) {
  // World size and layout differ from the old job's: nobody is left to disagree.
  JoinArgs a = Args(5, 8);
  a.layout = Layout(1 << 18);
  a.layout_digest = DigestOf(a.layout);
  ExpectAwait(DecideJoin(Job(0, 0), a), 5, /*reform=*/true, /*supersede=*/false);
}

TEST(DecideJoin, AnyRankOfAJobNobodyHoldsGetsRankZero) {
  // The old job's free ranks do not matter: it starts afresh.
  ExpectAwait(DecideJoin(Job(0, 3), Args(-1)), 0, /*reform=*/true, /*supersede=*/false);
}

TEST(DecideJoin, AnotherWorldSizeIsRefusedWhileRanksAreLive) {
  const absl::Status s = Refusal(DecideJoin(Job(2, 2), Args(-1, 8)));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job llama has world size 4; rank any asked for 8"));
}

TEST(DecideJoin, AnotherLayoutIsRefusedNamingBothRanks) {
  JoinArgs a = Args(2);
  a.layout = Layout(1 << 18);
  a.layout_digest = DigestOf(a.layout);
  const absl::Status s = Refusal(DecideJoin(Job(2, 2), a));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr("job llama: rank 2 layout digest " + a.layout_digest.substr(0, 8) +
                ".. differs from rank 0 (" + DigestOf(Layout(1 << 16)).substr(0, 8) + "..)"));
}

// The options and layout a job was formed with: a join that differs is refused naming what
// differs, not two digests.
struct FormedJob {
  v1::PlanOptions options;
  std::vector<v1::TensorSpec> layout = Layout(1 << 16);
  JobAdmissionView view = Job(2, 2);

  FormedJob() {
    options.set_stage(3);
    options.set_param_dtype(v1::DTYPE_BF16);
    (*options.mutable_agreed())["param_groups[0]"] = "lr=0.001 betas=(0.9, 0.95)";
    (*options.mutable_agreed())["max_grad_norm"] = "1.0";
    view.options = &options;
    view.layout = layout;
  }
};

JoinArgs AsFormed(const FormedJob& job) {
  JoinArgs a = Args(1);
  a.options = job.options;
  return a;
}

TEST(DecideJoin, OptionsThatDifferFromTheFormedJobsAreRefusedNamingTheFirst) {
  const FormedJob job;
  EXPECT_TRUE(Refusal(DecideJoin(job.view, AsFormed(job))).ok());
  auto refused = [&](const std::function<void(JoinArgs&)>& change) {
    JoinArgs a = AsFormed(job);
    change(a);
    const absl::Status s = Refusal(DecideJoin(job.view, a));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    return std::string(s.message());
  };
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_stage(2); }),
              HasSubstr("job llama: rank 1 asked for stage 2; rank 0 formed the job with stage 3 "
                        "(every rank must give the same options)"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_param_dtype(v1::DTYPE_FP32); }),
              HasSubstr("asked for param_dtype DTYPE_FP32; rank 0 formed the job with "
                        "param_dtype DTYPE_BF16"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.set_reduce_bucket_bytes(1 << 20); }),
              HasSubstr("asked for reduce_bucket_bytes 1048576; rank 0 formed the job with "
                        "reduce_bucket_bytes 0"));
  EXPECT_THAT(refused([](JoinArgs& a) {
                (*a.options.mutable_agreed())["param_groups[0]"] = "lr=0.002 betas=(0.9, 0.95)";
              }),
              HasSubstr("asked for param_groups[0] 'lr=0.002 betas=(0.9, 0.95)'; rank 0 formed "
                        "the job with param_groups[0] 'lr=0.001 betas=(0.9, 0.95)'"));
  EXPECT_THAT(refused([](JoinArgs& a) { a.options.mutable_agreed()->erase("max_grad_norm"); }),
              HasSubstr("asked for max_grad_norm (none); rank 0 formed the job with "
                        "max_grad_norm '1.0'"));
  // A stage that differs labels the layout differently too: the stage is named, not the layout.
  EXPECT_THAT(refused([](JoinArgs& a) {
                a.options.set_stage(2);
                a.layout[0].set_unit("other");
                a.layout_digest = DigestOf(a.layout);
              }),
              HasSubstr("asked for stage 2"));
}

TEST(DecideJoin, ALayoutThatDiffersIsRefusedNamingTheFirstTensorThatDiffers) {
  const FormedJob job;
  auto refused = [&](const std::function<void(std::vector<v1::TensorSpec>&)>& change) {
    JoinArgs a = AsFormed(job);
    change(a.layout);
    a.layout_digest = DigestOf(a.layout);
    const absl::Status s = Refusal(DecideJoin(job.view, a));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    return std::string(s.message());
  };
  const v1::TensorSpec& third = job.layout[2];
  const std::string shape = absl::StrJoin(third.shape(), ", ");
  EXPECT_THAT(refused([](std::vector<v1::TensorSpec>& l) { l[2].add_shape(2); }),
              HasSubstr(absl::StrCat("job llama: rank 1's layout differs from rank 0's at tensor "
                                     "2: rank 1 has '",
                                     third.name(), "' [", shape, ", 2] bf16, rank 0 has '",
                                     third.name(), "' [", shape, "] bf16")));
  EXPECT_THAT(refused([](std::vector<v1::TensorSpec>& l) { l[1].set_dtype(v1::DTYPE_FP32); }),
              HasSubstr("at tensor 1: rank 1 has '" + job.layout[1].name() + "' ["));
  EXPECT_THAT(refused([](std::vector<v1::TensorSpec>& l) { l.pop_back(); }),
              HasSubstr(absl::StrCat("rank 1 has ", job.layout.size() - 1, " tensors, rank 0 has ",
                                     job.layout.size(), ": tensor ", job.layout.size() - 1, " '",
                                     job.layout.back().name(), "'")));
  // Without the job's layout (no rank sent it), the digests are what is known.
  FormedJob digest_only;
  digest_only.view.layout = {};
  JoinArgs a = AsFormed(digest_only);
  a.layout[0].add_shape(3);
  a.layout_digest = DigestOf(a.layout);
  EXPECT_THAT(std::string(Refusal(DecideJoin(digest_only.view, a)).message()),
              HasSubstr("layout digest " + a.layout_digest.substr(0, 8)));
}

TEST(CheckJoinArgs, RefusesAgreedOptionsOverTheLimits) {
  JoinArgs a = Args(0);
  (*a.options.mutable_agreed())[std::string(300, 'k')] = "1";
  EXPECT_THAT(std::string(CheckJoinArgs(a).message()), HasSubstr("is 300 + 1 bytes, over 256"));
  a = Args(0);
  (*a.options.mutable_agreed())["lr"] = std::string(5000, '1');
  EXPECT_THAT(std::string(CheckJoinArgs(a).message()), HasSubstr("is 2 + 5000 bytes"));
  a = Args(0);
  for (int i = 0; i <= kMaxAgreedOptions; ++i) (*a.options.mutable_agreed())[std::to_string(i)];
  EXPECT_THAT(std::string(CheckJoinArgs(a).message()),
              HasSubstr("agreed options: 4097 entries, over 4096"));
}

TEST(DecideJoin, ANamedRankNobodyHoldsIsTaken) {
  ExpectAwait(DecideJoin(Job(2, 2), Args(3)), 3, false, false);
}

TEST(DecideJoin, ANamedRankWhoseHolderIsGoneIsTaken) {
  const JoinArgs a = Args(1);
  for (v1::MemberState gone : {v1::MEMBER_LOST, v1::MEMBER_LEFT}) {
    JobAdmissionView job = Job(3, 1);
    const Member holder = Holder(a, gone);
    job.holder = &holder;
    ExpectAwait(DecideJoin(job, a), 1, false, false);
  }
}

TEST(DecideJoin, ANamedRankHeldByAnotherProcessIsRefusedNamingIt) {
  JoinArgs a = Args(1);
  JobAdmissionView job = Job(3, 3);
  Member holder = Holder(a, v1::MEMBER_ACTIVE);
  holder.host = "elsewhere";
  job.holder = &holder;
  const absl::Status s = Refusal(DecideJoin(job, a));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 is held by host 'elsewhere' device 'cuda:0' (active)"));
  holder.host = a.host;
  holder.device = "cuda:1";  // the same host, another process
  EXPECT_EQ(Refusal(DecideJoin(job, a)).code(), absl::StatusCode::kAlreadyExists);
}

TEST(DecideJoin, ARetryOfAWaitingJoinSupersedesIt) {
  const JoinArgs a = Args(1);
  JobAdmissionView job = Job(2, 2);
  const Member holder = Holder(a, v1::MEMBER_JOINING);
  job.holder = &holder;
  ExpectAwait(DecideJoin(job, a), 1, false, /*supersede=*/true);
}

TEST(DecideJoin, ARetryOfAnActiveRankInARunningJobIsAnsweredAgain) {
  const JoinArgs a = Args(1);
  JobAdmissionView job = Job(4, std::nullopt);
  job.running = true;
  const Member holder = Holder(a, v1::MEMBER_ACTIVE);
  job.holder = &holder;
  const JoinDecision d = DecideJoin(job, a);
  const auto* again = std::get_if<AnswerAgain>(&d);
  ASSERT_NE(again, nullptr) << "refused: " << Refusal(d);
  EXPECT_EQ(again->rank, 1);
}

TEST(DecideJoin, AnActiveRankOfAJobThatMovedOnIsRefused) {
  const JoinArgs a = Args(1);
  JobAdmissionView job = Job(3, 0);  // degraded: rank 0 was lost
  const Member holder = Holder(a, v1::MEMBER_ACTIVE);
  job.holder = &holder;
  const absl::Status s = Refusal(DecideJoin(job, a));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 is already active in generation 3"));
}

TEST(DecideJoin, AnyRankTakesTheLowestFree) {
  ExpectAwait(DecideJoin(Job(2, 1), Args(-1)), 1, false, false);
}

TEST(DecideJoin, AnyRankOfAFullJobIsRefused) {
  const absl::Status s = Refusal(DecideJoin(Job(4, std::nullopt), Args(-1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("job llama is full: 4 of 4 ranks are live"));
}

}  // namespace
}  // namespace zerod::server
