#include "client/core/host_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/model/model_spec.h"

namespace zshard {

namespace {

constexpr size_t kLine = 64;
constexpr absl::Duration kLivenessCheck = absl::Seconds(1);

// The inode of this process's PID namespace; 0 when unknown.
uint64_t PidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
}

size_t RoundUp(size_t n) { return (n + kLine - 1) / kLine * kLine; }

absl::Status SystemError(const std::string& what, const std::string& name) {
  const int e = errno;
  const std::string msg =
      absl::StrCat(what, " of the host cache ", name, ": ", strerror(e));
  return e == ENOMEM || e == ENOSPC ? absl::ResourceExhaustedError(msg)
                                    : absl::UnavailableError(msg);
}

// Shared futexes (not FUTEX_PRIVATE): the waiters are in other processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t seen,
               absl::Duration left) {
  const timespec ts = absl::ToTimespec(left);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts,
          nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX,
          nullptr, nullptr, 0);
}

bool ValidName(const std::string& name) {
  if (name.size() < 2 || name.size() > 201 || name[0] != '/') return false;
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      return false;
    }
  }
  return true;
}

}  // namespace

// Both live in the segment; their atomics are lock-free, so they work
// across processes.
struct HostCache::Header {
  std::atomic<uint64_t> layout;  // hash of the layout, 0 until set
  std::atomic<uint32_t> attached;
};

// A member's presence: attached count, and the process (pid, and its PID
// namespace's inode: a pid means something only in the same namespace).
struct HostCache::Member {
  std::atomic<uint32_t> present;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> pid_ns;
};

struct HostCache::Cell {
  std::atomic<uint32_t> seq;      // odd while the slice is written
  std::atomic<uint64_t> version;  // version + 1 of the slice there; 0: none
};

static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics");

absl::StatusOr<std::unique_ptr<HostCache>> HostCache::Open(
    const std::string& name, const std::vector<uint64_t>& group_bytes,
    uint32_t shards, uint32_t members, uint32_t member) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("host cache name \"", name,
                     "\" is not \"/\" and 1-200 letters, digits, '-' or '_'"));
  }
  if (group_bytes.empty() || shards == 0) {
    return absl::InvalidArgumentError("host cache " + name +
                                      ": no groups or no shards");
  }
  if (member >= members) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host cache ", name, ": member ", member, " of ", members));
  }
  std::unique_ptr<HostCache> c(new HostCache());
  c->name_ = name;
  c->shards_ = shards;
  c->members_ = members;
  c->member_ = member;
  size_t offset = RoundUp(sizeof(Header)) +
                  RoundUp(sizeof(Cell)) * group_bytes.size() * shards +
                  RoundUp(sizeof(Member) * members);
  uint64_t layout = Fnv1a64(&shards, sizeof(shards));
  layout = Fnv1a64(&members, sizeof(members), layout);
  for (uint64_t b : group_bytes) {
    c->group_offset_.push_back(offset);
    offset += RoundUp(b);
    layout = Fnv1a64(&b, sizeof(b), layout);
  }
  if (layout == 0) layout = 1;
  c->size_ = offset;

  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return SystemError("shm_open", name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = SystemError("fstat", name);
    close(fd);
    return s;
  }
  // Two creators both grow it to the same size; another size is another
  // layout.
  if (st.st_size != 0 && static_cast<size_t>(st.st_size) != c->size_) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "host cache ", name, " exists with ", st.st_size, " bytes, not the ",
        c->size_, " of this model's layout (another job's?)"));
  }
  // Reserves the pages now, so a full /dev/shm is an error here rather
  // than a SIGBUS at the first write (both creators may do it).
  if (const int e = posix_fallocate(fd, 0, static_cast<off_t>(c->size_))) {
    errno = e;
    absl::Status s = SystemError(
        absl::StrCat("reserving ", c->size_, " bytes (posix_fallocate)"), name);
    close(fd);
    return s;
  }
  void* base =
      mmap(nullptr, c->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return SystemError("mmap", name);
  c->base_ = base;
  Header* h = static_cast<Header*>(base);
  uint64_t seen = 0;
  if (!h->layout.compare_exchange_strong(seen, layout) && seen != layout) {
    return absl::FailedPreconditionError(
        absl::StrCat("host cache ", name,
                     " exists with another layout (another job's or "
                     "model's?)"));
  }
  c->pid_ns_ = PidNamespace();
  Member* m = c->member(member);
  m->pid.store(getpid());
  m->pid_ns.store(c->pid_ns_);
  m->present.fetch_add(1);
  c->attached_ = true;
  // Once every member is in, the name goes: the memory lives on while
  // mapped, and a process that dies leaves nothing behind in /dev/shm.
  if (h->attached.fetch_add(1) + 1 == members) shm_unlink(name.c_str());
  return c;
}

