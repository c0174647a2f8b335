// Helpers over the ModelSpec message: validation, identity hash and a
// human-readable first difference. Pure functions; thread-compatible.
#ifndef ZSHARD_COMMON_MODEL_MODEL_SPEC_H_
#define ZSHARD_COMMON_MODEL_MODEL_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

// Elements of one tensor / one group (sum of its tensors).
uint64_t TensorNumel(const v1::TensorSpec& tensor);
uint64_t GroupNumel(const v1::GroupSpec& group);

// INVALID_ARGUMENT naming the offending group/tensor when the spec has no
// groups, an empty group, an unnamed or duplicate tensor, a non-positive
// dimension, an unspecified dtype, or more than 2^48 elements.
absl::Status ValidateModelSpec(const v1::ModelSpec& spec);

// 64-bit identity of the spec (FNV-1a over a canonical encoding: names,
// shapes, dtypes, trainable flags, in order). Equal specs hash equal.
uint64_t SpecHash(const v1::ModelSpec& spec);

// Empty when `a` and `b` describe the same model; otherwise one line naming
// the first differing group or tensor and how it differs.
std::string FirstSpecDifference(const v1::ModelSpec& a, const v1::ModelSpec& b);

// Stable 64-bit FNV-1a of `size` bytes, continuing from `seed`.
uint64_t Fnv1a64(const void* data, size_t size,
                 uint64_t seed = 0xcbf29ce484222325ULL);

}  // namespace zshard

#endif  // ZSHARD_COMMON_MODEL_MODEL_SPEC_H_
