#include "server/coordinator/membership.h"

#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/base/thread_name.h"

namespace zshard {
namespace {

// How long a drop waits for the shards it tells.
constexpr absl::Duration kDropTimeout = absl::Seconds(10);
constexpr size_t kKeptEvents = 256;

const char* KindName(v1::MembershipEvent::Kind kind) {
  switch (kind) {
    case v1::MembershipEvent::ADMITTED:
      return "admitted";
    case v1::MembershipEvent::DROPPED:
      return "dropped";
    case v1::MembershipEvent::LEFT:
      return "left";
    case v1::MembershipEvent::EXPIRED:
      return "expired";
    case v1::MembershipEvent::ROLLED_BACK:
      return "rolled back";
    default:
      return "changed";
  }
}

}  // namespace

MembershipRecord ToRecord(const v1::MembershipEvent& e) {
  MembershipRecord r;
  r.kind = v1::MembershipEvent::Kind_Name(e.kind());
  r.rank = e.rank();
  r.identity = e.identity();
  r.step = e.step();
  r.reason = e.reason();
  r.unix_seconds = e.unix_seconds();
  return r;
}

v1::MembershipEvent FromRecord(const MembershipRecord& r) {
  v1::MembershipEvent e;
  v1::MembershipEvent::Kind kind = v1::MembershipEvent::KIND_UNSPECIFIED;
  v1::MembershipEvent::Kind_Parse(r.kind, &kind);
  e.set_kind(kind);
  e.set_rank(r.rank);
  e.set_identity(r.identity);
  e.set_step(r.step);
  e.set_reason(r.reason);
  e.set_unix_seconds(r.unix_seconds);
  return e;
}

std::string TrainerIdentity::ToString() const {
  // Adopt's placeholders (no process yet) print as their description.
  if (instance == 0 && pid == 0) return host;
  return absl::StrCat(host.empty() ? "?" : host, ":", pid, " (instance ",
                      absl::Hex(instance, absl::kZeroPad16), ")");
}

Membership::Membership(const MembershipOptions& options, ShardFanout* fanout)
    : options_(options), fanout_(fanout), watchdog_([this] {
        NameCurrentThread("zs-watchdog");
        Watch();
      }) {}

Membership::~Membership() { StopWatchdog(); }

void Membership::StopWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
}

absl::Status Membership::CheckHolderLocked(uint32_t rank,
                                           uint64_t instance) const {
  if (rank >= options_.ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", rank, " out of range (", options_.ranks, " ranks)"));
  }
  auto it = members_.find(rank);
  if (it != members_.end() && it->second.who.instance == instance) {
    return absl::OkStatus();
  }
  auto gone = gone_.find(instance);
  if (gone != gone_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer rank ", rank, ": this process lost its rank (",
                     gone->second, "); a new process must take its place"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("this process (instance ", absl::Hex(instance),
                   ") does not hold trainer rank ", rank, "; join first"));
}

void Membership::RecordLocked(v1::MembershipEvent::Kind kind, uint32_t rank,
                              const TrainerIdentity& who, uint64_t step,
                              const std::string& reason) {
  v1::MembershipEvent e;
  e.set_kind(kind);
  e.set_rank(rank);
  e.set_identity(who.ToString());
  e.set_step(step);
  e.set_reason(reason);
  e.set_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  events_.push_back(std::move(e));
  while (events_.size() > kKeptEvents) events_.pop_front();
  std::cerr << "zshard-server: coordinator: trainer rank " << rank << " ("
            << who.ToString() << ") " << KindName(kind) << " at step " << step
            << (reason.empty() ? "" : ": ") << reason << "\n";
}

absl::StatusOr<uint32_t> Membership::Join(int64_t requested,
                                          const TrainerIdentity& who) {
  if (who.instance == 0) {
    return absl::InvalidArgumentError(
        "Join without an instance_id: every trainer process names itself "
        "with a random one (host, pid, instance_id)");
  }
  if (requested >= static_cast<int64_t>(options_.ranks) || requested < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("requested rank ", requested, " out of range (",
                     options_.ranks, " ranks; -1 asks for any)"));
  }
  for (int attempt = 0;; ++attempt) {
    uint32_t stale_rank = 0;
    uint64_t stale_instance = 0;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      // The same process again: its rank.
      for (auto& [r, m] : members_) {
        if (m.who.instance == who.instance) {
          m.last_seen = now;
          return r;
        }
      }
      // A process that was dropped (or left) holds nothing again: what it
      // computed since may be stale; a new process joins instead.
      if (auto gone = gone_.find(who.instance); gone != gone_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "this process (", who.ToString(), ") lost its rank (", gone->second,
            "); a process that was dropped does not join "
            "again: start a new one"));
      }
      uint32_t rank = 0;
      if (requested >= 0) {
        rank = static_cast<uint32_t>(requested);
      } else {
        while (rank < options_.ranks && members_.count(rank)) ++rank;
        if (rank == options_.ranks) {
          return absl::ResourceExhaustedError(
              absl::StrCat("all ", options_.ranks,
                           " trainer ranks are held by live "
                           "trainers (--max_trainers, default --trainers: ",
                           options_.ranks, ")"));
        }
      }
      auto it = members_.find(rank);
      if (it == members_.end()) {
        Member m;
        m.who = who;
        m.last_seen = now;
        members_[rank] = m;
        return rank;
      }
      if (it->second.who.instance == 0) {  // held for it since a takeover
        it->second.who = who;
        it->second.last_seen = now;
        return rank;
      }
      const absl::Duration quiet = now - it->second.last_seen;
      if (quiet < options_.trainer_timeout || attempt > 0) {
        return absl::AlreadyExistsError(absl::StrFormat(
            "trainer rank %u is held by %s, seen %.1f s ago; ask for another "
            "rank or none",
            rank, it->second.who.ToString(), absl::ToDoubleSeconds(quiet)));
      }
      stale_rank = rank;
      stale_instance = it->second.who.instance;
    }
    Remove(stale_rank, stale_instance, v1::MembershipEvent::DROPPED,
           absl::StrCat("replaced by a new join of its rank from ",
                        who.ToString()));
  }
}

