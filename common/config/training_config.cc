#include "common/config/training_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

using json = nlohmann::json;

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
        return KeyError("optimizer.type", "\"AdamW\" or \"Adam\"", *it);
      }
    } else if (it.key() == "params") {
      if (!it->is_object())
        return KeyError("optimizer.params", "an object", *it);
      for (auto p = it->begin(); p != it->end(); ++p) {
        const std::string path = "optimizer.params." + p.key();
        if (p.key() == "lr") {
          ZS_ASSIGN_OR_RETURN(c.adamw.lr, GetNumber(*p, path, 0, 1e3, true));
        } else if (p.key() == "weight_decay") {
          ZS_ASSIGN_OR_RETURN(c.adamw.weight_decay,
                              GetNumber(*p, path, 0, 1e3, false));
        } else if (p.key() == "eps") {
          ZS_ASSIGN_OR_RETURN(c.adamw.eps, GetNumber(*p, path, 0, 1, true));
        } else if (p.key() == "betas") {
          if (!p->is_array() || p->size() != 2) {
            return KeyError(path, "an array of two numbers", *p);
          }
          ZS_ASSIGN_OR_RETURN(c.adamw.beta1,
                              GetNumber((*p)[0], path + "[0]", 0, 1, false));
          ZS_ASSIGN_OR_RETURN(c.adamw.beta2,
                              GetNumber((*p)[1], path + "[1]", 0, 1, false));
          if (c.adamw.beta1 >= 1 || c.adamw.beta2 >= 1) {
            return KeyError(path, "betas below 1", *p);
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
      ZS_ASSIGN_OR_RETURN(f.enabled, GetBool(*it, path));
    } else if (it.key() == "loss_scale") {
      ZS_ASSIGN_OR_RETURN(f.loss_scale, GetNumber(*it, path, 0, 1e30, false));
    } else if (it.key() == "initial_scale_power") {
      ZS_ASSIGN_OR_RETURN(uint64_t p, GetCount(*it, path, 0, 100));
      f.initial_scale_power = static_cast<uint32_t>(p);
    } else if (it.key() == "loss_scale_window") {
      ZS_ASSIGN_OR_RETURN(f.loss_scale_window,
                          GetCount(*it, path, 1, UINT64_C(1) << 40));
    } else if (it.key() == "hysteresis") {
      ZS_ASSIGN_OR_RETURN(uint64_t h, GetCount(*it, path, 1, 1 << 20));
      f.hysteresis = static_cast<uint32_t>(h);
    } else if (it.key() == "min_loss_scale") {
      ZS_ASSIGN_OR_RETURN(f.min_loss_scale,
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
    ZS_ASSIGN_OR_RETURN(c.bf16_enabled, GetBool(*it, "bf16.enabled"));
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
    ZS_ASSIGN_OR_RETURN(c.activation_checkpointing,
                        GetBool(*it, "activation_checkpointing.enabled"));
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
      ZS_ASSIGN_OR_RETURN(k.interval_steps,
                          GetCount(*it, path, 0, UINT64_C(1) << 40));
    } else if (it.key() == "full_every") {
      ZS_ASSIGN_OR_RETURN(uint64_t v, GetCount(*it, path, 1, 1000000));
      k.full_every = static_cast<uint32_t>(v);
    } else if (it.key() == "keep_bases") {
      ZS_ASSIGN_OR_RETURN(uint64_t v, GetCount(*it, path, 1, 1000000));
      k.keep_bases = static_cast<uint32_t>(v);
    } else if (it.key() == "chunk_kib") {
      ZS_ASSIGN_OR_RETURN(uint64_t v, GetCount(*it, path, 4, 1 << 20));
      k.chunk_elements = v * 1024 / sizeof(float);
    } else if (it.key() == "zstd_level") {
      ZS_ASSIGN_OR_RETURN(uint64_t v, GetCount(*it, path, 1, 19));
      k.zstd_level = static_cast<int>(v);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": unknown key (interval_steps, full_every, keep_bases, chunk_kib, "
          "zstd_level)"));
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
        ZS_ASSIGN_OR_RETURN(sc.warmup_min_lr,
                            GetNumber(*p, path, 0, 1e3, false));
      } else if (p.key() == "warmup_max_lr") {
        ZS_ASSIGN_OR_RETURN(sc.warmup_max_lr,
                            GetNumber(*p, path, 0, 1e3, false));
      } else if (p.key() == "warmup_num_steps") {
        ZS_ASSIGN_OR_RETURN(sc.warmup_num_steps,
                            GetCount(*p, path, 0, UINT64_C(1) << 40));
      } else if (p.key() == "warmup_type") {
        if (*p != "log" && *p != "linear")
          return KeyError(path, "\"log\" or \"linear\"", *p);
        sc.warmup_linear = *p == "linear";
      } else if (p.key() == "total_num_steps" &&
                 sc.type == SchedulerConfig::Type::kWarmupDecayLR) {
        ZS_ASSIGN_OR_RETURN(sc.total_num_steps,
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

absl::Status ParseZero(const json& zero, TrainingConfig& c, json& canonical) {
  if (!zero.is_object())
    return KeyError("zero_optimization", "an object", zero);
  for (auto it = zero.begin(); it != zero.end(); ++it) {
    const std::string path = "zero_optimization." + it.key();
    if (it.key() == "stage") {
      ZS_ASSIGN_OR_RETURN(uint64_t stage, GetCount(*it, path, 0, 3));
      c.zero_stage = static_cast<uint32_t>(stage);
    } else if (it.key() == "stage3_param_persistence_threshold") {
      ZS_ASSIGN_OR_RETURN(c.stage3_param_persistence_threshold,
                          GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "stage3_prefetch_bucket_size") {
      ZS_ASSIGN_OR_RETURN(c.stage3_prefetch_bucket_size,
                          GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "reduce_bucket_size") {
      // 0 (valid in DeepSpeed): no bucket, each group's gradient goes as
      // soon as it is ready.
      ZS_ASSIGN_OR_RETURN(c.reduce_bucket_size,
                          GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "overlap_comm") {
      ZS_ASSIGN_OR_RETURN(c.overlap_comm, GetBool(*it, path));
    } else if (it.key() == "stage3_max_reuse_distance") {
      ZS_ASSIGN_OR_RETURN(c.stage3_max_reuse_distance,
                          GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "stage3_max_live_parameters") {
      ZS_ASSIGN_OR_RETURN(c.stage3_max_live_parameters,
                          GetCount(*it, path, 1, UINT64_C(1) << 50));
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
  json canonical = json::object();
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == "train_batch_size") {
      ZS_ASSIGN_OR_RETURN(c.train_batch_size,
                          GetCount(*it, key, 1, UINT64_C(1) << 40));
    } else if (key == "train_micro_batch_size_per_gpu") {
      ZS_ASSIGN_OR_RETURN(c.train_micro_batch_size_per_gpu,
                          GetCount(*it, key, 1, UINT64_C(1) << 30));
      c.micro_batch_given = true;
    } else if (key == "gradient_accumulation_steps") {
      ZS_ASSIGN_OR_RETURN(uint64_t a, GetCount(*it, key, 1, 1 << 16));
      c.gradient_accumulation_steps = static_cast<uint32_t>(a);
      c.accumulation_given = true;
    } else if (key == "steps_per_print") {
      ZS_ASSIGN_OR_RETURN(c.steps_per_print,
                          GetCount(*it, key, 1, UINT64_C(1) << 40));
      c.steps_per_print_given = true;
    } else if (key == "optimizer") {
      ZS_RETURN_IF_ERROR(ParseOptimizer(*it, c, canonical));
      continue;
    } else if (key == "zero_optimization") {
      ZS_RETURN_IF_ERROR(ParseZero(*it, c, canonical));
      continue;
    } else if (key == "fp16") {
      ZS_RETURN_IF_ERROR(ParseFp16(*it, c, canonical));
      continue;
    } else if (key == "bf16") {
      ZS_RETURN_IF_ERROR(ParseBf16(*it, c, canonical));
      continue;
    } else if (key == "scheduler") {
      ZS_RETURN_IF_ERROR(ParseScheduler(*it, c, canonical));
      continue;
    } else if (key == "activation_checkpointing") {
      ZS_RETURN_IF_ERROR(ParseActivationCheckpointing(*it, c));
      continue;  // trainers only: not in the hash
    } else if (key == "zshard_checkpoint") {
      ZS_RETURN_IF_ERROR(ParseCheckpoint(*it, c));
      continue;  // servers only: not in the hash
    } else if (key == "gradient_clipping") {
      ZS_ASSIGN_OR_RETURN(c.gradient_clipping,
                          GetNumber(*it, key, 0, 1e30, false));
    } else {
      c.ignored_keys.push_back(key);
      continue;
    }
    canonical[key] = *it;
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
  if (c.zero_stage == 0 && c.NeedsStepBarrier()) {
    return absl::UnimplementedError(
        "zero_optimization.stage: stage 0 (trainers run AdamW) with fp16 or "
        "gradient_clipping is not implemented; use stage 1, 2 or 3");
  }
  const std::string dump = canonical.dump();
  c.hash = Fnv1a64(dump.data(), dump.size());
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
