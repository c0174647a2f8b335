#include "server/publisher.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace zshard {
namespace {

// How often a blocked wait re-checks its caller's cancellation (the wait
// itself ends the moment its condition holds).
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

Publisher::Publisher(const PublisherOptions& options)
    : options_(options), leases_(options.lease_timeout) {}

absl::StatusOr<std::unique_ptr<Publisher>> Publisher::Create(
    const PublisherOptions& options, const std::vector<uint64_t>& elements) {
  std::unique_ptr<Publisher> p(new Publisher(options));
  absl::MutexLock lock(&p->mu_);
  p->groups_.resize(elements.size());
  for (size_t g = 0; g < elements.size(); ++g) {
    Slots& s = p->groups_[g];
    s.elements = elements[g];
    if (s.elements == 0) continue;
    const size_t bytes = s.elements * p->element_size();
    const size_t qbytes =
        options.quantized.quantized() ? options.quantized.Bytes(s.elements) : 0;
    for (int k = 0; k < 2; ++k) {
      if (options.transport) {
        // Memory the transport serves fastest (UCX: shared-memory peers copy
        // from it directly).
        ZS_ASSIGN_OR_RETURN(s.region[k], options.transport->Allocate(bytes));
        s.data[k] = s.region[k]->data();
        if (qbytes > 0) {
          ZS_ASSIGN_OR_RETURN(s.qregion[k],
                              options.transport->Allocate(qbytes));
          s.qdata[k] = s.qregion[k]->data();
        }
      } else {
        s.own[k].assign(bytes, 0);
        s.data[k] = s.own[k].data();
        if (qbytes > 0) {
          s.qown[k].assign(qbytes, 0);
          s.qdata[k] = s.qown[k].data();
        }
      }
    }
  }
  return p;
}

void* Publisher::AcquireSlot(uint32_t group, uint64_t version) {
  const int k = static_cast<int>(version & 1);
  absl::MutexLock lock(&mu_);
  Slots& s = groups_[group];
  if (s.elements == 0) return nullptr;
  auto free = [this, &s, group, k]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return s.readers[k] == 0 && leases_.Active(group, k) == 0;
  };
  while (!free()) {
    // Released leases and finished reads wake the wait; leases nobody
    // releases end at their deadline.
    absl::Time until = leases_.LastDeadline(group, k);
    if (until == absl::InfinitePast())
      until = absl::Now() + options_.lease_timeout;
    mu_.AwaitWithDeadline(absl::Condition(&free), until);
  }
  s.held[k] = UINT64_MAX;
  return s.data[k];
}

void* Publisher::QuantizedSlot(uint32_t group, uint64_t version) {
  absl::MutexLock lock(&mu_);
  return groups_[group].qdata[version & 1];
}

const void* Publisher::SlotData(uint32_t group, uint64_t version) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].data[version & 1];
}

void Publisher::Publish(uint32_t group, uint64_t version, absl::Time landed) {
  absl::MutexLock lock(&mu_);
  Slots& s = groups_[group];
  s.newest = version;
  s.held[version & 1] = version;
  s.landed = landed;
}

uint64_t Publisher::version(uint32_t group) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].newest;
}

absl::Status Publisher::AwaitVersionLocked(
    uint32_t group, uint64_t min_version, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<std::string()>& describe_missing) {
  const Slots& s = groups_[group];
  auto ready = [&s, min_version]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return s.newest != UINT64_MAX && s.newest >= min_version;
  };
  while (!ready()) {
    if (cancelled && cancelled())
      return absl::CancelledError("fetch cancelled");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      const uint64_t at = s.newest == UINT64_MAX ? 0 : s.newest;
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", options_.shard_id, ": deadline passed waiting for group ",
          group, " to reach version ", min_version, " (at ", at, "; step ", at,
          " still needs gradients from trainer ranks ",
          describe_missing ? describe_missing() : std::string(), ")"));
    }
    mu_.AwaitWithDeadline(absl::Condition(&ready),
                          std::min(deadline, now + kCancelPoll));
  }
  return absl::OkStatus();
}

