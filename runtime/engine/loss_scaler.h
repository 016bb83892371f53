#ifndef ZEROD_RUNTIME_ENGINE_LOSS_SCALER_H_
#define ZEROD_RUNTIME_ENGINE_LOSS_SCALER_H_

// Dynamic loss scaling for fp16 (DeepSpeed's and torch.cuda.amp's rules): an overflow skips the
// step and, once `hysteresis` overflows have been tolerated, halves the scale (not below
// `min_scale`); `growth_interval` clean steps in a row double it.

#include <cstdint>

namespace zerod::engine {

struct LossScaleOptions {
  bool enabled = false;  // on for fp16 parameters/gradients by default
  double initial_scale = 65536.0;
  int64_t growth_interval = 2000;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t hysteresis = 2;
  double min_scale = 1.0;
};

// What a checkpoint keeps of a scaler, so that a restored run backs off and grows as the
// uninterrupted one would.
struct LossScalerState {
  double scale = 65536.0;
  int64_t clean_steps = 0;
  int64_t hysteresis_left = 2;
};

class LossScaler {
 public:
  explicit LossScaler(LossScaleOptions options);
  double scale() const { return options_.enabled ? scale_ : 1.0; }
  LossScalerState state() const { return {scale_, clean_steps_, hysteresis_left_}; }
  void set_state(const LossScalerState& s) {
    scale_ = s.scale;
    clean_steps_ = s.clean_steps;
    hysteresis_left_ = s.hysteresis_left;
  }
  // Records a step's outcome; returns whether the step may be applied.
  bool Update(bool overflow);

 private:
  LossScaleOptions options_;
  double scale_;
  int64_t clean_steps_ = 0;
  int64_t hysteresis_left_;
};

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_LOSS_SCALER_H_
