// The real zerod against a state file damaged while it was down: emptied, deleted, replaced by
// another state's, its pages or a value's bytes overwritten, a job record that does not decode;
// and against a disk that fills up while it runs (a real, small tmpfs).

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/synthetic_layout.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/small_filesystem.h"

namespace zerod::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

client::JoinOptions JoinOf(const std::string& job, int64_t world = 1) {
  client::JoinOptions o;
  o.job_id = job;
  o.world_size = world;
  o.rank = 0;
  o.host = "test-host";
  o.layout = plan::SyntheticLayout(1 << 12, DType::kFloat32, 2);
  o.plan_options.stage = 1;
  return o;
}

// A job formed (one rank) with one store key set: state that must survive.
void FormJob(ZerodHarness& zerod, const std::string& job, const std::string& key = "",
             const std::string& value = "") {
  auto client = zerod.Client();
  auto joined = client->Join(JoinOf(job), Scaled(absl::Seconds(30)));
  ASSERT_TRUE(joined.ok()) << joined.status();
  if (!key.empty()) {
    ASSERT_TRUE(client->StoreSet(job, key, value).ok());
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A daemon that has state, stopped cleanly (its log checkpointed into zerod.db).
void StateThenStop(ZerodHarness& zerod) {
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  ASSERT_NO_FATAL_FAILURE(FormJob(zerod, "kept", "addr", "10.0.0.1:29500"));
  ASSERT_EQ(zerod.Terminate(), 0);
}

TEST(StateIntegrity, AStateFileEmptiedWhileZerodWasDownIsRefusedNamingTheFileAndTheWayOut) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(StateThenStop(zerod));
  const std::string db = zerod.data_dir() + "/zerod.db";
  fs::resize_file(db, 0);
  const ProcessResult refused = zerod.StartRefused();
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.out, AllOf(HasSubstr(db + " is empty"), HasSubstr("--reset-state")));
  EXPECT_EQ(fs::file_size(db), 0u) << "a refused start changes nothing";
}

TEST(StateIntegrity, AMissingStateFileIsRefusedNamingIt) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(StateThenStop(zerod));
  const std::string db = zerod.data_dir() + "/zerod.db";
  fs::remove(db);
  const ProcessResult refused = zerod.StartRefused();
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.out, AllOf(HasSubstr(db + " is missing"), HasSubstr("--reset-state")));
  EXPECT_FALSE(fs::exists(db)) << "a refused start creates nothing";
}

TEST(StateIntegrity, AnotherStatesFileInItsPlaceIsRefused) {
  ZerodHarness zerod, other;
  ASSERT_NO_FATAL_FAILURE(StateThenStop(zerod));
  ASSERT_NO_FATAL_FAILURE(other.Start());
  ASSERT_EQ(other.Terminate(), 0);
  const std::string db = zerod.data_dir() + "/zerod.db";
  fs::copy_file(other.data_dir() + "/zerod.db", db, fs::copy_options::overwrite_existing);
  const ProcessResult refused = zerod.StartRefused();
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.out,
              AllOf(HasSubstr(db), HasSubstr("another state's file"), HasSubstr("--reset-state")));
}

TEST(StateIntegrity, AStateFileWithOverwrittenPagesIsRefusedWithWhatSqliteFound) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(StateThenStop(zerod));
  const std::string db = zerod.data_dir() + "/zerod.db";
  {
    // Past the file header: the first page's b-tree, which holds the schema.
    std::fstream f(db, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    const std::string junk(64, '\xa5');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  const ProcessResult refused = zerod.StartRefused();
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.out,
              AllOf(HasSubstr("state database " + db + " is damaged"), HasSubstr("--reset-state")));
}

TEST(StateIntegrity, ResetStateMovesTheDamagedFilesAsideAndStartsEmpty) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(StateThenStop(zerod));
  const std::string db = zerod.data_dir() + "/zerod.db";
  const std::string before = ReadAll(db);
  ASSERT_FALSE(before.empty());
  {
    std::fstream f(db, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("damaged", 7);
  }
  ASSERT_NE(zerod.StartRefused().exit_code, 0);
  ASSERT_NO_FATAL_FAILURE(zerod.Start({"--reset-state"}));
  auto jobs = zerod.Client()->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs_size(), 0);
  std::string backup;
  for (const auto& entry : fs::directory_iterator(zerod.data_dir())) {
    const std::string name = entry.path().filename();
    if (name.rfind("zerod.db.reset-", 0) == 0 && name.find("-wal") == std::string::npos &&
        name.find("-shm") == std::string::npos) {
      backup = entry.path();
    }
  }
  ASSERT_FALSE(backup.empty()) << "no zerod.db.reset-* in " << zerod.data_dir();
  std::string expected = before;
  expected.replace(100, 7, "damaged");
  EXPECT_EQ(ReadAll(backup), expected) << "the damaged file is kept, as it was";
  EXPECT_THAT(zerod.Log(), HasSubstr("moved " + db));
  // The new state is the one that counts from now on: a plain restart takes it.
  ASSERT_EQ(zerod.Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
}

// Finds `needle` in the file and changes one byte inside it.
void FlipByteInside(const std::string& path, const std::string& needle) {
  const std::string bytes = ReadAll(path);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos) << needle << " not in " << path;
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos) << needle << " twice in " << path;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at + needle.size() / 2));
  f.put('#');
}