absl::Status Membership::Heartbeat(uint32_t rank, uint64_t instance) {
  absl::MutexLock lock(&mu_);
  ZS_RETURN_IF_ERROR(CheckHolderLocked(rank, instance));
  members_[rank].last_seen = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Membership::Admit(uint32_t rank, uint64_t instance,
                                           absl::Time deadline) {
  absl::MutexLock change(&change_mu_);
  TrainerIdentity who;
  {
    absl::MutexLock lock(&mu_);
    ZS_RETURN_IF_ERROR(CheckHolderLocked(rank, instance));
    Member& m = members_[rank];
    if (m.admitted) return m.start_step;
    who = m.who;
    m.last_seen = absl::Now();
  }
  absl::StatusOr<uint64_t> step =
      fanout_->PrepareAdmit(rank, 0, who.ToString(), deadline);
  absl::Status st = step.status();
  if (st.ok()) st = fanout_->Admit(rank, *step, deadline);
  if (!st.ok()) {
    // Half admitted: no shard may keep waiting for it.
    (void)fanout_->Drop(rank, "its admission failed", deadline);
    return absl::Status(st.code(), absl::StrCat("admitting trainer rank ", rank,
                                                ": ", st.message()));
  }
  absl::MutexLock lock(&mu_);
  Member& m = members_[rank];
  m.admitted = true;
  m.expected = false;
  m.start_step = *step;
  m.last_seen = absl::Now();
  RecordLocked(v1::MembershipEvent::ADMITTED, rank, who, *step, "");
  return *step;
}

absl::Status Membership::Leave(uint32_t rank, uint64_t instance,
                               const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    ZS_RETURN_IF_ERROR(CheckHolderLocked(rank, instance));
  }
  Remove(rank, instance, v1::MembershipEvent::LEFT,
         reason.empty() ? "it left" : reason.substr(0, 256));
  return absl::OkStatus();
}

void Membership::Remove(uint32_t rank, uint64_t instance,
                        v1::MembershipEvent::Kind kind,
                        const std::string& reason) {
  absl::MutexLock change(&change_mu_);
  Member gone;
  {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(rank);
    if (it == members_.end() || it->second.who.instance != instance) return;
    gone = it->second;
    members_.erase(it);
    gone_[instance] = reason;
    while (gone_.size() > kKeptEvents) gone_.erase(gone_.begin());
  }
  const uint64_t step = fanout_->CurrentStep();
  std::string note = reason;
  // Never admitted: no shard expects it (its rank's first-step wait, if
  // any, stays for the next trainer that takes it).
  if (gone.admitted || gone.expected) {
    absl::Status st =
        fanout_->Drop(rank, absl::StrCat(gone.who.ToString(), ": ", reason),
                      absl::Now() + kDropTimeout);
    if (!st.ok())
      absl::StrAppend(&note, " (not every shard told: ", st.message(), ")");
  }
  absl::MutexLock lock(&mu_);
  RecordLocked(
      gone.admitted || gone.expected ? kind : v1::MembershipEvent::EXPIRED,
      rank, gone.who, step, note);
}