absl::Status Publisher::AwaitVersion(
    uint32_t group, uint64_t min_version, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<std::string()>& describe_missing) {
  absl::MutexLock lock(&mu_);
  return AwaitVersionLocked(group, min_version, deadline, cancelled,
                            describe_missing);
}

absl::StatusOr<Publisher::Grant> Publisher::Lease(
    uint32_t group, uint64_t min_version, uint32_t rank, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<std::string()>& describe_missing, bool quantized) {
  if (!options_.transport) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " has no data plane transport"));
  }
  if (quantized && !options_.quantized.quantized()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id,
        " publishes no quantized copy "
        "(zero_optimization.zero_quantized_weights is off)"));
  }
  absl::MutexLock lock(&mu_);
  Slots& s = groups_[group];
  if (s.elements == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " owns no elements of group ", group));
  }
  ZS_RETURN_IF_ERROR(AwaitVersionLocked(group, min_version, deadline, cancelled,
                                        describe_missing));
  const int k = static_cast<int>(s.newest & 1);
  if (s.first_leased != s.newest) {
    if (s.landed != absl::InfinitePast())
      latency_.Record(absl::Now() - s.landed);
    s.first_leased = s.newest;
  }
  Grant grant;
  grant.version = s.newest;
  grant.lease_id = leases_.Grant(group, k, rank);
  grant.values = quantized ? s.qregion[k]->Describe() : s.region[k]->Describe();
  return grant;
}

absl::Status Publisher::Release(uint32_t rank,
                                const std::vector<uint64_t>& ids) {
  // Under mu_ so that a slot wait sees the release.
  absl::MutexLock lock(&mu_);
  return leases_.Release(rank, ids);
}

void Publisher::ReleaseRank(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  leases_.ReleaseRank(rank);
}

absl::StatusOr<Publisher::Copy> Publisher::ReadVersion(uint32_t group,
                                                       uint64_t version) {
  Copy out;
  const void* data = nullptr;
  const int k = static_cast<int>(version & 1);
  {
    absl::MutexLock lock(&mu_);
    Slots& s = groups_[group];
    if (s.held[k] != version) {
      auto name = [](uint64_t v) {
        return v == UINT64_MAX ? std::string("-") : absl::StrCat(v);
      };
      return absl::FailedPreconditionError(absl::StrCat(
          "version ", version, " of group ", group,
          " is no longer (or not yet) held: this shard keeps the last two "
          "published versions (held now: ",
          name(s.held[0]), ", ", name(s.held[1]),
          "); older ones are in checkpoints (zshardctl export)"));
    }
    out.version = version;
    data = s.data[k];
    out.bytes.resize(s.elements * element_size());
    ++s.readers[k];  // the slot is not rewritten while we copy
  }
  CopyPinned(group, k, data, &out);
  return out;
}

void Publisher::CopyPinned(uint32_t group, int k, const void* data, Copy* out) {
  if (!out->bytes.empty()) {
    std::memcpy(out->bytes.data(), data, out->bytes.size());
  }
  absl::MutexLock lock(&mu_);
  --groups_[group].readers[k];
}

absl::StatusOr<Publisher::Copy> Publisher::Read(
    uint32_t group, uint64_t min_version, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<std::string()>& describe_missing) {
  Copy out;
  const void* data = nullptr;
  int k = 0;
  {
    absl::MutexLock lock(&mu_);
    ZS_RETURN_IF_ERROR(AwaitVersionLocked(group, min_version, deadline,
                                          cancelled, describe_missing));
    Slots& s = groups_[group];
    out.version = s.newest;
    k = static_cast<int>(s.newest & 1);
    data = s.data[k];
    out.bytes.resize(s.elements * element_size());
    ++s.readers[k];  // the slot is not rewritten while we copy
  }
  CopyPinned(group, k, data, &out);
  return out;
}

}  // namespace zshard
