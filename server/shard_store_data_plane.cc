// ShardStore's data plane (DESIGN.md, "Data plane"): leases of published
// values in registered memory, and contributions that landed in place.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/shard_store.h"
#include "zshard/kernels/cast.h"

namespace zshard {

absl::StatusOr<LeaseGrant> ShardStore::Lease(uint32_t group, uint64_t min_version, bool bf16,
                                             uint32_t rank, absl::Time deadline,
                                             const std::function<bool()>& cancelled) {
  if (!options_.transport) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, " has no data plane transport"));
  }
  if (bf16 != options_.publish_bf16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " publishes ", options_.publish_bf16 ? "bf16" : "fp32",
        " values (bf16.enabled must match)"));
  }
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", rank, " out of range (world size ", options_.world_size, ")"));
  }
  // Wait for registration as ReadSlice does.
  {
    absl::MutexLock lock(&mu_);
    while (!registered_) {
      if (cancelled && cancelled()) return absl::CancelledError("lease cancelled");
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shard ", options_.shard_id, ": deadline passed waiting for the model to be registered"));
      }
      mu_.AwaitWithDeadline(absl::Condition(&registered_),
                            std::min(deadline, absl::Now() + absl::Milliseconds(50)));
    }
  }
  ZS_ASSIGN_OR_RETURN(GroupState * g, Group(group));
  if (g->slice.size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, " owns no elements of group ", group));
  }
  absl::MutexLock lock(&g->mu);
  ZS_RETURN_IF_ERROR(AwaitVersionLocked(*g, group, min_version, deadline, cancelled));
  const uint64_t version = g->version;
  const int slot = static_cast<int>(version & 1);
  if (g->pub_version[slot] != version) {
    // The slot holds version - 2: overwrite it once nobody reads it.
    while (leases_->Active(group, slot) > 0) {
      if (cancelled && cancelled()) return absl::CancelledError("lease cancelled");
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shard ", options_.shard_id, ": group ", group, " version ",
            g->pub_version[slot], " is still leased (held until released or ",
            absl::FormatDuration(leases_->timeout()), " after it was granted)"));
      }
      g->mu.Unlock();
      absl::SleepFor(absl::Milliseconds(2));
      g->mu.Lock();
      if (g->version != version) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard ", options_.shard_id, ": group ", group, " moved past version ", version,
            " while its lease waited"));
      }
    }
    void* pub = g->pub_region[slot]->data();
    if (options_.publish_bf16) {
      std::memcpy(pub, g->bf16.data(), g->bf16.size() * sizeof(uint16_t));
    } else {
      std::memcpy(pub, g->master.data(), g->master.size() * sizeof(float));
    }
    g->pub_version[slot] = version;
  }
  if (g->first_leased != version) {
    if (g->first_leased != UINT64_MAX && g->last_landed != absl::InfinitePast()) {
      publish_latency_.Record(absl::Now() - g->last_landed);
    }
    g->first_leased = version;
  }
  LeaseGrant grant;
  grant.version = version;
  grant.lease_id = leases_->Grant(group, slot, rank);
  grant.offset = g->slice.begin;
  grant.elements = g->slice.size();
  grant.values = g->pub_region[slot]->Describe();
  grant.landing =
      (options_.publish_bf16 ? g->landing_bf16 : g->contrib_region)->Describe();
  return grant;
}

absl::Status ShardStore::Release(uint32_t rank, const std::vector<uint64_t>& ids) {
  if (!leases_) return absl::FailedPreconditionError("no data plane transport");
  return leases_->Release(rank, ids);
}

std::map<uint32_t, LeaseTable::RankStats> ShardStore::LeaseStats() {
  if (!leases_) return {};
  return leases_->Stats();
}

absl::StatusOr<uint64_t> ShardStore::Landed(uint32_t group, uint64_t step,
                                            uint32_t micro_step, uint32_t rank, bool bf16) {
  if (!options_.transport) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, " has no data plane transport"));
  }
  if (bf16 != options_.publish_bf16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " lands ", options_.publish_bf16 ? "bf16" : "fp32",
        " gradients (bf16.enabled must match)"));
  }
  ZS_ASSIGN_OR_RETURN(GroupState * g, Group(group));
  ZS_RETURN_IF_ERROR(CheckContributor(rank, micro_step));
  absl::ReleasableMutexLock lock(&g->mu);
  ZS_RETURN_IF_ERROR(CheckContributionStepLocked(*g, group, step));
  const size_t n = g->slice.size();
  const size_t slot = static_cast<size_t>(rank) * options_.accumulation_steps + micro_step;
  if (g->received[slot] != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed (part of) micro-step ", micro_step, " of step ", step,
        " for group ", group));
  }
  if (bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(g->landing_bf16->data()) + slot * n;
    float* dst = g->contrib.data() + slot * n;
    for (size_t i = 0; i < n; ++i) dst[i] = kernels::Bf16BitsToFp32(src[i]);
  }
  g->received[slot] = n;
  const bool reduced = ContributionCompleteLocked(*g);
  lock.Release();
  if (reduced) GroupReduced();
  return static_cast<uint64_t>(n) * (bf16 ? sizeof(uint16_t) : sizeof(float));
}

}  // namespace zshard
