// CharDataset: character-level text for the reference trainer. Bytes of the
// given files, a vocabulary of the distinct bytes, and deterministic batches
// from each trainer's disjoint share of the text. Immutable after Load;
// thread-safe.
#ifndef ZSHARD_CLIENT_EXAMPLES_CHAR_DATASET_H_
#define ZSHARD_CLIENT_EXAMPLES_CHAR_DATASET_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zshard {

class CharDataset {
 public:
  // Reads every path: a file, or a directory whose regular files (not
  // symbolic links, not recursing) are read in name order. NOT_FOUND naming a
  // path that cannot be read; INVALID_ARGUMENT when there is no text.
  static absl::StatusOr<CharDataset> Load(
      const std::vector<std::string>& paths);

  int vocab_size() const { return static_cast<int>(vocab_.size()); }
  size_t size() const { return tokens_.size(); }

  // INVALID_ARGUMENT when a trainer's share cannot hold one sequence.
  absl::Status CheckShares(uint32_t world, int context) const;

  // Fills `batch` x `context` token ids into `inputs` and the next-token ids
  // into `targets`. Sequences start at positions drawn from (seed, step,
  // micro_step, rank) inside rank's share [rank*N/world, (rank+1)*N/world).
  void Batch(uint64_t seed, uint64_t step, uint32_t micro_step, uint32_t rank,
             uint32_t world, int batch, int context, int64_t* inputs,
             int64_t* targets) const;

 private:
  std::vector<uint8_t> tokens_;  // ids into vocab_
  std::vector<uint8_t> vocab_;   // distinct bytes, sorted
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_EXAMPLES_CHAR_DATASET_H_
