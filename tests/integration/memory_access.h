// MemoryAccess: the in-process references' GroupAccess — parameters and one
// trainer's gradients in plain vectors (fp32, or bf16 bits with
// MemoryAccessOf<uint16_t>). Not thread-safe; the vectors outlive it.
#ifndef ZSHARD_TESTS_INTEGRATION_MEMORY_ACCESS_H_
#define ZSHARD_TESTS_INTEGRATION_MEMORY_ACCESS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "client/core/group_access.h"

namespace zshard {
namespace testing {

template <typename T>
class MemoryAccessOf : public GroupAccess {
 public:
  MemoryAccessOf(std::vector<std::vector<T>>* params,
                 std::vector<std::vector<T>>* grads)
      : params_(params), grads_(grads) {}
  absl::StatusOr<const void*> Acquire(size_t g) override {
    return static_cast<const void*>((*params_)[g].data());
  }
  absl::Status Release(size_t) override { return absl::OkStatus(); }
  absl::Status PushGradient(size_t g, const void* grad, uint32_t) override {
    const T* values = static_cast<const T*>(grad);
    std::copy(values, values + (*grads_)[g].size(), (*grads_)[g].begin());
    return absl::OkStatus();
  }

 private:
  std::vector<std::vector<T>>* params_;
  std::vector<std::vector<T>>* grads_;
};
using MemoryAccess = MemoryAccessOf<float>;
using Bf16Access = MemoryAccessOf<uint16_t>;

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_INTEGRATION_MEMORY_ACCESS_H_
