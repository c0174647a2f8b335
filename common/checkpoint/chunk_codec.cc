#include "common/checkpoint/chunk_codec.h"

#include <zstd.h>

#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zshard {
namespace {

// Table for the reflected Castagnoli polynomial 0x82F63B78.
std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();  // immutable
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

absl::StatusOr<std::string> EncodeChunk(const float* values, const float* base,
                                        size_t n, int zstd_level) {
  if (n > 0 && !values) return absl::InvalidArgumentError("chunk: null values");
  if (zstd_level < 1 || zstd_level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: zstd level must be in 1..19, got ", zstd_level));
  }
  // XOR against the base, then byte planes: plane b holds byte b of every value.
  std::vector<unsigned char> shuffled(n * 4);
  for (size_t i = 0; i < n; ++i) {
    uint32_t v, b = 0;
    std::memcpy(&v, values + i, 4);
    if (base) std::memcpy(&b, base + i, 4);
    v ^= b;
    for (int k = 0; k < 4; ++k) shuffled[k * n + i] = static_cast<unsigned char>(v >> (8 * k));
  }
  std::string out(ZSTD_compressBound(shuffled.size()), '\0');
  const size_t got = ZSTD_compress(out.data(), out.size(), shuffled.data(),
                                   shuffled.size(), zstd_level);
  if (ZSTD_isError(got)) {
    return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(got)));
  }
  out.resize(got);
  return out;
}

absl::Status DecodeChunk(const std::string& encoded, const float* base, size_t n,
                         float* out) {
  if (n > 0 && !out) return absl::InvalidArgumentError("chunk: null output");
  const unsigned long long size =
      ZSTD_getFrameContentSize(encoded.data(), encoded.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN ||
      size != n * 4) {
    return absl::DataLossError(absl::StrCat(
        "chunk: not a compressed chunk of ", n, " values"));
  }
  std::vector<unsigned char> shuffled(n * 4);
  const size_t got = ZSTD_decompress(shuffled.data(), shuffled.size(),
                                     encoded.data(), encoded.size());
  if (ZSTD_isError(got) || got != shuffled.size()) {
    return absl::DataLossError(absl::StrCat(
        "chunk: corrupt (",
        ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short", ")"));
  }
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = 0, b = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(shuffled[k * n + i]) << (8 * k);
    if (base) std::memcpy(&b, base + i, 4);
    v ^= b;
    std::memcpy(out + i, &v, 4);
  }
  return absl::OkStatus();
}

}  // namespace zshard
