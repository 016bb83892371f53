// adam_conformance FILE...: runs our Adam/AdamW at every dispatch level this build and CPU have
// (scalar, AVX2, AVX-512) on torch's conformance vectors (tests/testdata/adam/, made by
// scripts/make_adam_vectors.py), one line per file and level with the worst error relative to each
// array's largest magnitude. Exit 1 if any exceeds the bound (1e-6), 2 on unreadable input.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/optim/adam.h"

namespace {

constexpr double kBound = 1e-6;

using zerod::optim::AdamConfig;
using zerod::optim::AdamShard;
using zerod::optim::Isa;

std::vector<float> Floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }

// max |ours - torch| / max |torch|; 0 when both are all zero.
double RelativeError(const std::vector<float>& ours, const std::vector<float>& torch) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < torch.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(ours[i]) - torch[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(torch[i])));
  }
  if (worst == 0) return 0;
  return scale == 0 ? INFINITY : worst / scale;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: adam_conformance FILE.json...\n");
    return 2;
  }
  bool failed = false;
  for (int f = 1; f < argc; ++f) {
    nlohmann::json doc;
    try {
      std::ifstream in(argv[f]);
      if (!in) throw std::runtime_error("cannot open");
      doc = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "adam_conformance: %s: %s\n", argv[f], e.what());
      return 2;
    }
    AdamConfig config;
    const auto& hyper = doc.at("hyper");
    config.lr = hyper.at("lr").get<double>();
    config.beta1 = hyper.at("beta1").get<double>();
    config.beta2 = hyper.at("beta2").get<double>();
    config.eps = hyper.at("eps").get<double>();
    config.weight_decay = hyper.at("weight_decay").get<double>();
    config.decoupled_weight_decay = doc.at("algorithm").get<std::string>() == "adamw";
    const int64_t numel = doc.at("numel").get<int64_t>();
    const int64_t steps = doc.at("steps").get<int64_t>();
    for (Isa isa : zerod::optim::AvailableIsas()) {
      std::vector<float> param = Floats(doc.at("initial_param"));
      std::vector<float> m(static_cast<size_t>(numel), 0.0f), v(static_cast<size_t>(numel), 0.0f);
      double worst = 0;
      for (int64_t t = 0; t < steps; ++t) {
        const std::vector<float> grad = Floats(doc.at("grads").at(t));
        AdamShard shard;
        shard.param = param.data();
        shard.exp_avg = m.data();
        shard.exp_avg_sq = v.data();
        shard.grad = grad.data();
        shard.numel = numel;
        zerod::optim::AdamStep(shard, zerod::optim::MakeAdamScalars(config, t + 1), isa);
        const auto& expected = doc.at("after_step").at(t);
        worst = std::max({worst, RelativeError(param, Floats(expected.at("param"))),
                          RelativeError(m, Floats(expected.at("exp_avg"))),
                          RelativeError(v, Floats(expected.at("exp_avg_sq")))});
      }
      const bool ok = worst <= kBound;
      failed |= !ok;
      std::printf("%-40s %-7s %-6s n=%-6ld steps=%-3ld worst=%.3e %s\n", argv[f],
                  std::string(zerod::optim::IsaName(isa)).c_str(),
                  doc.at("algorithm").get<std::string>().c_str(), static_cast<long>(numel),
                  static_cast<long>(steps), worst, ok ? "ok" : "FAIL (bound 1e-6)");
    }
  }
  return failed ? 1 : 0;
}
