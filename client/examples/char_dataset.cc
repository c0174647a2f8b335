#include "client/examples/char_dataset.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

absl::Status AppendFile(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  out->insert(out->end(), std::istreambuf_iterator<char>(in),
              std::istreambuf_iterator<char>());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CharDataset> CharDataset::Load(
    const std::vector<std::string>& paths) {
  std::vector<uint8_t> bytes;
  for (const std::string& path : paths) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError("no such file or directory: " + path);
    }
    if (!S_ISDIR(st.st_mode)) {
      absl::Status s = AppendFile(path, &bytes);
      if (!s.ok()) return s;
      continue;
    }
    DIR* dir = opendir(path.c_str());
    if (!dir) return absl::NotFoundError("cannot list " + path);
    std::vector<std::string> names;
    while (dirent* e = readdir(dir)) {
      const std::string full = path + "/" + e->d_name;
      struct stat lst;
      if (lstat(full.c_str(), &lst) == 0 && S_ISREG(lst.st_mode)) {
        names.push_back(full);
      }
    }
    closedir(dir);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      absl::Status s = AppendFile(name, &bytes);
      if (!s.ok()) return s;
    }
  }
  if (bytes.empty()) {
    return absl::InvalidArgumentError("the training data is empty");
  }
  CharDataset d;
  std::array<bool, 256> seen{};
  for (uint8_t b : bytes) seen[b] = true;
  std::array<uint8_t, 256> id{};
  for (int b = 0; b < 256; ++b) {
    if (!seen[b]) continue;
    id[b] = static_cast<uint8_t>(d.vocab_.size());
    d.vocab_.push_back(static_cast<uint8_t>(b));
  }
  d.tokens_.reserve(bytes.size());
  for (uint8_t b : bytes) d.tokens_.push_back(id[b]);
  return d;
}

absl::Status CharDataset::CheckShares(uint32_t world, int context) const {
  if (world == 0 || size() / world < static_cast<size_t>(context) + 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training data (", size(), " characters) is too small for ", world,
        " trainers with a context of ", context));
  }
  return absl::OkStatus();
}

void CharDataset::Batch(uint64_t seed, uint64_t step, uint32_t micro_step,
                        uint32_t rank, uint32_t world, int batch, int context,
                        int64_t* inputs, int64_t* targets) const {
  const uint64_t lo = size() * rank / world;
  const uint64_t hi = size() * (rank + 1) / world;
  const uint64_t starts = hi - lo - static_cast<uint64_t>(context);
  const uint64_t key[4] = {seed, step, micro_step, rank};
  std::mt19937_64 rng(Fnv1a64(key, sizeof(key)));
  for (int b = 0; b < batch; ++b) {
    const uint64_t start = lo + rng() % starts;
    for (int t = 0; t < context; ++t) {
      inputs[b * context + t] = tokens_[start + t];
      targets[b * context + t] = tokens_[start + t + 1];
    }
  }
}

}  // namespace zshard
