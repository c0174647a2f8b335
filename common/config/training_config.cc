#include "common/config/training_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/config/auto_values.h"
#include "common/config/key_suggestions.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

using json = nlohmann::json;

// In a section parser's loop over its keys: assigns, or records the problem
// in config.problems and goes on with the next key, so that every bad key is
// reported at once.
#define ZS_CONFIG_ASSIGN(config, lhs, expr) \
  ZS_CONFIG_ASSIGN_IMPL_(ZS_CONCAT_(cfg_, __LINE__), config, lhs, expr)
#define ZS_CONFIG_ASSIGN_IMPL_(tmp, config, lhs, expr)                \
  auto tmp = (expr);                                                  \
  if (!tmp.ok()) {                                                    \
    (config).problems.push_back(std::string(tmp.status().message())); \
    continue;                                                         \
  }                                                                   \
  lhs = std::move(*tmp)

// A section parser's error (one that stops the section) joins the others.
void Collect(const absl::Status& st, TrainingConfig& c) {
  if (!st.ok()) c.problems.push_back(std::string(st.message()));
}

absl::Status KeyError(const std::string& path, const std::string& expected,
                      const json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": expected ", expected, ", got ", got.dump()));
}

absl::StatusOr<double> GetNumber(const json& v, const std::string& path,
                                 double lo, double hi, bool lo_open) {
  const std::string range =
      absl::StrCat("a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]");
  if (!v.is_number()) return KeyError(path, range, v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || (lo_open && d == lo) || d > hi) {
    return KeyError(path, range, v);
  }
  return d;
}

// Integers may be written as 5e8 (as DeepSpeed accepts).
absl::StatusOr<uint64_t> GetCount(const json& v, const std::string& path,
                                  uint64_t lo, uint64_t hi) {
  const std::string range = absl::StrCat("an integer in ", lo, "..", hi);
  if (!v.is_number()) return KeyError(path, range, v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) ||
      d > static_cast<double>(hi)) {
    return KeyError(path, range, v);
  }
  return v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(d);
}

