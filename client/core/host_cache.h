// HostCache: the shared memory through which the trainers of one host share
// the parameters they fetched (ZeRO++'s hpZ, DESIGN.md "Data plane"). One
// POSIX shared-memory segment per host holds every group's gathered values
// (in the trainers' buffer format) and, per (group, shard) slice, a cell
// saying which version of the slice is there. The trainer that fetches a
// slice over the network publishes it; the host's other trainers wait for
// that version and copy it instead of fetching it themselves.
//
// The host's `members` trainers attach with their index; member m publishes
// the slices of shards s with s % members == m. A reader waiting for a slice
// whose publisher is not attached (not yet, or no more) is told so at once
// (UNAVAILABLE) and fetches it over the network; one whose publisher's
// process ended without detaching (killed), within a second.
//
// Each cell is a sequence lock: a reader that saw the slice change while it
// copied is told so (ABORTED) and fetches the slice over the network. Waits
// are futex waits on the cell (no polling) with a deadline.
//
// Thread-safety: every method may be called from any thread of any process
// attached; at most one thread (of any process) publishes a given cell at a
// time.
#ifndef ZSHARD_CLIENT_CORE_HOST_CACHE_H_
#define ZSHARD_CLIENT_CORE_HOST_CACHE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zshard {

class HostCache {
 public:
  // Attaches to the segment `name` ("/" and up to 200 letters, digits, '-'
  // or '_') as member `member` of `members`, creating it when absent, laid
  // out for groups of `group_bytes[g]` bytes each cut into `shards` slices.
  // INVALID_ARGUMENT for a bad name, no groups or a member out of range;
  // FAILED_PRECONDITION when a segment of that name has another layout
  // (another job or model: its name must differ); the system's error
  // (naming the segment) when it cannot be created or mapped. The name is
  // removed once all `members` attached (a member attaching later, after a
  // restart, gets a segment of its own and shares nothing), or when the
  // last attached cache closes; the memory, when the last mapping goes.
  static absl::StatusOr<std::unique_ptr<HostCache>> Open(
      const std::string& name, const std::vector<uint64_t>& group_bytes,
      uint32_t shards, uint32_t members, uint32_t member);
  // Detaches: the readers waiting for this member's slices (in any
  // process) are told it left.
  ~HostCache();
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  // Copies `bytes` from `src` to group `g`'s values at byte `offset` as
  // shard `shard`'s slice at `version`, then wakes its readers. Nothing
  // happens when that version is there already. Never blocks on readers.
  void Publish(size_t g, uint32_t shard, uint64_t version, uint64_t offset,
               const void* src, size_t bytes);

  // Whether shard `shard`'s slice of group `g` at `version` is there now.
  bool Has(size_t g, uint32_t shard, uint64_t version) const;

  // Waits until shard `shard`'s slice of group `g` at `version` is there and
  // copies its `bytes` at byte `offset` of the group to `dest`.
  // DEADLINE_EXCEEDED at `deadline`; ABORTED when a newer version replaced
  // it, or it changed during the copy (`dest` then holds nothing useful);
  // UNAVAILABLE while its publisher is not attached (or its process
  // ended: looked at every second of the wait); CANCELLED once
  // `*cancelled` is true and WakeAll ran.
  absl::Status Read(size_t g, uint32_t shard, uint64_t version, uint64_t offset,
                    void* dest, size_t bytes, absl::Time deadline,
                    const std::atomic<bool>* cancelled = nullptr) const;

  // Wakes every Read waiting (in any process: theirs look again and wait
  // on), so that those whose `cancelled` is set return.
  void WakeAll();

  const std::string& name() const { return name_; }

 private:
  struct Header;
  struct Member;
  struct Cell;
  HostCache() = default;
  Cell* cell(size_t g, uint32_t shard) const;
  Member* member(uint32_t m) const;
  // Whether member `m` is not attached, or its process ended without
  // detaching (checked when it runs in this PID namespace).
  bool Gone(uint32_t m) const;

  std::string name_;
  uint32_t shards_ = 0;
  uint32_t members_ = 1;
  uint32_t member_ = 0;
  uint64_t pid_ns_ = 0;
  std::vector<uint64_t> group_offset_;  // bytes from the segment's start
  void* base_ = nullptr;
  size_t size_ = 0;
  bool attached_ = false;  // counted in the segment's header
};

// The segment name the trainers of one host share: a hash of what only the
// trainers of the same job agree on (the shards' endpoints and transport
// addresses, the config hash) and the host's index (rank / hpZ size).
std::string HostCacheName(const std::vector<std::string>& endpoints,
                          const std::vector<std::string>& transport_addresses,
                          uint64_t config_hash, uint32_t host);

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_HOST_CACHE_H_
