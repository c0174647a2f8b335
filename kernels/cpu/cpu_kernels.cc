#include "zshard/kernels/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu/kernel_pool.h"
#include "cpu/kernel_table.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

bool OsSavesAvx512State() {
  // XCR0 bits 1, 2 (SSE, AVX) and 5..7 (opmask, ZMM) must be enabled.
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0xe6u) == 0xe6u;
}

const KernelTable* TableFor(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return &ScalarKernelTable();
    case Isa::kAvx2:
      return Avx2KernelTable();
    case Isa::kAvx512:
      return Avx512KernelTable();
  }
  return nullptr;
}

absl::Status CastArgs(const void* in, const void* out, size_t n) {
  if (n > 0 && (!in || !out)) return absl::InvalidArgumentError("cast: null buffer");
  return absl::OkStatus();
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

absl::StatusOr<Isa> ParseIsa(const std::string& name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kernel ISA '", name, "' (scalar, avx2 or avx512)"));
}

bool IsaSupported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && OsSavesAvx512State();
  }
  return false;
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

absl::StatusOr<std::unique_ptr<CpuKernels>> CpuKernels::Create(
    const CpuKernelsOptions& options) {
  if (options.threads < 1 || options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel threads must be in 1..1024, got ", options.threads));
  }
  Isa isa = BestIsa();
  if (options.isa) {
    isa = *options.isa;
  } else if (const char* env = std::getenv("ZSHARD_KERNELS_ISA"); env && *env) {
    auto parsed = ParseIsa(env);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZSHARD_KERNELS_ISA: ", parsed.status().message()));
    }
    isa = *parsed;
  }
  if (!IsaSupported(isa)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel ISA ", IsaName(isa), " is not supported by this CPU"));
  }
  std::unique_ptr<CpuKernels> k(new CpuKernels());
  k->isa_ = isa;
  k->threads_ = options.threads;
  k->min_parallel_ = std::max<size_t>(1, options.min_parallel_elements);
  k->table_ = TableFor(isa);
  k->pool_ = std::make_unique<KernelPool>(options.threads);
  return k;
}

CpuKernels::~CpuKernels() = default;

template <typename Fn>
int CpuKernels::Parallel(size_t n, size_t align, Fn&& fn) {
  const size_t want = (n + min_parallel_ - 1) / min_parallel_;
  const int parts = static_cast<int>(std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(threads_), want)));
  size_t chunk = (n + parts - 1) / parts;
  chunk = (chunk + align - 1) / align * align;
  std::function<void(int)> body = [&](int part) {
    const size_t begin = std::min(n, chunk * part);
    const size_t end = std::min(n, begin + chunk);
    fn(begin, end, part);
  };
  pool_->Run(parts, body);
  return parts;
}

absl::Status CpuKernels::AdamW(float* p, const float* g, float* m, float* v,
                               size_t n, const AdamWStep& hp, void* half_out) {
  if (n > 0 && (!p || !g || !m || !v ||
                (hp.half_type != HalfType::kNone && !half_out))) {
    return absl::InvalidArgumentError("AdamW: null buffer");
  }
  AdamWConstants c;
  absl::Status st = MakeAdamWConstants(hp, &c);
  if (!st.ok()) return st;
  auto* half = static_cast<uint16_t*>(half_out);
  Parallel(n, 64, [&](size_t b, size_t e, int) {
    table_->adamw(p + b, g + b, m + b, v + b, e - b, c, hp.half_type,
                  half ? half + b : nullptr);
  });
  return absl::OkStatus();
}

absl::Status CpuKernels::Fp32ToBf16(const float* in, uint16_t* out, size_t n) {
  absl::Status st = CastArgs(in, out, n);
  if (st.ok()) {
    Parallel(n, 64, [&](size_t b, size_t e, int) {
      table_->fp32_to_bf16(in + b, out + b, e - b);
    });
  }
  return st;
}

absl::Status CpuKernels::Bf16ToFp32(const uint16_t* in, float* out, size_t n) {
  absl::Status st = CastArgs(in, out, n);
  if (st.ok()) {
    Parallel(n, 64, [&](size_t b, size_t e, int) {
      table_->bf16_to_fp32(in + b, out + b, e - b);
    });
  }
  return st;
}

