// Crash-consistent file primitives for checkpoints: a file appears under its
// final name only once complete and on disk (write to NAME.tmp, fsync, rename,
// fsync the directory), plus whole-file and ranged reads. Thread-safe (no
// shared state); every call blocks on the filesystem.
#ifndef ZSHARD_COMMON_CHECKPOINT_DURABLE_FILE_H_
#define ZSHARD_COMMON_CHECKPOINT_DURABLE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zshard {

// Creates `dir` and missing parents. UNAVAILABLE naming the path on failure.
absl::Status MakeDirs(const std::string& dir);

// MakeDirs, then creates and removes a file in `dir`: a directory this
// process cannot write is found now, not at the first checkpoint.
// UNAVAILABLE naming the path and the system's reason otherwise.
absl::Status MakeWritableDir(const std::string& dir);

// fsyncs a directory so a rename inside it is durable.
absl::Status SyncDir(const std::string& dir);

// Writes `bytes` to `path` through a temporary name: tmp, fsync, rename,
// fsync of the directory. A crash leaves either no file or the whole file.
absl::Status WriteFileDurably(const std::string& path, const std::string& bytes);

// An append-only file written under PATH.tmp and published by Commit().
// Destroying it uncommitted removes the temporary file. Not thread-safe.
class DurableWriter {
 public:
  static absl::StatusOr<DurableWriter> Open(const std::string& path);
  DurableWriter(DurableWriter&& other) noexcept;
  DurableWriter& operator=(DurableWriter&&) = delete;
  ~DurableWriter();

  absl::Status Append(const void* data, size_t size);
  uint64_t size() const { return size_; }
  // fsync, rename to the final name, fsync the directory.
  absl::Status Commit();

 private:
  DurableWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Whole file. NOT_FOUND when it does not exist, DATA_LOSS when unreadable.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// `size` bytes at `offset`. DATA_LOSS naming the file when it is shorter.
absl::StatusOr<std::string> ReadFileRange(const std::string& path,
                                          uint64_t offset, uint64_t size);

// CRC-32C and size of a whole file, read in blocks.
struct FileDigest {
  uint64_t size = 0;
  uint32_t crc = 0;
};
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CHECKPOINT_DURABLE_FILE_H_
