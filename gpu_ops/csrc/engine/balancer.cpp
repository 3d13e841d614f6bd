// See balancer.h.
#include "balancer.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace packer_engine {

Balancer::Balancer(double hardware_share)
    : automatic_(hardware_share < 0.0), share_(hardware_share < 0.0 ? kAutoStart : hardware_share) {
  const char* v = std::getenv("PACKER_ENGINE_BALANCE");
  const std::string b = v != nullptr ? v : "";
  rule_ = b == "equal" ? kEqual : b == "climb" ? kClimb : kBySize;
}

int64_t Balancer::layout(std::vector<Image>& images) {
  int64_t total = 0;
  for (Image& im : images) {
    if (im.status == kBadHeader) continue;
    im.offset = total;
    total += im.out_h * im.out_w * 3;
  }
  return total;
}

void Balancer::plan(std::vector<Image>& images, bool hardware) const {
  int64_t capable_px = 0;
  std::vector<int> capable;
  for (size_t i = 0; i < images.size(); ++i) {
    Image& im = images[i];
    im.to_hardware = false;
    if (im.status == kOk && im.hardware_ok) {
      capable.push_back(int(i));
      capable_px += im.height * im.width;
    }
  }
  if (!hardware || capable.empty() || share_ <= 0.0) return;
  const double budget = share_ * double(capable_px);
  double taken = 0.0;
  for (int i : capable) {
    if (taken >= budget) break;
    images[size_t(i)].to_hardware = true;
    taken += double(images[size_t(i)].height * images[size_t(i)].width);
  }
}

void Balancer::after_batch(const BatchPixels& px, double threads_ms, double hw_ms, double call_ms) {
  if (!automatic_ || px.all <= 0.0) return;
  const bool large = px.capable_n > 0 && px.capable / px.capable_n > kLaneMaxPixels;
  if (rule_ == kEqual || (rule_ == kBySize && large))
    equalize(threads_ms, px.all - px.hw, hw_ms, px.hw, px.capable);
  else
    observe(call_ms, px.all);
}

void Balancer::equalize(double threads_ms, double threads_px, double hw_ms, double hw_px, double capable_px) {
  if (capable_px <= 0.0) return;  // nothing the share decides
  double target;
  if (hw_px <= 0.0 || hw_ms <= 0.0) {
    target = share_ + kMaxStep;
  } else if (threads_px <= 0.0 || threads_ms <= 0.0) {
    target = share_ - kMaxStep;
  } else {
    const double r_hw = hw_px / hw_ms, r_threads = threads_px / threads_ms;
    // hardware pixels x with x / r_hw == (all pixels - x) / r_threads, as a share of the capable ones
    target = r_hw * (threads_px + hw_px) / (r_hw + r_threads) / capable_px;
  }
  const double step = std::max(-kMaxStep, std::min(kMaxStep, kGain * (target - share_)));
  share_ = std::min(1.0, std::max(0.0, share_ + step));
}

void Balancer::observe(double call_ms, double px) {
  if (!climbed_) {  // the first batch of the climb ran at the start share: begin from the top
    climbed_ = true;
    share_ = kClimbStart;
    return;
  }
  win_ms_ += call_ms;
  win_px_ += px;
  if (++win_n_ < kWindow) return;
  const double cost = win_ms_ / win_px_;
  win_ms_ = win_px_ = 0.0;
  win_n_ = 0;
  const double next = std::min(1.0, std::max(0.0, share_ + direction_ * kStep));
  if (next == share_) {
    // Held at a bound (the climb pushes past it): two windows there differ by noise alone, so
    // step away only every kHoldWindows windows, to see whether the other side got better.
    if (++held_ < kHoldWindows) {
      last_cost_ = cost;
      return;
    }
    held_ = 0;
    direction_ = -direction_;
  } else if (last_cost_ > 0.0 && cost > last_cost_) {
    direction_ = -direction_;
  }
  last_cost_ = cost;
  share_ = std::min(1.0, std::max(0.0, share_ + direction_ * kStep));
}

}  // namespace packer_engine
