// The encoding of one checkpoint chunk of fp32 state (DESIGN.md,
// "Checkpoints"): the bits are XORed with the chunk's base (the same chunk in
// the chain's base checkpoint; none for a base itself), byte-shuffled (every
// value's byte 0, then every byte 1, ...) so unchanged high bytes form long
// runs, and zstd-compressed. A chunk that did not change encodes to a few
// bytes. Pure functions; thread-safe.
//
// The first building block of issue 6; the checkpoint writer, manifests and
// restore are not built yet.
#ifndef ZSHARD_COMMON_CHECKPOINT_CHUNK_CODEC_H_
#define ZSHARD_COMMON_CHECKPOINT_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zshard {

// CRC-32C (Castagnoli), continuing from `crc` (0 to start).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// Encodes `n` values against `base` (null: against zeros). INVALID_ARGUMENT
// for a null `values` with n > 0 or a zstd level outside 1..19.
absl::StatusOr<std::string> EncodeChunk(const float* values, const float* base,
                                        size_t n, int zstd_level = 3);

// Decodes into `out` (n values) against the same `base`. DATA_LOSS when the
// bytes are not a chunk of n values (truncated, corrupt, other size).
absl::Status DecodeChunk(const std::string& encoded, const float* base, size_t n,
                         float* out);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CHECKPOINT_CHUNK_CODEC_H_
