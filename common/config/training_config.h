// The training configuration: the DeepSpeed ds_config.json keys zshard acts
// on, with DeepSpeed's defaults. Parsing is pure; errors name the key path.
#ifndef ZSHARD_COMMON_CONFIG_TRAINING_CONFIG_H_
#define ZSHARD_COMMON_CONFIG_TRAINING_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/wire_format.h"

namespace zshard {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// DeepSpeed's "fp16" block: dynamic loss scaling unless loss_scale != 0.
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0: dynamic
  uint32_t initial_scale_power = 16;
  uint64_t loss_scale_window = 1000;
  uint32_t hysteresis = 2;
  double min_loss_scale = 1;
};

// DeepSpeed's "scheduler" block (WarmupLR and WarmupDecayLR).
struct SchedulerConfig {
  enum class Type { kNone, kWarmupLR, kWarmupDecayLR };
  Type type = Type::kNone;
  double warmup_min_lr = 0;
  double warmup_max_lr = 0.001;
  uint64_t warmup_num_steps = 1000;
  bool warmup_linear = false;    // warmup_type: "log" (default) or "linear"
  uint64_t total_num_steps = 0;  // WarmupDecayLR only (required there)
};

// zshard's own "zshard_checkpoint" block (servers only; not part of the
// config hash, so trainers need not carry it).
struct CheckpointConfig {
  // Take a checkpoint whenever the model reaches a multiple of this many
  // steps (0: only on demand, `zshardctl checkpoint`).
  uint64_t interval_steps = 0;
  // A new full base every this many checkpoints; the others are deltas.
  uint32_t full_every = 5;
  // Complete bases (with their deltas) kept; older chains are deleted.
  uint32_t keep_bases = 2;
  // Chunk size in fp32 elements (the key is in KiB).
  uint64_t chunk_elements = 256 * 1024;
  int zstd_level = 1;
};

// zshard's own "zshard_fault_tolerance" block (servers only; not hashed).
struct FaultToleranceConfig {
  // Every this many steps each shard copies its state into memory and sends
  // the copy to its buddy shard (shard + 1 mod shards), so a replacement
  // (`zshard-server --replace=K`) can take it from there (0: off). Default
  // 4, the smallest power of two whose cost stays under a tenth of a step
  // (issue 16's rule) on the 2-core machine once the trainers compute with
  // OpenBLAS's AVX-512 kernels (zshard-train --blas_core): every 2 steps
  // cost 0.131 of the reference model's step (recovery_bench --cost_only,
  // median of 3 rounds; the servers' CPU 0.151 of it) and 0.19-0.24 of the
  // step_bench default shape's (4 shards; 0.18 at d 512 / 8 layers); with
  // the slower generic kernels it had been 0.03-0.15 at 2.
  uint64_t snapshot_interval_steps = 4;
};

// ZeRO++'s quantized transfers: zero_optimization.zero_quantized_weights
// (qwZ: shards publish each version also block-wise quantized, trainers fetch
// that and dequantize) and zero_quantized_gradients (qgZ: trainers push
// gradients block-wise quantized, shards dequantize them as they fold them
// in); the format from the zshard_quantization block.
struct QuantizationConfig {
  bool weights = false;
  bool gradients = false;
  // zshard_quantization.format: "int8" (default) or "fp8" (e4m3).
  WireFormat::Kind format = WireFormat::Kind::kInt8;
  // zshard_quantization.block_size: elements per fp32 scale, 64..4096. A
  // group's slice is quantized as one run, so a block may straddle tensors
  // of different scales (a LayerNorm's gains of 1 beside weights of 0.02):
  // with 256, int8 weights and gradients ended the tiny GPT's 200 steps
  // (d 32, tests/integration/train_e2e_test) 3.3% above the plain loss,
  // with 128 0.2% (64: -0.3%), at 0.258 of fp32's bytes.
  uint32_t block = 128;
};