absl::Status ParseOptimizer(const json& opt, TrainingConfig& c,
                            json& canonical) {
  if (!opt.is_object()) return KeyError("optimizer", "an object", opt);
  for (auto it = opt.begin(); it != opt.end(); ++it) {
    if (it.key() == "type") {
      if (!it->is_string() || (it->get<std::string>() != "AdamW" &&
                               it->get<std::string>() != "Adam")) {
        c.problems.push_back(
            std::string(KeyError("optimizer.type", "\"AdamW\" or \"Adam\"", *it)
                            .message()));
        continue;
      }
    } else if (it.key() == "params") {
      if (!it->is_object()) {
        c.problems.push_back(std::string(
            KeyError("optimizer.params", "an object", *it).message()));
        continue;
      }
      for (auto p = it->begin(); p != it->end(); ++p) {
        const std::string path = "optimizer.params." + p.key();
        if (p.key() == "lr") {
          ZS_CONFIG_ASSIGN(c, c.adamw.lr, GetNumber(*p, path, 0, 1e3, true));
        } else if (p.key() == "weight_decay") {
          ZS_CONFIG_ASSIGN(c, c.adamw.weight_decay,
                           GetNumber(*p, path, 0, 1e3, false));
        } else if (p.key() == "eps") {
          ZS_CONFIG_ASSIGN(c, c.adamw.eps, GetNumber(*p, path, 0, 1, true));
        } else if (p.key() == "betas") {
          if (!p->is_array() || p->size() != 2) {
            c.problems.push_back(std::string(
                KeyError(path, "an array of two numbers", *p).message()));
            continue;
          }
          ZS_CONFIG_ASSIGN(c, c.adamw.beta1,
                           GetNumber((*p)[0], path + "[0]", 0, 1, false));
          ZS_CONFIG_ASSIGN(c, c.adamw.beta2,
                           GetNumber((*p)[1], path + "[1]", 0, 1, false));
          if (c.adamw.beta1 >= 1 || c.adamw.beta2 >= 1) {
            c.problems.push_back(
                std::string(KeyError(path, "betas below 1", *p).message()));
            continue;
          }
        } else {
          c.ignored_keys.push_back(path);
          continue;
        }
        canonical["optimizer"][p.key()] = *p;
      }
    } else {
      c.ignored_keys.push_back("optimizer." + it.key());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> GetBool(const json& v, const std::string& path) {
  if (!v.is_boolean()) return KeyError(path, "true or false", v);
  return v.get<bool>();
}

absl::Status ParseFp16(const json& block, TrainingConfig& c, json& canonical) {
  if (!block.is_object()) return KeyError("fp16", "an object", block);
  for (auto it = block.begin(); it != block.end(); ++it) {
    const std::string path = "fp16." + it.key();
    auto& f = c.fp16;
    if (it.key() == "enabled") {
      ZS_CONFIG_ASSIGN(c, f.enabled, GetBool(*it, path));
    } else if (it.key() == "loss_scale") {
      ZS_CONFIG_ASSIGN(c, f.loss_scale, GetNumber(*it, path, 0, 1e30, false));
    } else if (it.key() == "initial_scale_power") {
      ZS_CONFIG_ASSIGN(c, uint64_t p, GetCount(*it, path, 0, 100));
      f.initial_scale_power = static_cast<uint32_t>(p);
    } else if (it.key() == "loss_scale_window") {
      ZS_CONFIG_ASSIGN(c, f.loss_scale_window,
                       GetCount(*it, path, 1, UINT64_C(1) << 40));
    } else if (it.key() == "hysteresis") {
      ZS_CONFIG_ASSIGN(c, uint64_t h, GetCount(*it, path, 1, 1 << 20));
      f.hysteresis = static_cast<uint32_t>(h);
    } else if (it.key() == "min_loss_scale") {
      ZS_CONFIG_ASSIGN(c, f.min_loss_scale,
                       GetNumber(*it, path, 0, 1e30, true));
    } else {
      c.ignored_keys.push_back(path);
      continue;
    }
    canonical["fp16"][it.key()] = *it;
  }
  return absl::OkStatus();
}

absl::Status ParseBf16(const json& block, TrainingConfig& c, json& canonical) {
  if (!block.is_object()) return KeyError("bf16", "an object", block);
  for (auto it = block.begin(); it != block.end(); ++it) {
    if (it.key() != "enabled") {
      c.ignored_keys.push_back("bf16." + it.key());
      continue;
    }
    ZS_CONFIG_ASSIGN(c, c.bf16_enabled, GetBool(*it, "bf16.enabled"));
    canonical["bf16"]["enabled"] = *it;
  }
  return absl::OkStatus();
}

// activation_checkpointing: the section asks for recompute (DeepSpeed turns
// it on from the model; our runners have no model-side call). "enabled" is
// zshard's own switch; DeepSpeed's other keys are accepted and ignored.
// Trainer-side only: not in the hash.
absl::Status ParseActivationCheckpointing(const json& block,
                                          TrainingConfig& c) {
  if (!block.is_object()) {
    return KeyError("activation_checkpointing", "an object", block);
  }
  c.activation_checkpointing = true;
  for (auto it = block.begin(); it != block.end(); ++it) {
    if (it.key() != "enabled") {
      c.ignored_keys.push_back("activation_checkpointing." + it.key());
      continue;
    }
    ZS_CONFIG_ASSIGN(c, c.activation_checkpointing,
                     GetBool(*it, "activation_checkpointing.enabled"));
  }
  return absl::OkStatus();
}

absl::Status ParseQuantization(const json& block, TrainingConfig& c,
                               json& canonical) {
  if (!block.is_object())
    return KeyError("zshard_quantization", "an object", block);
  QuantizationConfig& q = c.quantization;
  for (auto it = block.begin(); it != block.end(); ++it) {
    const std::string path = "zshard_quantization." + it.key();
    if (it.key() == "format") {
      if (*it == "int8") {
        q.format = WireFormat::Kind::kInt8;
      } else if (*it == "fp8") {
        q.format = WireFormat::Kind::kFp8;
      } else {
        c.problems.push_back(std::string(
            KeyError(path, "\"int8\" or \"fp8\"", *it).message()));
        continue;
      }
    } else if (it.key() == "block_size") {
      ZS_CONFIG_ASSIGN(c, uint64_t b, GetCount(*it, path, 64, 4096));
      q.block = static_cast<uint32_t>(b);
    } else {
      c.problems.push_back(
          absl::StrCat(path, ": unknown key (format, block_size)"));
      continue;
    }
    canonical["zshard_quantization"][it.key()] = *it;
  }
  return absl::OkStatus();
}

absl::Status ParseCheckpoint(const json& block, TrainingConfig& c) {
  if (!block.is_object())
    return KeyError("zshard_checkpoint", "an object", block);
  CheckpointConfig& k = c.checkpoint;
  for (auto it = block.begin(); it != block.end(); ++it) {
    const std::string path = "zshard_checkpoint." + it.key();
    if (it.key() == "interval_steps") {
      ZS_CONFIG_ASSIGN(c, k.interval_steps,
                       GetCount(*it, path, 0, UINT64_C(1) << 40));
    } else if (it.key() == "full_every") {
      ZS_CONFIG_ASSIGN(c, uint64_t v, GetCount(*it, path, 1, 1000000));
      k.full_every = static_cast<uint32_t>(v);
    } else if (it.key() == "keep_bases") {
      ZS_CONFIG_ASSIGN(c, uint64_t v, GetCount(*it, path, 1, 1000000));
      k.keep_bases = static_cast<uint32_t>(v);
    } else if (it.key() == "chunk_kib") {
      ZS_CONFIG_ASSIGN(c, uint64_t v, GetCount(*it, path, 4, 1 << 20));
      k.chunk_elements = v * 1024 / sizeof(float);
    } else if (it.key() == "zstd_level") {
      ZS_CONFIG_ASSIGN(c, uint64_t v, GetCount(*it, path, 1, 19));
      k.zstd_level = static_cast<int>(v);
    } else {
      c.problems.push_back(absl::StrCat(
          path,
          ": unknown key (interval_steps, full_every, keep_bases, chunk_kib, "
          "zstd_level)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseFaultTolerance(const json& block, TrainingConfig& c) {
  if (!block.is_object())
    return KeyError("zshard_fault_tolerance", "an object", block);
  for (auto it = block.begin(); it != block.end(); ++it) {
    const std::string path = "zshard_fault_tolerance." + it.key();
    if (it.key() == "snapshot_interval_steps") {
      ZS_CONFIG_ASSIGN(c, c.fault_tolerance.snapshot_interval_steps,
                       GetCount(*it, path, 0, UINT64_C(1) << 40));
    } else {
      c.problems.push_back(
          absl::StrCat(path, ": unknown key (snapshot_interval_steps)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseScheduler(const json& block, TrainingConfig& c,
                            json& canonical) {
  if (!block.is_object()) return KeyError("scheduler", "an object", block);
  auto& sc = c.scheduler;
  auto type = block.find("type");
  if (type == block.end()) {
    return absl::InvalidArgumentError("scheduler.type: missing");
  }
  if (*type == "WarmupLR") {
    sc.type = SchedulerConfig::Type::kWarmupLR;
  } else if (*type == "WarmupDecayLR") {
    sc.type = SchedulerConfig::Type::kWarmupDecayLR;
  } else {
    return KeyError("scheduler.type", "\"WarmupLR\" or \"WarmupDecayLR\"",
                    *type);
  }
  canonical["scheduler"]["type"] = *type;
  bool have_total = false;
  for (auto it = block.begin(); it != block.end(); ++it) {
    if (it.key() == "type") continue;
    if (it.key() != "params") {
      c.ignored_keys.push_back("scheduler." + it.key());
      continue;
    }
    if (!it->is_object()) return KeyError("scheduler.params", "an object", *it);
    for (auto p = it->begin(); p != it->end(); ++p) {
      const std::string path = "scheduler.params." + p.key();
      if (p.key() == "warmup_min_lr") {
        ZS_CONFIG_ASSIGN(c, sc.warmup_min_lr,
                         GetNumber(*p, path, 0, 1e3, false));
      } else if (p.key() == "warmup_max_lr") {
        ZS_CONFIG_ASSIGN(c, sc.warmup_max_lr,
                         GetNumber(*p, path, 0, 1e3, false));
      } else if (p.key() == "warmup_num_steps") {
        ZS_CONFIG_ASSIGN(c, sc.warmup_num_steps,
                         GetCount(*p, path, 0, UINT64_C(1) << 40));
      } else if (p.key() == "warmup_type") {
        if (*p != "log" && *p != "linear") {
          c.problems.push_back(std::string(
              KeyError(path, "\"log\" or \"linear\"", *p).message()));
          continue;
        }
        sc.warmup_linear = *p == "linear";
      } else if (p.key() == "total_num_steps" &&
                 sc.type == SchedulerConfig::Type::kWarmupDecayLR) {
        ZS_CONFIG_ASSIGN(c, sc.total_num_steps,
                         GetCount(*p, path, 1, UINT64_C(1) << 40));
        have_total = true;
      } else {
        c.ignored_keys.push_back(path);
        continue;
      }
      canonical["scheduler"][p.key()] = *p;
    }
  }
  if (sc.type == SchedulerConfig::Type::kWarmupDecayLR && !have_total) {
    return absl::InvalidArgumentError(
        "scheduler.params.total_num_steps: required by WarmupDecayLR");
  }
  return absl::OkStatus();
}

// What DeepSpeed's offload settings mean here.
std::string OffloadNote(const std::string& path, const json& block) {
  const json* device = block.is_object() && block.contains("device")
                           ? &block["device"]
                           : nullptr;
  const std::string d =
      device && device->is_string() ? device->get<std::string>() : "none";
  const bool optimizer = path.find("offload_optimizer") != std::string::npos;
  const std::string what =
      optimizer ? "the optimizer state (fp32 master weights, AdamW moments)"
                : "the parameters";
  if (d == "nvme") {
    std::string nvme = "(none given)";
    if (block.contains("nvme_path") && block["nvme_path"].is_string()) {
      nvme = "'" + block["nvme_path"].get<std::string>() + "'";
    }
    return absl::StrCat(path, ".device nvme: zshard keeps ", what,
                        " in the shard servers' memory and does not spill to "
                        "NVMe; nvme_path ",
                        nvme,
                        " is not used (add shard servers or memory instead)");
  }
  if (d == "cpu") {
    return absl::StrCat(
        path, ".device cpu: ", what,
        optimizer ? " already live" : " already live",
        " in the shard servers' CPU memory; nothing to offload");
  }
  return absl::StrCat(path, ": accepted and ignored (device ", d, ")");
}

absl::Status ParseZero(const json& zero, TrainingConfig& c, json& canonical) {
  if (!zero.is_object())
    return KeyError("zero_optimization", "an object", zero);
  for (auto it = zero.begin(); it != zero.end(); ++it) {
    const std::string path = "zero_optimization." + it.key();
    if (it.key() == "stage") {
      ZS_CONFIG_ASSIGN(c, uint64_t stage, GetCount(*it, path, 0, 3));
      c.zero_stage = static_cast<uint32_t>(stage);
    } else if (it.key() == "stage3_param_persistence_threshold") {
      ZS_CONFIG_ASSIGN(c, c.stage3_param_persistence_threshold,
                       GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "stage3_prefetch_bucket_size") {
      ZS_CONFIG_ASSIGN(c, c.stage3_prefetch_bucket_size,
                       GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "reduce_bucket_size") {
      // 0 (valid in DeepSpeed): no bucket, each group's gradient goes as
      // soon as it is ready.
      ZS_CONFIG_ASSIGN(c, c.reduce_bucket_size,
                       GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "overlap_comm") {
      ZS_CONFIG_ASSIGN(c, c.overlap_comm, GetBool(*it, path));
    } else if (it.key() == "stage3_max_reuse_distance") {
      ZS_CONFIG_ASSIGN(c, c.stage3_max_reuse_distance,
                       GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "stage3_max_live_parameters") {
      ZS_CONFIG_ASSIGN(c, c.stage3_max_live_parameters,
                       GetCount(*it, path, 1, UINT64_C(1) << 50));
    } else if (it.key() == "zero_quantized_weights") {
      ZS_CONFIG_ASSIGN(c, c.quantization.weights, GetBool(*it, path));
    } else if (it.key() == "zero_quantized_gradients") {
      ZS_CONFIG_ASSIGN(c, c.quantization.gradients, GetBool(*it, path));
    } else if (it.key() == "zero_hpz_partition_size") {
      ZS_CONFIG_ASSIGN(c, uint64_t size, GetCount(*it, path, 1, 1024));
      c.hpz_partition_size = static_cast<uint32_t>(size);
    } else if (it.key() == "offload_optimizer" || it.key() == "offload_param") {
      c.notes.push_back(OffloadNote(path, *it));  // says it is ignored
      continue;
    } else {
      c.ignored_keys.push_back(path);
      continue;
    }
    canonical["zero_optimization"][it.key()] = *it;
  }
  return absl::OkStatus();
}

}  // namespace

TrainingConfig DefaultTrainingConfig() {
  auto c = ParseTrainingConfig("{}");
  return *c;
}

absl::StatusOr<TrainingConfig> ParseTrainingConfig(const std::string& text) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError("config is not valid JSON");
  }
  if (!root.is_object()) return KeyError("(top level)", "an object", root);
  TrainingConfig c;
  ResolveAutoValues(root, &c.notes, &c.problems, &c.auto_batch);
  json canonical = json::object();
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == "train_batch_size") {
      ZS_CONFIG_ASSIGN(c, c.train_batch_size,
                       GetCount(*it, key, 1, UINT64_C(1) << 40));
    } else if (key == "train_micro_batch_size_per_gpu") {
      ZS_CONFIG_ASSIGN(c, c.train_micro_batch_size_per_gpu,
                       GetCount(*it, key, 1, UINT64_C(1) << 30));
      c.micro_batch_given = true;
    } else if (key == "gradient_accumulation_steps") {
      ZS_CONFIG_ASSIGN(c, uint64_t a, GetCount(*it, key, 1, 1 << 16));
      c.gradient_accumulation_steps = static_cast<uint32_t>(a);
      c.accumulation_given = true;
    } else if (key == "steps_per_print") {
      ZS_CONFIG_ASSIGN(c, c.steps_per_print,
                       GetCount(*it, key, 1, UINT64_C(1) << 40));
      c.steps_per_print_given = true;
    } else if (key == "optimizer") {
      Collect(ParseOptimizer(*it, c, canonical), c);
      continue;
    } else if (key == "zero_optimization") {
      Collect(ParseZero(*it, c, canonical), c);
      continue;
    } else if (key == "fp16") {
      Collect(ParseFp16(*it, c, canonical), c);
      continue;
    } else if (key == "bf16") {
      Collect(ParseBf16(*it, c, canonical), c);
      continue;
    } else if (key == "scheduler") {
      Collect(ParseScheduler(*it, c, canonical), c);
      continue;
    } else if (key == "activation_checkpointing") {
      Collect(ParseActivationCheckpointing(*it, c), c);
      continue;  // trainers only: not in the hash
    } else if (key == "zshard_quantization") {
      Collect(ParseQuantization(*it, c, canonical), c);
      continue;  // in the hash through `canonical`
    } else if (key == "zshard_checkpoint") {
      Collect(ParseCheckpoint(*it, c), c);
      continue;  // servers only: not in the hash
    } else if (key == "zshard_fault_tolerance") {
      Collect(ParseFaultTolerance(*it, c), c);
      continue;  // servers only: not in the hash
    } else if (key == "gradient_clipping") {
      ZS_CONFIG_ASSIGN(c, c.gradient_clipping,
                       GetNumber(*it, key, 0, 1e30, false));
    } else {
      c.ignored_keys.push_back(key);
      continue;
    }
    canonical[key] = *it;
  }
  SortUnknownKeys(&c);
  {
    // One problem per key: the first said (an unresolvable "auto" is also
    // a wrong type to the section parser).
    std::vector<std::string> unique;
    std::set<std::string> keys;
    for (std::string& p : c.problems) {
      if (keys.insert(p.substr(0, p.find(':'))).second) {
        unique.push_back(std::move(p));
      }
    }
    c.problems = std::move(unique);
  }
  if (!c.problems.empty()) {
    return absl::InvalidArgumentError(
        c.problems.size() == 1
            ? c.problems[0]
            : absl::StrCat(c.problems.size(),
                           " problems: ", absl::StrJoin(c.problems, "; ")));
  }
  if (c.bf16_enabled && c.fp16.enabled) {
    return absl::InvalidArgumentError(
        "bf16.enabled: fp16 and bf16 cannot both be enabled");
  }
  if (c.bf16_enabled && c.zero_stage == 0) {
    return absl::UnimplementedError(
        "bf16.enabled: bf16 with stage 0 (trainers run AdamW) is not "
        "implemented; use stage 1, 2 or 3");
  }
  if (c.zero_stage == 0 &&
      (c.quantization.weights || c.quantization.gradients)) {
    return absl::UnimplementedError(absl::StrCat(
        "zero_optimization.",
        c.quantization.weights ? "zero_quantized_weights"
                               : "zero_quantized_gradients",
        ": quantized transfers with stage 0 (trainers run AdamW) are not "
        "implemented; use stage 1, 2 or 3"));
  }
  if (c.zero_stage == 0 && c.hpz_partition_size > 1) {
    return absl::UnimplementedError(
        "zero_optimization.zero_hpz_partition_size: a per-host parameter "
        "cache with stage 0 (trainers hold the parameters) is not "
        "implemented; use stage 1, 2 or 3");
  }
  if (c.quantization.gradients && c.fp16.enabled) {
    return absl::UnimplementedError(
        "zero_optimization.zero_quantized_gradients: quantized gradients with "
        "fp16 (loss scaling, overflow skipping) are not implemented; use bf16 "
        "or fp32");
  }
  if (c.zero_stage == 0 && c.NeedsStepBarrier()) {
    return absl::UnimplementedError(
        "zero_optimization.stage: stage 0 (trainers run AdamW) with fp16 or "
        "gradient_clipping is not implemented; use stage 1, 2 or 3");
  }
  c.canonical = canonical.dump();
  c.hash = Fnv1a64(c.canonical.data(), c.canonical.size());
  return c;
}

absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read config file " + path);
  std::stringstream buf;
  buf << in.rdbuf();
  auto c = ParseTrainingConfig(buf.str());
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

namespace {

void Flatten(const json& v, const std::string& prefix,
             std::map<std::string, std::string>* out) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      Flatten(*it, prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
  } else {
    (*out)[prefix] = v.dump();
  }
}

}  // namespace

std::string DescribeConfigDifference(const std::string& servers,
                                     const std::string& trainer) {
  std::map<std::string, std::string> a, b;
  Flatten(json::parse(servers, nullptr, false), "", &a);
  Flatten(json::parse(trainer, nullptr, false), "", &b);
  std::vector<std::string> diffs;
  std::set<std::string> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  for (const std::string& k : keys) {
    auto x = a.find(k), y = b.find(k);
    const std::string sv = x == a.end() ? "(default)" : x->second;
    const std::string tv = y == b.end() ? "(default)" : y->second;
    if (sv != tv) {
      diffs.push_back(absl::StrCat(k, ": servers ", sv, ", this trainer ", tv));
    }
  }
  return absl::StrJoin(diffs, "; ");
}

double LearningRate(const TrainingConfig& c, uint64_t applied) {
  return LearningRate(c.scheduler, c.adamw.lr, applied);
}

double LearningRate(const SchedulerConfig& s, double base_lr,
                    uint64_t applied) {
  if (s.type == SchedulerConfig::Type::kNone) return base_lr;
  // DeepSpeed's WarmupLR / WarmupDecayLR with last_batch_iteration = applied.
  const double it = static_cast<double>(applied);
  const double warmup =
      static_cast<double>(std::max<uint64_t>(2, s.warmup_num_steps));
  double gamma = 1.0;
  if (it < warmup) {
    gamma = s.warmup_linear ? it / warmup : std::log(it + 1) / std::log(warmup);
  } else if (s.type == SchedulerConfig::Type::kWarmupDecayLR) {
    const double total = static_cast<double>(s.total_num_steps);
    gamma = std::max(0.0, (total - it) / std::max(1.0, total - warmup));
  }
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

absl::Status ResolveBatchSize(TrainingConfig* c, uint32_t trainers) {
  if (c->train_batch_size == 0 || trainers == 0) return absl::OkStatus();
  const uint64_t tbs = c->train_batch_size;
  if (!c->micro_batch_given) {
    const uint64_t per =
        static_cast<uint64_t>(c->gradient_accumulation_steps) * trainers;
    if (tbs % per == 0) c->train_micro_batch_size_per_gpu = tbs / per;
  } else if (!c->accumulation_given) {
    const uint64_t per = c->train_micro_batch_size_per_gpu * trainers;
    if (tbs % per == 0 && tbs / per <= (1u << 16)) {
      c->gradient_accumulation_steps = static_cast<uint32_t>(tbs / per);
    }
  }
  const uint64_t product = c->train_micro_batch_size_per_gpu *
                           c->gradient_accumulation_steps * trainers;
  if (product != tbs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_batch_size ", tbs, " != train_micro_batch_size_per_gpu ",
        c->train_micro_batch_size_per_gpu, " x gradient_accumulation_steps ",
        c->gradient_accumulation_steps, " x trainers ", trainers));
  }
  return absl::OkStatus();
}

}  // namespace zshard
