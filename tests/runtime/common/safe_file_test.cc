// Files written where a user points (safe_file.h), against what an attacker or an unlucky operator
// puts there: links (to a file, dangling, planted where a temporary file would go, in place of the
// parent directory), FIFOs, devices, directories. Each is refused by name and left as it was.

#include "runtime/common/safe_file.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class SafeFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "safe-file-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name)) << text;
    return Path(name);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::set<std::string> Entries() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.insert(e.path().filename().string());
    return out;
  }
  static mode_t Kind(const std::string& path) {
    struct stat st;
    EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
    return st.st_mode & S_IFMT;
  }

  std::string dir_;
};

TEST_F(SafeFile, WritesANewFileAndReplacesARegularOneWhole) {
  ASSERT_TRUE(WriteFileAtomically(Path("out"), "first").ok());
  EXPECT_EQ(Read(Path("out")), "first");
  // A hard link to the old file keeps the old bytes: the target is replaced, not written in place.
  fs::create_hard_link(Path("out"), Path("other-name"));
  ASSERT_TRUE(WriteFileAtomically(Path("out"), "second, longer").ok());
  EXPECT_EQ(Read(Path("out")), "second, longer");
  EXPECT_EQ(Read(Path("other-name")), "first");
  EXPECT_EQ(Entries(), (std::set<std::string>{"out", "other-name"}));
  // A bare name is written in the working directory's terms.
  const fs::path before = fs::current_path();
  fs::current_path(dir_);
  EXPECT_TRUE(WriteFileAtomically("bare", "x").ok());
  fs::current_path(before);
  EXPECT_EQ(Read(Path("bare")), "x");
}

TEST_F(SafeFile, RefusesEveryTargetThatIsNotARegularFileAndLeavesItAsItWas) {
  const std::string victim = Write("victim", "precious");
  fs::create_symlink(victim, Path("link"));
  fs::create_symlink(Path("nowhere"), Path("dangling"));
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  fs::create_directory(Path("directory"));
  struct Case {
    std::string name;
    std::string said;
    mode_t kind;
  };
  std::vector<Case> cases = {
      {"link", "is a symbolic link (to " + victim + "): refusing to write through it", S_IFLNK},
      {"dangling", "is a symbolic link", S_IFLNK},
      {"fifo", "is a FIFO, not a regular file: refusing to write to it", S_IFIFO},
      {"directory", "is a directory, not a regular file", S_IFDIR}};
  for (const Case& c : cases) {
    const std::string path = Path(c.name);
    for (const absl::Status& s :
         {CheckRegularFileTarget(path), WriteFileAtomically(path, "x"),
          AtomicFileWriter::Create(path).status(), OpenRegularFileForAppend(path, 0600).status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.name << ": " << s;
      EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(path + " "), HasSubstr(c.said)));
    }
    EXPECT_EQ(Kind(path), c.kind) << c.name << " was replaced";
  }
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_FALSE(fs::exists(Path("nowhere")));
  EXPECT_EQ(Entries(), (std::set<std::string>{"victim", "link", "dangling", "fifo", "directory"}))
      << "something was left beside the targets";
}

// The case: a device node (here /dev/null's numbers). Needs CAP_MKNOD (CI runs as root).
TEST_F(SafeFile, RefusesADeviceNodeAndLeavesItAsItWas) {
  if (mknod(Path("device").c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0) {
    GTEST_SKIP() << "mknod refused here (" << std::strerror(errno) << "): no device node to test";
  }
  const std::string path = Path("device");
  for (const absl::Status& s :
       {CheckRegularFileTarget(path), WriteFileAtomically(path, "x"),
        AtomicFileWriter::Create(path).status(), OpenRegularFileForAppend(path, 0600).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(path + " is a character device, not a regular file"));
  }
  EXPECT_EQ(Kind(path), static_cast<mode_t>(S_IFCHR));
  EXPECT_EQ(Entries(), (std::set<std::string>{"device"}));
}

// A file replaced keeps its mode: a token or port file made 0600 does not become world-readable.
TEST_F(SafeFile, AReplacedFileKeepsItsMode) {
  Write("secret", "old");
  ASSERT_EQ(chmod(Path("secret").c_str(), 0600), 0);
  ASSERT_TRUE(WriteFileAtomically(Path("secret"), "new").ok());
  struct stat st;
  ASSERT_EQ(stat(Path("secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(Read(Path("secret")), "new");
}

// `out/` names a directory: never trimmed to a file `out`.
TEST_F(SafeFile, APathEndingInASlashIsRefusedAsNamingADirectory) {
  for (const absl::Status& s :
       {CheckRegularFileTarget(Path("out") + "/"), WriteFileAtomically(Path("out") + "/", "x"),
        OpenRegularFileForAppend(Path("out") + "/", 0600).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(Path("out") + "/ ends with '/'"));
  }
  EXPECT_TRUE(Entries().empty());
}

// A target whose temporary name beside it cannot be made: the error names the target and its
// directory, not the temporary name.
TEST_F(SafeFile, ATemporaryFileThatCannotBeMadeIsReportedByTheTargetsName) {
  const std::string target = Path(std::string(250, 'a'));
  const absl::Status s = WriteFileAtomically(target, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(target + ": cannot create a file in " + dir_ + " to write it"),
                    Not(HasSubstr(".tmp"))));
}

// getrandom failing ENOSYS (a sandbox's seccomp filter, an old kernel), installed in a child
// process: the temporary names come from /dev/urandom, still fresh and distinct.
bool BlockGetrandom() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])),
                               filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

