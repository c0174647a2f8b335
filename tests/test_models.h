// Small model specs and deterministic values shared by the unit tests.
#ifndef ZSHARD_TESTS_TEST_MODELS_H_
#define ZSHARD_TESTS_TEST_MODELS_H_

#include <string>
#include <vector>

#include "common/model/partition_map.h"
#include "server/shard_store.h"
#include "zshard/v1/model.pb.h"

namespace zshard {
namespace testing {

// Groups of the given tensor sizes (1-D fp32 tensors named t0, t1, ...).
inline v1::ModelSpec MakeSpec(const std::vector<std::vector<int64_t>>& groups) {
  v1::ModelSpec spec;
  spec.set_name("test");
  int t = 0;
  for (const auto& sizes : groups) {
    auto* g = spec.add_groups();
    g->set_name("g" + std::to_string(spec.groups_size() - 1));
    for (int64_t n : sizes) {
      auto* tensor = g->add_tensors();
      tensor->set_name("t" + std::to_string(t++));
      tensor->add_shape(n);
      tensor->set_dtype(v1::FLOAT32);
      tensor->set_trainable(true);
    }
  }
  return spec;
}

// Value of element i of group g (deterministic, distinct).
inline float InitValue(size_t g, uint64_t i) {
  return 0.01f * static_cast<float>(g + 1) + 1e-4f * static_cast<float>(i % 97);
}

// Initial values for shard `shard`'s slices.
inline std::vector<ValueChunk> ShardValues(const PartitionMap& map,
                                           uint32_t shard) {
  std::vector<ValueChunk> out;
  for (size_t g = 0; g < map.num_groups(); ++g) {
    const Slice& s = map.slice(g, shard);
    if (s.size() == 0) continue;
    ValueChunk c;
    c.group = static_cast<uint32_t>(g);
    c.offset = s.begin;
    for (uint64_t i = s.begin; i < s.end; ++i)
      c.values.push_back(InitValue(g, i));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_TEST_MODELS_H_
