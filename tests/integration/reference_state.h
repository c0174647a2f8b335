// ReferenceState: what the in-process references of the end-to-end tests
// train with: every group's parameters (the model's initial values), AdamW
// moments and a sum buffer, all sized like the group, and `buffers` zeroed
// gradient buffers (one per trainer rank, or per rank and micro-step).
#ifndef ZSHARD_TESTS_INTEGRATION_REFERENCE_STATE_H_
#define ZSHARD_TESTS_INTEGRATION_REFERENCE_STATE_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "client/examples/gpt_model.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace testing {

struct ReferenceState {
  std::vector<std::vector<float>> params, m, v, sum;
  std::vector<std::vector<std::vector<float>>> grads;  // [buffer][group]
};

inline absl::StatusOr<ReferenceState> InitialReferenceState(
    const GptModel& model, size_t buffers) {
  const v1::ModelSpec& spec = model.spec();
  const size_t groups = static_cast<size_t>(spec.groups_size());
  ReferenceState s;
  s.params.resize(groups);
  s.m.resize(groups);
  s.v.resize(groups);
  s.sum.resize(groups);
  s.grads.resize(buffers);
  for (size_t g = 0; g < groups; ++g) {
    const size_t n = GroupNumel(spec.groups(static_cast<int>(g)));
    s.params[g].resize(n);
    ZS_RETURN_IF_ERROR(model.Init(g, s.params[g].data()));
    s.m[g].assign(n, 0);
    s.v[g].assign(n, 0);
    s.sum[g].assign(n, 0);
    for (auto& gr : s.grads) gr.emplace_back(n, 0.0f);
  }
  return s;
}

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_INTEGRATION_REFERENCE_STATE_H_
