// TrainerStates: the resume states trainers report with their steps (their
// data position and loss scale, opaque here), kept for the last few steps
// of each rank, so that a checkpoint or snapshot at step N can save those
// reported with step N-1. Not thread-safe: its owner locks.
#ifndef ZSHARD_SERVER_CHECKPOINT_TRAINER_STATES_H_
#define ZSHARD_SERVER_CHECKPOINT_TRAINER_STATES_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace zshard {

class TrainerStates {
 public:
  explicit TrainerStates(uint32_t ranks) : ranks_(ranks) {}

  // Keeps `state` of `rank` (ignored out of range) with `step`.
  void Record(uint32_t rank, uint64_t step, std::string state) {
    if (rank >= ranks_) return;
    auto& states = states_[rank];
    states[step] = std::move(state);
    while (states.size() > 4) states.erase(states.begin());
  }
  // What each rank reported with `step` (the ranks that did).
  std::map<uint32_t, std::string> At(uint64_t step) const {
    std::map<uint32_t, std::string> out;
    for (const auto& [rank, states] : states_) {
      auto it = states.find(step);
      if (it != states.end()) out[rank] = it->second;
    }
    return out;
  }

 private:
  const uint32_t ranks_;
  std::map<uint32_t, std::map<uint64_t, std::string>> states_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_CHECKPOINT_TRAINER_STATES_H_