absl::Status CpuKernels::Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  absl::Status st = CastArgs(in, out, n);
  if (st.ok()) {
    Parallel(n, 64, [&](size_t b, size_t e, int) {
      table_->fp32_to_fp16(in + b, out + b, e - b);
    });
  }
  return st;
}

absl::Status CpuKernels::Fp16ToFp32(const uint16_t* in, float* out, size_t n) {
  absl::Status st = CastArgs(in, out, n);
  if (st.ok()) {
    Parallel(n, 64, [&](size_t b, size_t e, int) {
      table_->fp16_to_fp32(in + b, out + b, e - b);
    });
  }
  return st;
}

template <typename Out, typename Quant>
absl::Status CpuKernels::QuantizeBlocks(const float* in, size_t n, size_t block,
                                        Out* q, float* scales, Quant quant) {
  absl::Status st = CheckQuantizeArgs(in, q, scales, n, block);
  if (!st.ok()) return st;
  std::vector<size_t> bad(static_cast<size_t>(threads_), kAllFinite);
  Parallel(n, block, [&](size_t b, size_t e, int part) {
    const size_t r = quant(in + b, e - b, block, q + b, scales + b / block);
    if (r != kAllFinite) bad[part] = b / block + r;
  });
  const size_t first = *std::min_element(bad.begin(), bad.end());
  if (first == kAllFinite) return absl::OkStatus();
  return NonFiniteBlockError(first);
}

absl::Status CpuKernels::QuantizeInt8(const float* in, size_t n, size_t block,
                                      int8_t* q, float* scales) {
  return QuantizeBlocks(in, n, block, q, scales, table_->quantize_int8);
}

absl::Status CpuKernels::QuantizeFp8(const float* in, size_t n, size_t block,
                                     uint8_t* q, float* scales) {
  return QuantizeBlocks(in, n, block, q, scales, table_->quantize_fp8);
}

absl::Status CpuKernels::DequantizeInt8(const int8_t* q, const float* scales,
                                        size_t n, size_t block, float* out) {
  absl::Status st = CheckQuantizeArgs(q, scales, out, n, block);
  if (st.ok()) {
    Parallel(n, block, [&](size_t b, size_t e, int) {
      table_->dequantize_int8(q + b, scales + b / block, e - b, block, out + b);
    });
  }
  return st;
}

absl::Status CpuKernels::DequantizeFp8(const uint8_t* q, const float* scales,
                                       size_t n, size_t block, float* out) {
  absl::Status st = CheckQuantizeArgs(q, scales, out, n, block);
  if (st.ok()) {
    Parallel(n, block, [&](size_t b, size_t e, int) {
      table_->dequantize_fp8(q + b, scales + b / block, e - b, block, out + b);
    });
  }
  return st;
}

absl::StatusOr<GradCheckResult> CpuKernels::GradCheck(float* g, size_t n,
                                                      float scale) {
  if (n > 0 && !g) return absl::InvalidArgumentError("gradient check: null buffer");
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError("gradient check: non-finite scale");
  }
  std::vector<double> sums(static_cast<size_t>(threads_), 0.0);
  std::vector<char> bad(static_cast<size_t>(threads_), 0);
  Parallel(n, 64, [&](size_t b, size_t e, int part) {
    bool nf = false;
    table_->grad_check(g + b, e - b, scale, &sums[part], &nf);
    bad[part] = nf;
  });
  GradCheckResult r;
  for (size_t i = 0; i < sums.size(); ++i) {  // fixed order: same bits per run
    r.sum_squares += sums[i];
    r.non_finite |= bad[i] != 0;
  }
  return r;
}

absl::Status CpuKernels::Accumulate(float* sum, const float* x, size_t n) {
  if (n > 0 && (!sum || !x)) {
    return absl::InvalidArgumentError("accumulate: null buffer");
  }
  Parallel(n, 16, [&](size_t b, size_t e, int) {
    table_->add(sum + b, sum + b, x + b, e - b);
  });
  return absl::OkStatus();
}

absl::Status CpuKernels::Add(float* out, const float* a, const float* b,
                             size_t n) {
  if (n > 0 && (!out || !a || !b)) {
    return absl::InvalidArgumentError("add: null buffer");
  }
  Parallel(n, 16, [&](size_t lo, size_t hi, int) {
    table_->add(out + lo, a + lo, b + lo, hi - lo);
  });
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace zshard
