// Publisher: the last stage of a shard's step (DESIGN.md, "The server's step
// as a pipeline"). Each group's values are published at version v in slot
// v % 2 of transport memory; trainers lease a published version and read it
// with one-sided gets. The update engine writes version v + 1 into the other
// slot once no lease on it is active (a lease ends when released or at its
// deadline), then publishes it: leases waiting for it are granted at once.
//
// Thread-safety: every method may be called from any thread. AcquireSlot and
// Publish belong to the update engine (one writer per group). Waits are on
// conditions of the publisher's own lock with deadlines; no group lock of
// another stage is ever taken.
#ifndef ZSHARD_SERVER_PUBLISHER_H_
#define ZSHARD_SERVER_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/wire_format.h"
#include "common/transport/transport.h"
#include "server/lease_table.h"
#include "server/publish_latency.h"

namespace zshard {

struct PublisherOptions {
  uint32_t shard_id = 0;
  // Slots hold bf16 values (else fp32).
  bool bf16 = false;
  // A quantized format: each slot also holds the version in it
  // (QuantizedSlot, written by the engine), leased with `quantized`.
  // Otherwise fp32 (none kept).
  WireFormat quantized;
  // A lease not released by then ends by itself.
  absl::Duration lease_timeout = absl::Seconds(30);
  // Allocates the slots (registered, so peers can get from them); null:
  // plain memory, read only through Read (no leases). Not owned.
  Transport* transport = nullptr;
};

class Publisher {
 public:
  // Slots for groups of `elements[g]` elements each; nothing published yet.
  static absl::StatusOr<std::unique_ptr<Publisher>> Create(
      const PublisherOptions& options, const std::vector<uint64_t>& elements);
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  size_t element_size() const { return options_.bf16 ? 2 : 4; }

  // Engine: the memory version `version` of `group` is to be written into
  // (slot version % 2), once no lease or read of that slot is active. Blocks
  // until then; the wait is bounded by the active leases' own deadlines.
  // Null for a group with no elements here.
  void* AcquireSlot(uint32_t group, uint64_t version);
  // The quantized copy's memory of the slot AcquireSlot gave for `version`
  // (PublisherOptions::quantized.Bytes(elements) bytes); null without a
  // quantized format or elements.
  void* QuantizedSlot(uint32_t group, uint64_t version);
  // The memory of the slot holding `version` (read-only for the engine:
  // copying an unchanged version forward).
  const void* SlotData(uint32_t group, uint64_t version) const;
  // Engine: `version` of `group` is in its slot; waiting leases are granted.
  // `landed`: when the contributions that produced it were all in
  // (InfinitePast for an initial or restored version), for PublishLatency.
  void Publish(uint32_t group, uint64_t version, absl::Time landed);

  // The newest published version of `group` (UINT64_MAX before the first).
  uint64_t version(uint32_t group) const;

  // Blocks until `group`'s published version reaches `min_version`, or until
  // `deadline` (DEADLINE_EXCEEDED, naming what it waited for and
  // `describe_missing()`, e.g. the ranks whose gradients are missing) or
  // `cancelled()` returns true (CANCELLED).
  absl::Status AwaitVersion(
      uint32_t group, uint64_t min_version, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<std::string()>& describe_missing);

  struct Grant {
    uint64_t version = 0;
    uint64_t lease_id = 0;
    RemoteRegion values;
  };
  // Waits as AwaitVersion does, then leases the newest published version to
  // `rank`: its values, or with `quantized` its quantized copy.
  // FAILED_PRECONDITION without a transport, for an empty group, or for
  // `quantized` without a quantized format.
  absl::StatusOr<Grant> Lease(
      uint32_t group, uint64_t min_version, uint32_t rank, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<std::string()>& describe_missing,
      bool quantized = false);
  // Ends leases (see LeaseTable::Release); a slot they free may be written.
  absl::Status Release(uint32_t rank, const std::vector<uint64_t>& ids);
  // Ends every lease of `rank` (a dropped trainer: what it still reads does
  // not count), waking a slot wait that waited for them.
  void ReleaseRank(uint32_t rank);

  // A copy of the newest published version (>= min_version, waiting as
  // AwaitVersion does): in-process readers (ShardStore::ReadSlice).
  struct Copy {
    uint64_t version = 0;
    std::vector<char> bytes;
  };
  // A copy of exactly `version` when one of the two slots still holds it
  // (the newest, or the one before until the engine starts rewriting its
  // slot); FAILED_PRECONDITION naming the versions held otherwise. Never
  // waits.
  absl::StatusOr<Copy> ReadVersion(uint32_t group, uint64_t version);
  absl::StatusOr<Copy> Read(
      uint32_t group, uint64_t min_version, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<std::string()>& describe_missing);

  std::map<uint32_t, LeaseTable::RankStats> LeaseStats() {
    return leases_.Stats();
  }
  PublishLatency::Summary Latency() const { return latency_.Summarize(); }

 private:
  struct Slots {
    uint64_t elements = 0;
    std::unique_ptr<MemoryRegion> region[2];
    std::vector<char> own[2];
    void* data[2] = {nullptr, nullptr};
    // The quantized copies (PublisherOptions::quantized), same slots.
    std::unique_ptr<MemoryRegion> qregion[2];
    std::vector<char> qown[2];
    void* qdata[2] = {nullptr, nullptr};
    uint64_t newest = UINT64_MAX;  // published version
    int readers[2] = {0, 0};       // Read copies in progress
    // The version each slot holds (UINT64_MAX: none, or being rewritten).
    uint64_t held[2] = {UINT64_MAX, UINT64_MAX};
    absl::Time landed = absl::InfinitePast();
    uint64_t first_leased = UINT64_MAX;
  };

  explicit Publisher(const PublisherOptions& options);
  absl::Status AwaitVersionLocked(
      uint32_t group, uint64_t min_version, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<std::string()>& describe_missing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies `data` (slot `k` of `group`, pinned by the caller's ++readers[k]
  // under mu_) into out->bytes without mu_, then unpins it.
  void CopyPinned(uint32_t group, int k, const void* data, Copy* out)
      ABSL_LOCKS_EXCLUDED(mu_);

  const PublisherOptions options_;
  LeaseTable leases_;
  PublishLatency latency_;
  mutable absl::Mutex mu_;
  // Sized at Create; the entries' fields are guarded by mu_.
  std::vector<Slots> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_PUBLISHER_H_
