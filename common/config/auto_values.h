// "auto" in a ds_config (the Hugging Face Trainer's DeepSpeed configs use it
// for values it fills from TrainingArguments and the model): resolved the
// way that integration does where the value is derivable here, else to the
// default it would take, each named in a note; "auto" where nothing can
// determine it is a problem naming the key and what to give.
#ifndef ZSHARD_COMMON_CONFIG_AUTO_VALUES_H_
#define ZSHARD_COMMON_CONFIG_AUTO_VALUES_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zshard {

// Rewrites `root` in place: resolved "auto" values become numbers or
// booleans; the batch keys given as "auto" are removed (ResolveBatchSize
// derives them; *auto_batch is set). Appends to `notes` and `problems`.
void ResolveAutoValues(nlohmann::json& root, std::vector<std::string>* notes,
                       std::vector<std::string>* problems, bool* auto_batch);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CONFIG_AUTO_VALUES_H_
