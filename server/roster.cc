#include "server/roster.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zshard {

Roster::Roster(uint32_t max_ranks, uint32_t initial, uint64_t start_step,
               uint32_t min_members)
    : max_ranks_(max_ranks), min_members_(std::max<uint32_t>(1, min_members)) {
  absl::MutexLock lock(&mu_);
  entries_.resize(max_ranks);
  for (uint32_t r = 0; r < initial && r < max_ranks; ++r) {
    entries_[r].member = true;
    entries_[r].from_step = start_step;
  }
}

void Roster::Reset(const std::vector<uint32_t>& members, uint64_t start_step) {
  absl::MutexLock lock(&mu_);
  for (uint32_t r = 0; r < max_ranks_; ++r) {
    entries_[r] = Entry();
    entries_[r].from_step = start_step;
  }
  for (uint32_t r : members) {
    if (r < max_ranks_) entries_[r].member = entries_[r].sealed = true;
  }
  ++epoch_;
}

bool Roster::Expected(uint32_t rank, uint64_t step) const {
  absl::MutexLock lock(&mu_);
  if (rank >= max_ranks_) return false;
  const Entry& e = entries_[rank];
  return e.member && step >= e.from_step;
}

absl::Status Roster::CheckContributor(uint32_t rank, uint64_t step) const {
  if (rank >= max_ranks_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", rank, " out of range (", max_ranks_, " ranks)"));
  }
  absl::MutexLock lock(&mu_);
  const Entry& e = entries_[rank];
  if (!e.member) {
    if (!e.dropped_because.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("trainer rank ", rank, " was dropped from the cluster (",
                       e.dropped_because, "); a trainer must join again"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("trainer rank ", rank, " has not been admitted"));
  }
  if (e.sealed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cluster rolled back to step ", e.from_step,
        " (a shard was replaced): trainer rank ", rank, " must join again"));
  }
  if (step < e.from_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer rank ", rank, " was admitted at step ",
                     e.from_step, ", not ", step));
  }
  return absl::OkStatus();
}

absl::Status Roster::Prepare(uint32_t rank, uint64_t from_step,
                             const std::string& identity) {
  if (rank >= max_ranks_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", rank, " out of range (", max_ranks_, " ranks)"));
  }
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[rank];
  e.member = true;
  e.from_step = from_step;
  e.identity = identity;
  e.dropped_because.clear();
  e.sealed = false;
  ++epoch_;
  return absl::OkStatus();
}

absl::Status Roster::Admit(uint32_t rank, uint64_t from_step) {
  absl::MutexLock lock(&mu_);
  if (rank >= max_ranks_ || !entries_[rank].member) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer rank ", rank, " was not prepared for admission"));
  }
  entries_[rank].from_step = from_step;
  ++epoch_;
  return absl::OkStatus();
}

void Roster::Drop(uint32_t rank, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (rank >= max_ranks_) return;
  Entry& e = entries_[rank];
  if (!e.member) return;
  e.member = false;
  e.dropped_because = reason.empty() ? "dropped" : reason;
  ++epoch_;
}

std::vector<Roster::Member> Roster::Members() const {
  absl::MutexLock lock(&mu_);
  std::vector<Member> out;
  for (uint32_t r = 0; r < max_ranks_; ++r) {
    if (entries_[r].member) {
      out.push_back(Member{r, entries_[r].from_step, entries_[r].identity});
    }
  }
  return out;
}

bool Roster::Quorate() const {
  absl::MutexLock lock(&mu_);
  uint32_t members = 0;
  for (const Entry& e : entries_) members += e.member;
  return members >= min_members_;
}

std::string Roster::Identity(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return rank < max_ranks_ ? entries_[rank].identity : "";
}

uint64_t Roster::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

}  // namespace zshard