HostCache::~HostCache() {
  if (base_ == nullptr) return;
  Header* h = static_cast<Header*>(base_);
  if (attached_) {
    // Every cell this member publishes changes (its version stays), so a
    // reader about to wait on one does not miss the wake.
    member(member_)->present.fetch_sub(1);
    for (size_t g = 0; g < group_offset_.size(); ++g) {
      for (uint32_t s = member_; s < shards_; s += members_) {
        cell(g, s)->seq.fetch_add(2, std::memory_order_release);
        FutexWakeAll(&cell(g, s)->seq);
      }
    }
  }
  if (attached_ && h->attached.fetch_sub(1) == 1) {
    shm_unlink(name_.c_str());
  }
  munmap(base_, size_);
}

HostCache::Cell* HostCache::cell(size_t g, uint32_t shard) const {
  char* cells = static_cast<char*>(base_) + RoundUp(sizeof(Header));
  return reinterpret_cast<Cell*>(cells +
                                 (g * shards_ + shard) * RoundUp(sizeof(Cell)));
}

HostCache::Member* HostCache::member(uint32_t m) const {
  char* after_cells = static_cast<char*>(base_) + RoundUp(sizeof(Header)) +
                      RoundUp(sizeof(Cell)) * group_offset_.size() * shards_;
  return reinterpret_cast<Member*>(after_cells) + m;
}

bool HostCache::Gone(uint32_t m) const {
  const Member* p = member(m);
  if (p->present.load(std::memory_order_acquire) == 0) return true;
  const int32_t pid = p->pid.load();
  // Died without detaching: only a pid of this PID namespace can be asked.
  return pid_ns_ != 0 && p->pid_ns.load() == pid_ns_ && pid > 0 &&
         kill(pid, 0) != 0 && errno == ESRCH;
}

void HostCache::Publish(size_t g, uint32_t shard, uint64_t version,
                        uint64_t offset, const void* src, size_t bytes) {
  Cell* c = cell(g, shard);
  if (c->version.load(std::memory_order_acquire) == version + 1) return;
  c->seq.fetch_add(1, std::memory_order_relaxed);  // odd: writing
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(static_cast<char*>(base_) + group_offset_[g] + offset, src,
              bytes);
  c->version.store(version + 1, std::memory_order_release);
  c->seq.fetch_add(1, std::memory_order_release);  // even: written
  FutexWakeAll(&c->seq);
}

bool HostCache::Has(size_t g, uint32_t shard, uint64_t version) const {
  const Cell* c = cell(g, shard);
  return (c->seq.load(std::memory_order_acquire) & 1) == 0 &&
         c->version.load(std::memory_order_acquire) == version + 1;
}

absl::Status HostCache::Read(size_t g, uint32_t shard, uint64_t version,
                             uint64_t offset, void* dest, size_t bytes,
                             absl::Time deadline,
                             const std::atomic<bool>* cancelled) const {
  Cell* c = cell(g, shard);
  for (;;) {
    if (cancelled != nullptr && cancelled->load()) {
      return absl::CancelledError(absl::StrCat(
          "host cache ", name_, ": the read of group ", g, " was cancelled"));
    }
    const uint32_t before = c->seq.load(std::memory_order_acquire);
    const uint64_t there = c->version.load(std::memory_order_acquire);
    if (there > version + 1) {
      return absl::AbortedError(absl::StrCat("host cache ", name_, ": group ",
                                             g, " shard ", shard,
                                             " moved on to version ", there - 1,
                                             " before ", version, " was read"));
    }
    if ((before & 1) == 0 && there == version + 1) {
      std::memcpy(dest,
                  static_cast<const char*>(base_) + group_offset_[g] + offset,
                  bytes);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (c->seq.load(std::memory_order_relaxed) == before) {
        return absl::OkStatus();
      }
      return absl::AbortedError(absl::StrCat("host cache ", name_, ": group ",
                                             g, " shard ", shard,
                                             " changed while it was read"));
    }
    if (Gone(shard % members_)) {
      return absl::UnavailableError(absl::StrCat(
          "host cache ", name_, ": the trainer that fetches shard ", shard,
          " for this host (member ", shard % members_,
          ") is not attached, or its process ended"));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "host cache ", name_, ": group ", g, " shard ", shard, " version ",
          version, " was not published by this host's other trainers in time"));
    }
    // A publisher that dies wakes nobody: its process is looked at again
    // after each kLivenessCheck of waiting.
    FutexWait(&c->seq, before, std::min(left, kLivenessCheck));
  }
}

void HostCache::WakeAll() {
  const size_t groups = group_offset_.size();
  for (size_t g = 0; g < groups; ++g) {
    for (uint32_t s = 0; s < shards_; ++s) FutexWakeAll(&cell(g, s)->seq);
  }
}

std::string HostCacheName(const std::vector<std::string>& endpoints,
                          const std::vector<std::string>& transport_addresses,
                          uint64_t config_hash, uint32_t host) {
  uint64_t h = Fnv1a64(&config_hash, sizeof(config_hash));
  for (const std::string& e : endpoints) h = Fnv1a64(e.data(), e.size(), h);
  for (const std::string& a : transport_addresses) {
    h = Fnv1a64(a.data(), a.size(), h);
  }
  char hex[17];
  snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return absl::StrCat("/zshard-hpz-", hex, "-", host);
}

}  // namespace zshard