TEST_F(SafeFile, WithoutGetrandomTemporaryNamesAreStillFreshAndDistinct) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!BlockGetrandom()) _exit(3);
    unsigned char byte = 0;
    if (getrandom(&byte, 1, 0) != -1 || errno != ENOSYS) _exit(4);
    auto first = AtomicFileWriter::Create(Path("out"));
    auto second = AtomicFileWriter::Create(Path("out"));
    if (!first.ok() || !second.ok()) _exit(5);
    if (first->temp_path() == second->temp_path()) _exit(6);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: no seccomp filter, 4: getrandom not blocked, 5: a "
                                       "writer failed, 6: the same temporary name twice";
}

// What is at the target is looked at again at the rename: a link put there while the file was
// being written is refused too, and the temporary file goes.
TEST_F(SafeFile, ALinkSwappedInWhileWritingIsRefusedAtTheRename) {
  const std::string victim = Write("victim", "precious");
  auto file = AtomicFileWriter::Create(Path("out"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Append("new bytes").ok());
  fs::create_symlink(victim, Path("out"));
  const absl::Status s = file->Commit();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a symbolic link"));
  EXPECT_TRUE(fs::is_symlink(Path("out")));
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_EQ(Entries(), (std::set<std::string>{"victim", "out"}));
}

// A link planted where a writer with a fixed temporary name would write (`out.tmp`): the file is
// written under a fresh name nobody had (O_EXCL), never through the link.
TEST_F(SafeFile, NeverWritesThroughALinkPlantedWhereATemporaryFileMightGo) {
  const std::string victim = Write("victim", "precious");
  fs::create_symlink(victim, Path("out.tmp"));
  auto file = AtomicFileWriter::Create(Path("out"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE(file->temp_path(), Path("out.tmp"));
  EXPECT_EQ(Kind(file->temp_path()), static_cast<mode_t>(S_IFREG));
  ASSERT_TRUE(file->Append("new").ok());
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_EQ(Read(Path("out")), "new");
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_TRUE(fs::is_symlink(Path("out.tmp")));
}

TEST_F(SafeFile, AFileNeverCommittedLeavesNothingAndTheTargetAsItWas) {
  Write("out", "old");
  {
    auto file = AtomicFileWriter::Create(Path("out"));
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE(file->Append("half of the new").ok());
    EXPECT_TRUE(fs::exists(file->temp_path()));
  }
  EXPECT_EQ(Read(Path("out")), "old");
  EXPECT_EQ(Entries(), (std::set<std::string>{"out"}));
}

TEST_F(SafeFile, AParentThatMustNotBeALinkIsRefusedWhenItIsOne) {
  fs::create_directory(Path("real"));
  fs::create_directory_symlink(Path("real"), Path("step"));
  SafeWriteOptions options;
  options.parent_must_not_be_link = true;
  const absl::Status s = WriteFileAtomically(Path("step") + "/file", "x", options);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(Path("step") + " is a symbolic link"), HasSubstr("file")));
  EXPECT_TRUE(fs::is_empty(Path("real")));
  // By default the path's directories are followed as it names them.
  EXPECT_TRUE(WriteFileAtomically(Path("step") + "/file", "x").ok());
  EXPECT_EQ(Read(Path("real") + "/file"), "x");
}

TEST_F(SafeFile, MissingDirectoriesAndEmptyNamesAreNamed) {
  const absl::Status missing = WriteFileAtomically(Path("no/such/dir/out"), "x");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_THAT(std::string(missing.message()), HasSubstr(Path("no/such/dir")));
  EXPECT_EQ(WriteFileAtomically("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFileAtomically(dir_ + "/", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFileAtomically(dir_, "x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SafeFile, AppendCreatesOrAppendsToARegularFileAndNeverBlocksOnAFifo) {
  auto fd = OpenRegularFileForAppend(Path("log"), 0640);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(write(*fd, "one\n", 4), 4);
  close(*fd);
  fd = OpenRegularFileForAppend(Path("log"), 0640);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(write(*fd, "two\n", 4), 4);
  EXPECT_EQ(fcntl(*fd, F_GETFL) & O_NONBLOCK, 0);
  close(*fd);
  EXPECT_EQ(Read(Path("log")), "one\ntwo\n");
  struct stat st;
  ASSERT_EQ(stat(Path("log").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077 & ~0640, 0u) << "created wider than asked";
  // A FIFO with no reader: refused at once (this test would hang if the open waited).
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  EXPECT_EQ(OpenRegularFileForAppend(Path("fifo"), 0640).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Reading is as strict: a checkpoint's rank file swapped for a link or a FIFO is refused, at once.
TEST_F(SafeFile, OpeningToReadTakesRegularFilesOnly) {
  const std::string file = Write("file", "bytes");
  auto fd = OpenRegularFile(file, O_RDONLY);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  fs::create_symlink(file, Path("link"));
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  const absl::Status link = OpenRegularFile(Path("link"), O_RDONLY).status();
  EXPECT_EQ(link.code(), absl::StatusCode::kFailedPrecondition) << link;
  EXPECT_THAT(std::string(link.message()),
              HasSubstr("is a symbolic link (to " + file + "): refusing to read through it"));
  const absl::Status fifo = OpenRegularFile(Path("fifo"), O_RDONLY).status();
  EXPECT_EQ(fifo.code(), absl::StatusCode::kFailedPrecondition) << fifo;
  EXPECT_THAT(std::string(fifo.message()), HasSubstr("is a FIFO, not a regular file"));
  const absl::Status missing = OpenRegularFile(Path("none"), O_RDONLY).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr(Path("none") + " is missing"));
}

}  // namespace
}  // namespace zerod
