#include "common/config/auto_values.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zshard {
namespace {

using json = nlohmann::json;

bool IsAuto(const json* v) {
  return v && v->is_string() && v->get<std::string>() == "auto";
}

// The value at `path` (objects all the way), or null.
json* At(json& root, std::initializer_list<const char*> path) {
  json* v = &root;
  for (const char* key : path) {
    if (!v->is_object()) return nullptr;
    auto it = v->find(key);
    if (it == v->end()) return nullptr;
    v = &*it;
  }
  return v;
}

struct Default {
  std::initializer_list<const char*> path;
  json value;
  const char* why;
};

}  // namespace

void ResolveAutoValues(json& root, std::vector<std::string>* notes,
                       std::vector<std::string>* problems, bool* auto_batch) {
  if (!root.is_object()) return;
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu",
                          "gradient_accumulation_steps"}) {
    if (!IsAuto(At(root, {key}))) continue;
    root.erase(key);
    *auto_batch = true;
    notes->push_back(absl::StrCat(
        key,
        " \"auto\": derived from the other batch keys and the number of "
        "trainers (train_batch_size = micro batch x accumulation x trainers; "
        "1 where nothing determines it)"));
  }
  json* lr = At(root, {"optimizer", "params", "lr"});
  json* max_lr = At(root, {"scheduler", "params", "warmup_max_lr"});
  if (IsAuto(lr)) {
    if (max_lr && max_lr->is_number()) {
      *lr = *max_lr;
      notes->push_back(
          absl::StrCat("optimizer.params.lr \"auto\": ", lr->dump(),
                       " (scheduler.params.warmup_max_lr)"));
    } else {
      problems->push_back(
          "optimizer.params.lr: \"auto\" cannot be derived here (the Hugging "
          "Face Trainer fills it from TrainingArguments.learning_rate); give "
          "a number");
    }
  }
  if (IsAuto(max_lr)) {
    if (lr && lr->is_number()) {
      *max_lr = *lr;
      notes->push_back(absl::StrCat("scheduler.params.warmup_max_lr \"auto\": ",
                                    max_lr->dump(), " (optimizer.params.lr)"));
    } else {
      problems->push_back(
          "scheduler.params.warmup_max_lr: \"auto\" needs a number in "
          "optimizer.params.lr to take");
    }
  }
  if (IsAuto(At(root, {"scheduler", "params", "total_num_steps"}))) {
    problems->push_back(
        "scheduler.params.total_num_steps: \"auto\" cannot be derived here "
        "(the Hugging Face Trainer fills it from max_steps); give the run's "
        "number of steps");
  }
  const Default defaults[] = {
      {{"optimizer", "params", "betas"},
       json::array({0.9, 0.999}),
       "TrainingArguments' adam_beta1, adam_beta2 defaults"},
      {{"optimizer", "params", "eps"}, 1e-8, "TrainingArguments' adam_epsilon"},
      {{"optimizer", "params", "weight_decay"},
       0.0,
       "TrainingArguments' weight_decay"},
      {{"scheduler", "params", "warmup_min_lr"}, 0.0, "the Trainer's value"},
      {{"scheduler", "params", "warmup_num_steps"},
       0,
       "TrainingArguments' warmup_steps"},
      {{"gradient_clipping"}, 1.0, "TrainingArguments' max_grad_norm"},
      {{"fp16", "enabled"}, false, "TrainingArguments' fp16"},
      {{"bf16", "enabled"}, false, "TrainingArguments' bf16"},
      {{"zero_optimization", "reduce_bucket_size"},
       500000000,
       "DeepSpeed's default; the Trainer takes hidden_size^2, which the "
       "servers do not know"},
      {{"zero_optimization", "stage3_prefetch_bucket_size"},
       50000000,
       "DeepSpeed's default; the Trainer takes 0.9 x hidden_size^2"},
      {{"zero_optimization", "stage3_param_persistence_threshold"},
       100000,
       "DeepSpeed's default; the Trainer takes 10 x hidden_size"},
  };
  for (const Default& d : defaults) {
    json* v = At(root, d.path);
    if (!IsAuto(v)) continue;
    *v = d.value;
    notes->push_back(absl::StrCat(absl::StrJoin(d.path, "."), " \"auto\": ",
                                  d.value.dump(), " (", d.why, ")"));
  }
}

}  // namespace zshard
