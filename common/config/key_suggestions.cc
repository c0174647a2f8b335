#include "common/config/key_suggestions.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zshard {
namespace {

// Keys by section: those zshard acts on and those DeepSpeed documents.
const std::map<std::string, std::vector<std::string>>& KnownKeys() {
  static const auto* keys = new std::map<std::string, std::vector<std::string>>{
      {"",
       {"train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "steps_per_print",
        "optimizer",
        "zero_optimization",
        "fp16",
        "bf16",
        "scheduler",
        "activation_checkpointing",
        "zshard_checkpoint",
        "zshard_quantization",
        "gradient_clipping",
        "wall_clock_breakdown",
        "zero_allow_untested_optimizer",
        "prescale_gradients",
        "gradient_predivide_factor",
        "communication_data_type",
        "amp",
        "flops_profiler",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comms_logger",
        "data_types",
        "dump_state",
        "zero_force_ds_cpu_optimizer",
        "checkpoint",
        "elasticity",
        "sparse_attention",
        "pipeline",
        "aio",
        "compression_training",
        "autotuning",
        "memory_breakdown",
        "data_efficiency",
        "disable_allgather",
        "sparse_gradients",
        "curriculum_learning"}},
      {"zero_optimization",
       {"stage",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "reduce_bucket_size",
        "overlap_comm",
        "stage3_max_reuse_distance",
        "stage3_max_live_parameters",
        "contiguous_gradients",
        "reduce_scatter",
        "allgather_partitions",
        "allgather_bucket_size",
        "offload_optimizer",
        "offload_param",
        "sub_group_size",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "round_robin_gradients",
        "elastic_checkpoint",
        "zero_hpz_partition_size",
        "zero_quantized_weights",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "mics_shard_size",
        "mics_hierarchical_params_gather",
        "memory_efficient_linear",
        "ignore_unused_parameters",
        "load_from_fp32_weights",
        "cpu_offload",
        "use_multi_rank_bucket_allreduce",
        "stage3_module_granularity_threshold",
        "log_trace_cache_warnings",
        "legacy_stage1",
        "pipeline_loading_checkpoint",
        "override_module_apply"}},
      {"zshard_quantization", {"format", "block_size"}},
      {"optimizer", {"type", "params"}},
      {"optimizer.params",
       {"lr", "betas", "eps", "weight_decay", "amsgrad", "adam_w_mode",
        "torch_adam", "bias_correction", "fused"}},
      {"fp16",
       {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
        "hysteresis", "min_loss_scale", "auto_cast", "consecutive_hysteresis",
        "fp16_master_weights_and_grads"}},
      {"bf16", {"enabled", "immediate_grad_update", "check_grad_overflow"}},
      {"scheduler", {"type", "params"}},
      {"scheduler.params",
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
        "total_num_steps", "last_batch_iteration"}},
      {"activation_checkpointing",
       {"enabled", "partition_activations", "cpu_checkpointing",
        "contiguous_memory_optimization", "number_checkpoints",
        "synchronize_checkpoint_boundary", "profile"}},
  };
  return *keys;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string SuggestKey(const std::string& path) {
  const size_t dot = path.rfind('.');
  const std::string section =
      dot == std::string::npos ? "" : path.substr(0, dot);
  const std::string key =
      dot == std::string::npos ? path : path.substr(dot + 1);
  auto it = KnownKeys().find(section);
  if (it == KnownKeys().end()) return "";
  const std::vector<std::string>& known = it->second;
  if (std::find(known.begin(), known.end(), key) != known.end()) return "";
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& k : known) {
    const size_t d = EditDistance(key, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  const size_t allowed = key.size() >= 20 ? 3 : 2;
  return best_distance <= allowed && best_distance < key.size() ? best : "";
}

void SortUnknownKeys(TrainingConfig* c) {
  std::vector<std::string> kept;
  for (const std::string& path : c->ignored_keys) {
    const std::string suggestion = SuggestKey(path);
    if (suggestion.empty()) {
      kept.push_back(path);
      continue;
    }
    const size_t dot = path.rfind('.');
    const std::string prefix =
        dot == std::string::npos ? "" : path.substr(0, dot + 1);
    c->problems.push_back(absl::StrCat(path, ": unknown key; did you mean ",
                                       prefix, suggestion, "?"));
  }
  c->ignored_keys = std::move(kept);
}

}  // namespace zshard
