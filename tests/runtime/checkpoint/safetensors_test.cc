// The safetensors export, read back by Python (json + numpy, as a safetensors reader does it):
// every tensor by name with its shape, equal bit for bit to the engine's FullMasterParameters.

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "tests/runtime/checkpoint/engine_world.h"
#include "tests/util/subprocess.h"

namespace zerod::checkpoint {
namespace {

using testing::EngineWorld;
using ::testing::HasSubstr;

// argv: the export, the expected fp32 values (raw, model order), then name=d0xd1... per tensor.
constexpr char kReader[] = R"(
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], 'rb').read()
(n,) = struct.unpack('<Q', raw[:8])
assert n % 8 == 0, 'header length %d is not a multiple of 8' % n
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
meta = header.pop('__metadata__')
assert meta['format'] == 'pt' and meta['zerod_step'] == '4', meta
want = np.fromfile(sys.argv[2], dtype='<f4')
got, end = [], 0
for spec in sys.argv[3:]:
    name, dims = spec.split('=')
    shape = [int(d) for d in dims.split('x')] if dims else []
    t = header.pop(name)
    assert t['dtype'] == 'F32' and t['shape'] == shape, (name, t)
    b, e = t['data_offsets']
    assert b == end, (name, b, end)
    end = e
    got.append(np.frombuffer(data[b:e], dtype='<f4').reshape(shape).ravel())
assert not header, 'unexpected tensors %s' % list(header)
assert end == len(data), (end, len(data))
assert np.concatenate(got).tobytes() == want.tobytes(), 'values differ'
print('ok', len(got))
)";

TEST(ExportSafetensors, PythonReadsTheFullParametersByName) {
  zerod::testing::TempDir tmp;
  for (int stage : {3, 0}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const std::string dir = StepDirectory(absl::StrCat(tmp.path(), "/stage-", stage), 4);
    EngineWorld world(testing::SmallLayout(), stage, 3, DType::kBFloat16);
    ASSERT_TRUE(world.ok()) << world.status();
    ASSERT_TRUE(world.Train(4).ok());
    ASSERT_TRUE(world.Save(dir).ok());
    auto full = world.FullMasterParameters();
    ASSERT_TRUE(full.ok()) << full.status();
    const std::string want = tmp.path() + "/want.f32";
    std::ofstream(want, std::ios::binary)
        .write(reinterpret_cast<const char*>(full->data()),
               static_cast<std::streamsize>(full->size() * sizeof(float)));

    const std::string out = tmp.path() + "/model.safetensors";
    ASSERT_TRUE(ExportSafetensors(dir, out).ok()) << ExportSafetensors(dir, out);
    for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) {
      EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << " was left beside the export";
    }
    std::vector<std::string> argv = {"/usr/bin/python3", "-c", kReader, out, want};
    for (const plan::TensorSpec& t : testing::SmallLayout()) {
      argv.push_back(absl::StrCat(t.name, "=", absl::StrJoin(t.shape, "x")));
    }
    const auto python = zerod::testing::RunProcess(argv);
    EXPECT_EQ(python.exit_code, 0) << python.err;
    EXPECT_EQ(python.out, absl::StrCat("ok ", testing::SmallLayout().size(), "\n"));
  }
}

TEST(ExportSafetensors, ADamagedShardFailsNamingItAndWritesNothing) {
  zerod::testing::TempDir tmp;
  const std::string dir = StepDirectory(tmp.path(), 0);
  EngineWorld world(testing::SmallLayout(), 1, 2, DType::kFloat32);
  ASSERT_TRUE(world.Save(dir).ok());
  std::filesystem::resize_file(dir + "/" + RankFileName(1), 20);
  const std::string out = tmp.path() + "/model.safetensors";
  absl::Status s = ExportSafetensors(dir, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(RankFileName(1) + " is truncated"));
  EXPECT_FALSE(std::filesystem::exists(out));
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) {
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << " was left beside the export";
  }
}

}  // namespace
}  // namespace zerod::checkpoint
