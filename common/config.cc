#include "common/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "common/status_macros.h"

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
      if (!it->is_object()) return KeyError("optimizer.params", "an object", *it);
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

absl::Status ParseZero(const json& zero, TrainingConfig& c, json& canonical) {
  if (!zero.is_object()) return KeyError("zero_optimization", "an object", zero);
  for (auto it = zero.begin(); it != zero.end(); ++it) {
    const std::string path = "zero_optimization." + it.key();
    if (it.key() == "stage") {
      ZS_ASSIGN_OR_RETURN(uint64_t stage, GetCount(*it, path, 0, 3));
      if (stage != 3) {
        // Stages 0-2 are trainer-side residency modes not built yet; running
        // stage 3 in their place would not be what the user asked for.
        return absl::UnimplementedError(absl::StrCat(
            path, ": only stage 3 is implemented in this version, got ", stage));
      }
      c.zero_stage = static_cast<uint32_t>(stage);
    } else if (it.key() == "stage3_param_persistence_threshold") {
      ZS_ASSIGN_OR_RETURN(c.stage3_param_persistence_threshold,
                          GetCount(*it, path, 0, UINT64_C(1) << 50));
    } else if (it.key() == "stage3_prefetch_bucket_size") {
      ZS_ASSIGN_OR_RETURN(c.stage3_prefetch_bucket_size,
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
    } else if (key == "gradient_accumulation_steps") {
      ZS_ASSIGN_OR_RETURN(uint64_t a, GetCount(*it, key, 1, 1 << 16));
      c.gradient_accumulation_steps = static_cast<uint32_t>(a);
    } else if (key == "steps_per_print") {
      ZS_ASSIGN_OR_RETURN(c.steps_per_print,
                          GetCount(*it, key, 1, UINT64_C(1) << 40));
    } else if (key == "optimizer") {
      ZS_RETURN_IF_ERROR(ParseOptimizer(*it, c, canonical));
      continue;
    } else if (key == "zero_optimization") {
      ZS_RETURN_IF_ERROR(ParseZero(*it, c, canonical));
      continue;
    } else {
      c.ignored_keys.push_back(key);
      continue;
    }
    canonical[key] = *it;
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

absl::Status CheckBatchSize(const TrainingConfig& c, uint32_t trainers) {
  if (c.train_batch_size == 0) return absl::OkStatus();
  const uint64_t product = c.train_micro_batch_size_per_gpu *
                           c.gradient_accumulation_steps * trainers;
  if (product != c.train_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_batch_size ", c.train_batch_size,
        " != train_micro_batch_size_per_gpu ",
        c.train_micro_batch_size_per_gpu, " x gradient_accumulation_steps ",
        c.gradient_accumulation_steps, " x trainers ", trainers));
  }
  return absl::OkStatus();
}

}  // namespace zshard
