// The tiny training run several integration tests start: its config and a
// zshard-train command line for it (a 4-layer GPT of d 32 on the licenses
// text, fixed seed, one thread, no per-step log, the final parameters
// dumped for bit comparisons).
#ifndef ZSHARD_TESTS_INTEGRATION_TINY_RUN_H_
#define ZSHARD_TESTS_INTEGRATION_TINY_RUN_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zshard {
namespace testing {

// ds_config of the tiny run: ZeRO-3, batch 8 of micro-batches of 4.
inline std::string TinyRunConfig() {
  return R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 5000,
                          "stage3_prefetch_bucket_size": 15000}})";
}

// zshard-train (`binary`) as rank `rank` of the tiny run for `steps` steps;
// rank 0 dumps the final parameters to `params_path`.
inline std::vector<std::string> TinyTrainerArgv(
    const std::string& binary, const std::string& coordinator,
    const std::string& config_path, int rank, int steps,
    const std::string& params_path) {
  return {binary,
          "--coordinator=" + coordinator,
          absl::StrCat("--rank=", rank),
          "--config=" + config_path,
          absl::StrCat("--steps=", steps),
          "--data=/usr/share/common-licenses",
          "--threads=1",
          "--log_every=0",
          "--context=16",
          "--d_model=32",
          "--layers=4",
          "--heads=2",
          "--seed=1",
          "--dump_params=" + params_path};
}

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_INTEGRATION_TINY_RUN_H_