struct TrainingConfig {
  // 0 = not given (derived from the other two and the trainer count).
  uint64_t train_batch_size = 0;
  uint64_t train_micro_batch_size_per_gpu = 1;
  uint32_t gradient_accumulation_steps = 1;
  // Which of the three batch keys the file gave (the others are derived).
  bool micro_batch_given = false;
  bool accumulation_given = false;
  AdamWParams adamw;
  uint32_t zero_stage = 3;
  uint64_t stage3_param_persistence_threshold = 100000;
  uint64_t stage3_prefetch_bucket_size = 50000000;
  uint64_t stage3_max_live_parameters = 1000000000;
  uint64_t stage3_max_reuse_distance = 1000000000;
  // Stage 2's gradient bucket, in elements.
  uint64_t reduce_bucket_size = 500000000;
  uint64_t steps_per_print = 10;
  bool steps_per_print_given = false;
  Fp16Config fp16;
  bool bf16_enabled = false;
  // Clip gradients to this global L2 norm (0: no clipping).
  double gradient_clipping = 0;
  SchedulerConfig scheduler;
  // zero_optimization.overlap_comm: push gradients while backward runs.
  bool overlap_comm = true;
  CheckpointConfig checkpoint;
  FaultToleranceConfig fault_tolerance;
  // activation_checkpointing present (and not "enabled": false): trainers
  // recompute each group's forward in backward instead of keeping its
  // activations. Off by default, as in DeepSpeed.
  bool activation_checkpointing = false;
  QuantizationConfig quantization;
  // zero_optimization.zero_hpz_partition_size (ZeRO++'s hpZ): trainers in
  // consecutive groups of this many ranks (rank / size) are one host's; each
  // version of a group's values crosses the network to such a host once and
  // its other trainers read it from the host's shared memory. 1: off.
  uint32_t hpz_partition_size = 1;

  // What parameters and gradients travel as on the data plane: quantized
  // when asked, else bf16 with bf16.enabled, else fp32.
  WireFormat ParameterWire() const {
    return quantization.weights ? WireFormat::Quantized(quantization.format,
                                                        quantization.block)
                                : PlainWire();
  }
  WireFormat GradientWire() const {
    return quantization.gradients
               ? WireFormat::Quantized(quantization.format, quantization.block)
               : PlainWire();
  }
  WireFormat PlainWire() const {
    return bf16_enabled ? WireFormat::Bf16() : WireFormat::Fp32();
  }

  // Whether a step needs every shard and trainer to agree before any update
  // (fp16 overflow skipping, clipping by the global norm).
  bool NeedsStepBarrier() const {
    return fp16.enabled || gradient_clipping > 0;
  }

  // Keys present in the file that zshard accepts but does not act on.
  std::vector<std::string> ignored_keys;
  // What the reader should know: "auto" values resolved (and to what), and
  // what an accepted-but-ignored key means here (NVMe offload...).
  std::vector<std::string> notes;
  // While parsing: every bad key found (ParseTrainingConfig reports them all
  // in one INVALID_ARGUMENT).
  std::vector<std::string> problems;
  // The batch keys given as "auto" (ResolveBatchSize derives them).
  bool auto_batch = false;
  // Identity of the settings that servers and trainers must share, and the
  // canonical JSON of them it is the hash of.
  uint64_t hash = 0;
  std::string canonical;
};

// The keys whose values differ between two canonical configs (the
// `canonical` of servers and trainer), as "key: servers V, this trainer W"
// joined by "; " (a key one side lacks shows "(default)").
std::string DescribeConfigDifference(const std::string& servers,
                                     const std::string& trainer);

// Parses ds_config.json text. INVALID_ARGUMENT naming the key path on a wrong
// type or value (e.g. "optimizer.params.lr: expected a number > 0, got -1").
absl::StatusOr<TrainingConfig> ParseTrainingConfig(
    const std::string& json_text);

// Reads and parses a file; NOT_FOUND naming the path when it cannot be read.
absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path);

// Defaults, as for an empty "{}".
TrainingConfig DefaultTrainingConfig();

// The learning rate of the optimizer update that follows `applied` earlier
// updates (DeepSpeed's scheduler iteration; skipped steps do not count).
double LearningRate(const TrainingConfig& config, uint64_t applied);
double LearningRate(const SchedulerConfig& schedule, double base_lr,
                    uint64_t applied);

// As DeepSpeed: derives the batch key the file left out (micro batch or
// accumulation steps from train_batch_size), then checks train_batch_size ==
// micro batch x accumulation steps x trainers; the error names the numbers.
absl::Status ResolveBatchSize(TrainingConfig* config, uint32_t trainers);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CONFIG_TRAINING_CONFIG_H_
