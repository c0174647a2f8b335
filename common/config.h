// The training configuration: the DeepSpeed ds_config.json keys zshard acts
// on, with DeepSpeed's defaults. Parsing is pure; errors name the key path.
#ifndef ZSHARD_COMMON_CONFIG_H_
#define ZSHARD_COMMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zshard {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct TrainingConfig {
  // 0 = not given (derived from the other two and the trainer count).
  uint64_t train_batch_size = 0;
  uint64_t train_micro_batch_size_per_gpu = 1;
  uint32_t gradient_accumulation_steps = 1;
  AdamWParams adamw;
  uint32_t zero_stage = 3;
  uint64_t stage3_param_persistence_threshold = 100000;
  uint64_t stage3_prefetch_bucket_size = 50000000;
  uint64_t stage3_max_live_parameters = 1000000000;
  uint64_t steps_per_print = 10;

  // Keys present in the file that zshard accepts but does not act on.
  std::vector<std::string> ignored_keys;
  // Identity of the settings that servers and trainers must share.
  uint64_t hash = 0;
};

// Parses ds_config.json text. INVALID_ARGUMENT naming the key path on a wrong
// type or value (e.g. "optimizer.params.lr: expected a number > 0, got -1").
absl::StatusOr<TrainingConfig> ParseTrainingConfig(const std::string& json_text);

// Reads and parses a file; NOT_FOUND naming the path when it cannot be read.
absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path);

// Defaults, as for an empty "{}".
TrainingConfig DefaultTrainingConfig();

// Checks train_batch_size == micro batch x accumulation x trainers when the
// batch size was given; the error names all three numbers.
absl::Status CheckBatchSize(const TrainingConfig& config, uint32_t trainers);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CONFIG_H_