TEST(StateIntegrity, BytesChangedInsideAStoredValueAreNotServedAndOnlyThatJobIsQuarantined) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  ASSERT_NO_FATAL_FAILURE(FormJob(zerod, "hit", "addr", "rendezvous-10.1.2.3:29500"));
  ASSERT_NO_FATAL_FAILURE(FormJob(zerod, "spared", "addr", "10.9.9.9:29500"));
  ASSERT_EQ(zerod.Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(
      FlipByteInside(zerod.data_dir() + "/zerod.db", "rendezvous-10.1.2.3:29500"));

  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  auto hit = client->DescribeJob("hit");
  ASSERT_FALSE(hit.ok()) << "a damaged job is served: " << hit->DebugString();
  EXPECT_EQ(hit.status().code(), absl::StatusCode::kDataLoss) << hit.status();
  EXPECT_THAT(std::string(hit.status().message()),
              AllOf(HasSubstr("job hit is quarantined"), HasSubstr("jobs/hit/kv/addr is damaged"),
                    HasSubstr("quarantine/hit/")));
  auto value = client->StoreGet("hit", "addr", absl::ZeroDuration());
  ASSERT_FALSE(value.ok()) << "damaged bytes served: " << *value;
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("job hit is quarantined"));
  EXPECT_TRUE(client->DescribeJob("spared").ok());
  EXPECT_EQ(*client->StoreGet("spared", "addr", absl::ZeroDuration()), "10.9.9.9:29500");
  EXPECT_THAT(zerod.Log(), AllOf(HasSubstr("record 'jobs/hit/kv/addr' is damaged"),
                                 HasSubstr("job hit: quarantined")));

  // Still quarantined after another restart; joining the id again starts a new job, with none
  // of the old records.
  client.reset();
  ASSERT_EQ(zerod.Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  client = zerod.Client();
  EXPECT_THAT(client->DescribeJob("hit").status().message(), HasSubstr("is quarantined"));
  ASSERT_TRUE(client->Join(JoinOf("hit"), Scaled(absl::Seconds(30))).ok());
  EXPECT_TRUE(client->DescribeJob("hit").ok());
  auto fresh = client->StoreGet("hit", "addr", absl::ZeroDuration());
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kNotFound) << "old records mixed in";
}

TEST(StateIntegrity, OneJobRecordThatDoesNotDecodeIsQuarantinedAndTheOtherJobsLoad) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  ASSERT_NO_FATAL_FAILURE(FormJob(zerod, "bad"));
  ASSERT_NO_FATAL_FAILURE(FormJob(zerod, "good", "addr", "10.0.0.2:29500"));
  ASSERT_EQ(zerod.Terminate(), 0);
  {
    // Written through the store itself, so its checksum is right: only its contents are wrong.
    auto kv =
        server::SqliteKvStore::Open(zerod.data_dir() + "/zerod.db", server::Durability::kFull);
    ASSERT_TRUE(kv.ok()) << kv.status();
    ASSERT_TRUE((*kv)->CommitSync({server::KvOp::Put("jobs/bad/meta", "{\"world_size\": ")}).ok());
  }

  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  auto bad = client->DescribeJob("bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()),
              AllOf(HasSubstr("job bad is quarantined"), HasSubstr("do not decode")));
  auto good = client->DescribeJob("good");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*client->StoreGet("good", "addr", absl::ZeroDuration()), "10.0.0.2:29500");
  EXPECT_THAT(zerod.Log(), HasSubstr("job bad: quarantined"));
  EXPECT_THAT(client->DescribeJob("never-was").status().message(), Not(HasSubstr("quarantined")));
}

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(StateIntegrity, AFullDiskIsResourceExhaustedLoggedOnceAndLosesNothing) {
  ZerodHarness zerod;
  SmallFilesystem disk(zerod.data_dir(), "3m");
  if (!disk.mounted()) GTEST_SKIP() << "needs a real small filesystem: " << disk.error();
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  ASSERT_NO_FATAL_FAILURE(FormJob(zerod, "j", "first", "stored before the disk filled"));
  // Room that the test gives back later, as an operator would.
  const std::string ballast = zerod.data_dir() + "/ballast";
  {
    std::ofstream out(ballast, std::ios::binary);
    const std::string block(64 << 10, 'b');
    for (int i = 0; i < 16; ++i)
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
  auto client = zerod.Client();
  const std::string value(256 << 10, 'v');
  absl::Status full;
  int stored = 0;
  for (int i = 0; i < 64 && full.ok(); ++i) {
    full = client->StoreSet("j", "big" + std::to_string(i), value);
    if (full.ok()) ++stored;
  }
  ASSERT_FALSE(full.ok()) << "the disk never filled";
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr("no space left in " + zerod.data_dir()));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(client->StoreSet("j", "more", value).code(), absl::StatusCode::kResourceExhausted);
  }
  // Reads go on, and what was stored is all there.
  EXPECT_EQ(*client->StoreGet("j", "first", absl::ZeroDuration()), "stored before the disk filled");
  for (int i = 0; i < stored; ++i) {
    EXPECT_EQ(client->StoreGet("j", "big" + std::to_string(i), absl::ZeroDuration())->size(),
              value.size());
  }
  EXPECT_EQ(CountOf(zerod.Log(), "no space left in"), 1) << zerod.Log();

  fs::remove(ballast);
  EXPECT_TRUE(client->StoreSet("j", "after", "space was freed").ok());
  EXPECT_THAT(zerod.Log(), HasSubstr("writes succeed again"));
  // And all of it survives a restart.
  client.reset();
  ASSERT_EQ(zerod.Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  client = zerod.Client();
  EXPECT_EQ(*client->StoreGet("j", "after", absl::ZeroDuration()), "space was freed");
  EXPECT_EQ(*client->StoreGet("j", "first", absl::ZeroDuration()), "stored before the disk filled");
}

}  // namespace
}  // namespace zerod::testing
