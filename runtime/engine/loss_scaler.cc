#include "runtime/engine/loss_scaler.h"

#include <algorithm>

namespace zerod::engine {

LossScaler::LossScaler(LossScaleOptions options)
    : options_(options), scale_(options.initial_scale), hysteresis_left_(options.hysteresis) {}

bool LossScaler::Update(bool overflow) {
  if (!options_.enabled) return !overflow;
  if (overflow) {
    clean_steps_ = 0;
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    }
    return false;
  }
  if (++clean_steps_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_steps_ = 0;
    hysteresis_left_ = options_.hysteresis;
  }
  return true;
}

}  // namespace zerod::engine
