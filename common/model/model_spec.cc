#include "common/model/model_spec.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zshard {
namespace {

std::string ShapeString(const v1::TensorSpec& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ","), "]");
}

uint64_t HashString(const std::string& s, uint64_t h) {
  uint64_t n = s.size();
  h = Fnv1a64(&n, sizeof(n), h);
  return Fnv1a64(s.data(), s.size(), h);
}

uint64_t HashInt(int64_t v, uint64_t h) { return Fnv1a64(&v, sizeof(v), h); }

// Sizes beyond this are refused, so element counts never overflow.
constexpr uint64_t kMaxElements = uint64_t{1} << 48;

}  // namespace

uint64_t Fnv1a64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t TensorNumel(const v1::TensorSpec& tensor) {
  uint64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d > 0 ? static_cast<uint64_t>(d) : 0;
  return n;
}

uint64_t GroupNumel(const v1::GroupSpec& group) {
  uint64_t n = 0;
  for (const auto& t : group.tensors()) n += TensorNumel(t);
  return n;
}

absl::Status ValidateModelSpec(const v1::ModelSpec& spec) {
  if (spec.groups_size() == 0) {
    return absl::InvalidArgumentError("model spec has no groups");
  }
  std::set<std::string> names;
  uint64_t total = 0;
  for (int g = 0; g < spec.groups_size(); ++g) {
    const auto& group = spec.groups(g);
    if (group.tensors_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", g, " ('", group.name(), "') has no tensors"));
    }
    for (const auto& t : group.tensors()) {
      if (t.name().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g, " has a tensor without a name"));
      }
      if (!names.insert(t.name()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name(), "' appears twice"));
      }
      uint64_t numel = 1;
      for (int64_t d : t.shape()) {
        if (d <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor '", t.name(), "' has shape ", ShapeString(t),
                           ": every dimension must be positive"));
        }
        if (static_cast<uint64_t>(d) > kMaxElements / numel) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor '", t.name(), "' has shape ", ShapeString(t),
                           ": more than 2^48 elements"));
        }
        numel *= static_cast<uint64_t>(d);
      }
      total += numel;
      if (total > kMaxElements) {
        return absl::InvalidArgumentError(
            absl::StrCat("the model has more than 2^48 elements (at tensor '",
                         t.name(), "')"));
      }
      if (t.dtype() == v1::DTYPE_UNSPECIFIED || !v1::DType_IsValid(t.dtype())) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name(), "' has no valid dtype"));
      }
      if (t.dtype() == v1::INT8_BLOCKS || t.dtype() == v1::FP8_E4M3_BLOCKS) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name(), "' has dtype ", v1::DType_Name(t.dtype()),
            ", a wire format, not a tensor's (FLOAT32, BFLOAT16 or FLOAT16)"));
      }
    }
  }
  return absl::OkStatus();
}

uint64_t SpecHash(const v1::ModelSpec& spec) {
  uint64_t h = HashString(spec.name(), 0xcbf29ce484222325ULL);
  h = HashInt(spec.groups_size(), h);
  for (const auto& group : spec.groups()) {
    h = HashString(group.name(), h);
    h = HashInt(group.tensors_size(), h);
    for (const auto& t : group.tensors()) {
      h = HashString(t.name(), h);
      h = HashInt(t.shape_size(), h);
      for (int64_t d : t.shape()) h = HashInt(d, h);
      h = HashInt(t.dtype(), h);
      h = HashInt(t.trainable() ? 1 : 0, h);
    }
  }
  return h;
}

std::string FirstSpecDifference(const v1::ModelSpec& a,
                                const v1::ModelSpec& b) {
  if (a.name() != b.name()) {
    return absl::StrCat("model name '", a.name(), "' vs '", b.name(), "'");
  }
  const int groups = std::min(a.groups_size(), b.groups_size());
  for (int g = 0; g < groups; ++g) {
    const auto& ga = a.groups(g);
    const auto& gb = b.groups(g);
    if (ga.name() != gb.name()) {
      return absl::StrCat("group ", g, " is named '", ga.name(), "' vs '",
                          gb.name(), "'");
    }
    const int tensors = std::min(ga.tensors_size(), gb.tensors_size());
    for (int i = 0; i < tensors; ++i) {
      const auto& ta = ga.tensors(i);
      const auto& tb = gb.tensors(i);
      if (ta.name() != tb.name()) {
        return absl::StrCat("group '", ga.name(), "' tensor ", i, " is '",
                            ta.name(), "' vs '", tb.name(), "'");
      }
      if (ShapeString(ta) != ShapeString(tb)) {
        return absl::StrCat("tensor '", ta.name(), "' has shape ",
                            ShapeString(ta), " vs ", ShapeString(tb));
      }
      if (ta.dtype() != tb.dtype()) {
        return absl::StrCat("tensor '", ta.name(), "' has dtype ",
                            v1::DType_Name(ta.dtype()), " vs ",
                            v1::DType_Name(tb.dtype()));
      }
      if (ta.trainable() != tb.trainable()) {
        return absl::StrCat("tensor '", ta.name(),
                            "' trainable=", ta.trainable(), " vs ",
                            tb.trainable());
      }
    }
    if (ga.tensors_size() != gb.tensors_size()) {
      const auto& longer = ga.tensors_size() > gb.tensors_size() ? ga : gb;
      return absl::StrCat("group '", ga.name(), "' has ", ga.tensors_size(),
                          " tensors vs ", gb.tensors_size(), " (first extra: '",
                          longer.tensors(tensors).name(), "')");
    }
  }
  if (a.groups_size() != b.groups_size()) {
    return absl::StrCat("model has ", a.groups_size(), " groups vs ",
                        b.groups_size());
  }
  return "";
}

}  // namespace zshard