void Membership::Watch() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  mu_.Lock();
  while (!stop_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<std::pair<uint32_t, uint64_t>> expired;
    std::vector<std::string> why;
    for (const auto& [rank, m] : members_) {
      const absl::Time due = m.last_seen + options_.trainer_timeout;
      if (due <= now) {
        expired.emplace_back(rank, m.who.instance);
        why.push_back(absl::StrFormat(
            "no heartbeat for %.1f s (--trainer_timeout_s %.1f)",
            absl::ToDoubleSeconds(now - m.last_seen),
            absl::ToDoubleSeconds(options_.trainer_timeout)));
      } else {
        next = std::min(next, due);
      }
    }
    if (!expired.empty()) {
      mu_.Unlock();
      for (size_t i = 0; i < expired.size(); ++i) {
        Remove(expired[i].first, expired[i].second,
               v1::MembershipEvent::DROPPED, why[i]);
      }
      mu_.Lock();
      continue;
    }
    // A join adds a member whose deadline is at least a timeout away.
    next = std::min(next, now + options_.trainer_timeout);
    mu_.AwaitWithDeadline(absl::Condition(&stop_), next);
  }
  mu_.Unlock();
}

void Membership::Fill(v1::GetStatusResponse* status) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (const auto& [rank, m] : members_) {
    v1::TrainerMember* t = status->add_members();
    t->set_rank(rank);
    t->set_host(m.who.host);
    t->set_pid(m.who.pid);
    t->set_instance_id(m.who.instance);
    t->set_admitted(m.admitted);
    t->set_start_step(m.start_step);
    t->set_seconds_since_seen(absl::ToDoubleSeconds(now - m.last_seen));
  }
  for (const v1::MembershipEvent& e : events_) {
    *status->add_membership_events() = e;
  }
  status->set_trainer_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(options_.trainer_timeout)));
}

std::string Membership::Describe(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(rank);
  if (it == members_.end()) return "";
  return absl::StrFormat(
      "%s, last seen %.1f s ago", it->second.who.ToString(),
      absl::ToDoubleSeconds(absl::Now() - it->second.last_seen));
}

std::vector<v1::MembershipEvent> Membership::History() const {
  absl::MutexLock lock(&mu_);
  return std::vector<v1::MembershipEvent>(events_.begin(), events_.end());
}

void Membership::RestoreHistory(
    const std::vector<v1::MembershipEvent>& events) {
  absl::MutexLock lock(&mu_);
  events_.insert(events_.begin(), events.begin(), events.end());
  while (events_.size() > kKeptEvents) events_.pop_front();
}

void Membership::Adopt(const std::vector<uint32_t>& ranks, uint64_t step,
                       const std::string& reason) {
  absl::MutexLock change(&change_mu_);
  absl::MutexLock lock(&mu_);
  for (uint32_t rank : ranks) {
    if (rank >= options_.ranks || members_.count(rank)) continue;
    Member m;
    m.who.host = "its holder before the takeover";
    m.expected = true;
    m.start_step = step;
    // Twice the timeout: the trainer first has to notice that the old
    // coordinator is gone and find this one through the shards.
    m.last_seen = absl::Now() + options_.trainer_timeout;
    members_[rank] = m;
    RecordLocked(v1::MembershipEvent::ROLLED_BACK, rank, m.who, step, reason);
  }
}

absl::Status Membership::RollBack(
    uint64_t step, const std::string& reason,
    const std::function<absl::Status(const std::vector<uint32_t>& ranks)>&
        apply) {
  absl::MutexLock change(&change_mu_);
  std::vector<uint32_t> ranks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [rank, m] : members_) {
      if (m.admitted) ranks.push_back(rank);
    }
  }
  ZS_RETURN_IF_ERROR(apply(ranks));
  absl::MutexLock lock(&mu_);
  for (auto& [rank, m] : members_) {
    if (!m.admitted) continue;
    m.admitted = false;
    m.expected = true;
    m.start_step = step;
    RecordLocked(v1::MembershipEvent::ROLLED_BACK, rank, m.who, step, reason);
  }
  return absl::OkStatus();
}

}  // namespace zshard
