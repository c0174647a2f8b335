// What to make of ds_config keys zshard does not act on: a key DeepSpeed
// knows is accepted and ignored; an unknown key within a small edit
// distance of a known one is a typo, refused with a "did you mean" (a typo
// silently ignored trains with the wrong settings).
#ifndef ZSHARD_COMMON_CONFIG_KEY_SUGGESTIONS_H_
#define ZSHARD_COMMON_CONFIG_KEY_SUGGESTIONS_H_

#include <string>

#include "common/config/training_config.h"

namespace zshard {

// The known key closest to the last part of `path` ("zero_optimization.x")
// among the keys of its section, when it is an obvious typo of one (edit
// distance <= 2, or <= 3 for keys of 20 characters or more); "" otherwise,
// also for keys DeepSpeed knows.
std::string SuggestKey(const std::string& path);

// Moves the typos in c->ignored_keys to c->problems, each with its
// suggestion.
void SortUnknownKeys(TrainingConfig* c);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CONFIG_KEY_SUGGESTIONS_H_
