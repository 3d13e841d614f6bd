// The balancer: which share of a batch's hardware-capable images (by pixels) goes to the hardware
// JPEG decoder, the rest to the threads; fixed, or balanced from each batch's timings.
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"

namespace packer_engine {

// One batch's pixels, by where they went (images that decode at all).
struct BatchPixels {
  double all = 0.0;      // every image decoded
  double hw = 0.0;       // sent to the hardware decoder
  double capable = 0.0;  // the hardware decoder could have taken
  int capable_n = 0;
};

class Balancer {
 public:
  static constexpr double kAutoStart = 0.8;
  // Where the hill climb (smaller images) starts, set at the first balanced batch of that kind:
  // the hardware engine alone. On an H200 (session 20, ~500 px, 4-16 threads) it decoded
  // 35-39k img/s on two cores against the climb's 32-36k from kAutoStart on 4-7 cores; the
  // threads' share only took cores from the lanes' host threads (and, beside a model, SMs).
  // The climb still steps down from there where a share on the threads helps.
  static constexpr double kClimbStart = 1.0;

  // hardware_share < 0: balanced from each batch's timings (starting at kAutoStart).
  explicit Balancer(double hardware_share);
  double share() const { return share_; }
  // Offsets in the output (im.offset); returns the bytes of the whole batch. The same whatever the
  // plan, so the output can be allocated before the batch's turn.
  static int64_t layout(std::vector<Image>& images);
  // Which capable images go to the hardware (im.to_hardware: a share by pixels, in batch order: the
  // hardware decoder batches any mix of sizes). In the batch's own turn, after the batch before
  // has moved the share: the same batches get the same plans however the calls overlap.
  void plan(std::vector<Image>& images, bool hardware) const;
  // After a batch (balanced only): threads_ms, the threads' part; hw_ms, the longest hardware
  // lane's call; call_ms, the whole call.
  void after_batch(const BatchPixels& px, double threads_ms, double hw_ms, double call_ms);

 private:
  void equalize(double threads_ms, double threads_px, double hw_ms, double hw_px, double capable_px);
  void observe(double call_ms, double px);

  // Balanced share, two rules (docs/benchmarks/vs_dali.md, session 15):
  // - images over kLaneMaxPixels (one hardware lane): equal times. There the hardware decoder
  //   itself is the limit and its rate hardly moves with the threads' load, so the batch, which
  //   waits for the longer of the threads' part and the hardware call, is shortest where the two
  //   take equally long. After each batch: the share that would have made them equal at the rates
  //   this batch showed (pixels per ms on each side), and a step of kGain toward it, at most
  //   kMaxStep. A side that decoded nothing gives no rate: the share steps kMaxStep toward it.
  //   (H100, 1080p, the native decoder alone, 12 threads: 7.0-7.7k img/s against the climb's 6.7-7.1k.)
  // - smaller images: the hill climb on the whole call's time per pixel (observe). There the lanes'
  //   host threads are the limit and slow down as the threads take more, so equal times sit past
  //   the best share (H100, ~500 px, the native decoder alone, 12 threads: 17.2-17.7k img/s against
  //   the climb's 19.4-20.4k).
  // PACKER_ENGINE_BALANCE=equal or =climb uses one rule for every batch (for measuring).
  static constexpr double kGain = 0.5;
  static constexpr double kMaxStep = 0.05;
  // The hill climb: one step of kStep per window of kWindow batches, turning back when a step made
  // the call's time per pixel worse (contention between the threads and the hardware included).
  static constexpr double kStep = 0.05;
  static constexpr int kWindow = 4;
  // At a bound (share 0 or 1) the climb stays kHoldWindows windows before it steps away once.
  static constexpr int kHoldWindows = 4;
  enum Rule { kBySize, kEqual, kClimb };

  bool automatic_;
  bool climbed_ = false;  // the climb has started (share_ set to kClimbStart)
  double share_;
  Rule rule_;
  double win_ms_ = 0.0, win_px_ = 0.0, last_cost_ = 0.0;
  int win_n_ = 0;
  int held_ = 0;
  double direction_ = 1.0;
};

}  // namespace packer_engine
