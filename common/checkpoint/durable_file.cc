#include "common/checkpoint/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/chunk_codec.h"

namespace zshard {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

absl::Status WriteAll(int fd, const void* data, size_t size,
                      const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("empty directory name");
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string part = dir.substr(0, i);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", part);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat(dir, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status MakeWritableDir(const std::string& dir) {
  absl::Status st = MakeDirs(dir);
  if (!st.ok()) return st;
  const std::string probe =
      absl::StrCat(dir, "/.zshard-write-check.", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Errno("cannot create a file in", dir);
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& path, const std::string& bytes) {
  absl::StatusOr<DurableWriter> w = DurableWriter::Open(path);
  if (!w.ok()) return w.status();
  absl::Status st = w->Append(bytes.data(), bytes.size());
  if (!st.ok()) return st;
  return w->Commit();
}

absl::StatusOr<DurableWriter> DurableWriter::Open(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  return DurableWriter(path, fd);
}

DurableWriter::DurableWriter(DurableWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_) {
  other.fd_ = -1;
}

DurableWriter::~DurableWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink((path_ + ".tmp").c_str());
  }
}

absl::Status DurableWriter::Append(const void* data, size_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(path_ + " is closed");
  absl::Status st = WriteAll(fd_, data, size, path_ + ".tmp");
  if (st.ok()) size_ += size;
  return st;
}

absl::Status DurableWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(path_ + " is closed");
  const std::string tmp = path_ + ".tmp";
  if (::fsync(fd_) != 0) return Errno("cannot fsync", tmp);
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Errno("cannot rename to", path_);
  }
  return SyncDir(DirOf(path_));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::StatusOr<std::string> ReadFileRange(const std::string& path,
                                          uint64_t offset, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string out(size, '\0');
  uint64_t got = 0;
  while (got < size) {
    const ssize_t n = ::pread(fd, out.data() + got, size - got,
                              static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(
          path, " is truncated or unreadable: wanted bytes [", offset, ", ",
          offset + size, ") but got ", got));
    }
    got += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return out;
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  FileDigest d;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    d.crc = Crc32c(buf.data(), static_cast<size_t>(n), d.crc);
    d.size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return d;
}

}  // namespace zshard
