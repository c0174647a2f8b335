// Kernel throughput in GB/s of bytes actually read and written, for every
// kernel, variant and thread count, each next to its roofline: the fastest of
// a few loops over the same streams with trivial arithmetic, on the same
// number of threads. Prints the roofline loops, the kernel table, then
// exactly one last line:
//   RATIOS adamw_vs_roofline=X adamw_vs_scalar=X bf16_cast_vs_roofline=X
//          int8_quant_vs_roofline=X fp8_quant_vs_roofline=X adamw_2t_vs_1t=X
//          int8_dequant_vs_roofline=X fp8_dequant_vs_roofline=X
// (one thread unless named; the best variant this CPU has: the table the
// library dispatches to, which may borrow a kernel from a narrower
// instruction set where that ran faster).
//
// The table: each figure is the best of 20 short repetitions (0.05 s) run in
// random order, interleaved with the other benchmarks. Then the dispatched
// variant's kernels are timed again, one call at a time, each paired with
// one call of every roofline shape over its streams (--pairs=N pairs per
// shape, default 41, alternating which goes first); per kernel the shape
// with the lowest median ratio is listed, and the *_vs_roofline figures of
// the RATIOS line are those medians (adamw_2t_vs_1t too: two-thread calls
// paired with one-thread calls). Best-of-N favours the side with more
// samples, the roofline (N per shape, several shapes), and a shape that
// peaked once: on one quiet VM (2026-12-05) the best-of ratios of the two
// thread rows spanned 0.64 to 1.15 within one run, their paired medians
// 0.95 to 1.01; the one-thread figures of the two methods agreed within 0.06.
//
// Flags: --size=N elements (default 64M); --pairs=N; Google Benchmark's own
// flags pass through and override the defaults (e.g.
// --benchmark_repetitions=1, or --benchmark_filter=... to pair only what
// ran).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "zshard/kernels/cpu_kernels.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

constexpr size_t kBlock = 256;  // quantization block for the bench
// The quantizers find the maxima of 1024 values' worth of blocks, then
// encode them (kQuantGroup in kernels/cpu/quantize_groups.h).
constexpr size_t kGroup = 1024;

struct Buffers {
  size_t n = 0;
  float *p, *g, *m, *v, *out;
  uint16_t* half;
  int8_t* q8;
  uint8_t* f8;
  float* scales;
};

template <typename T>
T* Alloc(size_t n) {
  void* ptr = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
  if (!ptr) {
    std::fprintf(stderr, "kernels_bench: out of memory\n");
    std::exit(1);
  }
  return static_cast<T*>(ptr);
}

// Runs fn(begin, end) over `threads` parts: the caller takes part 0.
template <typename Fn>
void Split(size_t n, int threads, Fn fn) {
  const size_t chunk = ((n + threads - 1) / threads + 63) / 64 * 64;
  std::vector<std::thread> others;
  for (int t = 1; t < threads; ++t) {
    const size_t b = std::min(n, chunk * t), e = std::min(n, b + chunk);
    others.emplace_back([=] { fn(b, e); });
  }
  fn(0, std::min(n, chunk));
  for (auto& t : others) t.join();
}

// Rooflines: loops over the same streams as the kernels with trivial
// arithmetic. A kernel's roofline is the fastest of several such loops, since
// on these CPUs the shape of a memory-bound loop alone moves its speed by up
// to half (measured on the EPYC development VMs: a fp32->bf16 loop doing one
// 64-byte load per line ran at 15.8 GB/s, the bf16 kernel, whose compiled loop
// reads each line three times, at 25). Shapes:
//   plain   one vector of each stream per step;
//   unroll2 two vectors of each stream per step, loads first;
//   reread  every input vector loaded three times (what GCC emits for the
//           casts: memory operands on the shifts and adds);
//   prefetch plain, with a hint for each input stream's line 4 KiB ahead (as
//           the casts give; without it one core's single stream stayed below
//           what the hint reaches).
//   prefetch8k the same 8 KiB ahead, for the quantizers' streams (as the
//           quantizers give).
//   prefetchw prefetch, with a write hint for the output stream's line 4 KiB
//           ahead too (as the casts, quantizers and dequantizers give: the
//           output lines' reads for ownership start early; with it the
//           dequantizers went from ~1.0 to 1.17-1.41 of the other shapes).
//   block   for fp32 inputs, two passes over each run of kGroup elements (an
//           OR reduction, then the stores), as the quantizers do.
//   split2  the first and the second half as two streams, one vector of
//           each a step (as the dequantizers and the gradient check read:
//           one core's hardware prefetcher keeps more lines in flight over
//           two streams; a plain read ran 5-10% faster so);
//   split2w split2 with prefetchw's hints on its four streams.
//   split4  for the read, the four quarters as four streams, one vector of
//           each a step (as the AVX2 gradient check reads: one core read
//           64M floats 12-15% faster so than over two streams on the EPYC
//           development VM).
// Every shape writes values the kernels run later can take (finite fp32
// where a kernel reads it back).

// Keeps the compiler from merging or dropping loads around it.
#define ZS_FENCE() asm volatile("" ::: "memory")

using Part = std::function<void(size_t, size_t)>;
using Shapes = std::vector<std::pair<std::string, Part>>;
// Registers "roofline_<key>.<shape>" for each shape, over the streams named
// `streams` moving `bytes` a call.
using RoofCast = std::function<void(const std::string& key, const std::string& streams,
                                    double bytes, const Shapes& shapes)>;

// The loops for AVX-512: 16 lanes a step.
namespace avx512 {
#define ZS_ROOF_TARGET __attribute__((target("avx512f,avx512bw,prfchw")))
constexpr size_t kLanes = 16;
using VI = __m512i;
using VF = __m512;
ZS_ROOF_TARGET inline VF LoadF(const float* p) { return _mm512_loadu_ps(p); }
ZS_ROOF_TARGET inline void StoreF(float* p, VF v) { _mm512_storeu_ps(p, v); }
ZS_ROOF_TARGET inline VF MaxF(VF a, VF b) { return _mm512_max_ps(a, b); }
ZS_ROOF_TARGET inline VF AddF(VF a, VF b) { return _mm512_add_ps(a, b); }
ZS_ROOF_TARGET inline VF ZeroF() { return _mm512_setzero_ps(); }
ZS_ROOF_TARGET inline float Lane0(VF v) { return _mm512_cvtss_f32(v); }
ZS_ROOF_TARGET inline VI OrI(VI a, VI b) { return _mm512_or_si512(a, b); }
ZS_ROOF_TARGET inline VI AndI(VI a, VI b) { return _mm512_and_si512(a, b); }
ZS_ROOF_TARGET inline VI ZeroI() { return _mm512_setzero_si512(); }
struct F32ToU16 {
  using In = float;
  using Out = uint16_t;
  ZS_ROOF_TARGET static VI Load(const float* p) { return _mm512_loadu_si512(p); }
  ZS_ROOF_TARGET static void Store(uint16_t* p, VI v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
};
struct F32ToU8 {
  using In = float;
  using Out = uint8_t;
  ZS_ROOF_TARGET static VI Load(const float* p) { return _mm512_loadu_si512(p); }
  ZS_ROOF_TARGET static void Store(uint8_t* p, VI v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
  }
};
struct U16ToF32 {
  using In = uint16_t;
  using Out = float;
  ZS_ROOF_TARGET static VI Load(const uint16_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  ZS_ROOF_TARGET static void Store(float* p, VI v) { _mm512_storeu_si512(p, v); }
};
struct U8ToF32 {
  using In = uint8_t;
  using Out = float;
  ZS_ROOF_TARGET static VI Load(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ZS_ROOF_TARGET static void Store(float* p, VI v) { _mm512_storeu_si512(p, v); }
};
#include "roofline_loops.inc"
#undef ZS_ROOF_TARGET
}  // namespace avx512

// The same loops for AVX2 (CPUs without AVX-512: 8 lanes a step). The
// narrowing stores truncate each 32-bit lane, as AVX-512's do: a byte
// shuffle and a lane permute, two instructions a step.
namespace avx2 {
#define ZS_ROOF_TARGET __attribute__((target("avx2,prfchw")))
constexpr size_t kLanes = 8;
using VI = __m256i;
using VF = __m256;
ZS_ROOF_TARGET inline VF LoadF(const float* p) { return _mm256_loadu_ps(p); }
ZS_ROOF_TARGET inline void StoreF(float* p, VF v) { _mm256_storeu_ps(p, v); }
ZS_ROOF_TARGET inline VF MaxF(VF a, VF b) { return _mm256_max_ps(a, b); }
ZS_ROOF_TARGET inline VF AddF(VF a, VF b) { return _mm256_add_ps(a, b); }
ZS_ROOF_TARGET inline VF ZeroF() { return _mm256_setzero_ps(); }
ZS_ROOF_TARGET inline float Lane0(VF v) { return _mm256_cvtss_f32(v); }
ZS_ROOF_TARGET inline VI OrI(VI a, VI b) { return _mm256_or_si256(a, b); }
ZS_ROOF_TARGET inline VI AndI(VI a, VI b) { return _mm256_and_si256(a, b); }
ZS_ROOF_TARGET inline VI ZeroI() { return _mm256_setzero_si256(); }
// The low 16 bits of each of the 8 lanes, in order.
ZS_ROOF_TARGET inline __m128i Low16(VI v) {
  const VI pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                   0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08));
}
// The low 8 bits of each of the 8 lanes, in order (in the low 64 bits).
ZS_ROOF_TARGET inline __m128i Low8(VI v) {
  const VI pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                   0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const VI order = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  return _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, pick), order));
}
struct F32ToU16 {
  using In = float;
  using Out = uint16_t;
  ZS_ROOF_TARGET static VI Load(const float* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  ZS_ROOF_TARGET static void Store(uint16_t* p, VI v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Low16(v));
  }
};
struct F32ToU8 {
  using In = float;
  using Out = uint8_t;
  ZS_ROOF_TARGET static VI Load(const float* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  ZS_ROOF_TARGET static void Store(uint8_t* p, VI v) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), Low8(v));
  }
};
struct U16ToF32 {
  using In = uint16_t;
  using Out = float;
  ZS_ROOF_TARGET static VI Load(const uint16_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ZS_ROOF_TARGET static void Store(float* p, VI v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
};
struct U8ToF32 {
  using In = uint8_t;
  using Out = float;
  ZS_ROOF_TARGET static VI Load(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  ZS_ROOF_TARGET static void Store(float* p, VI v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
};
#include "roofline_loops.inc"
#undef ZS_ROOF_TARGET
}  // namespace avx2

void MustSucceed(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "kernels_bench: %s failed: %s\n", what,
                 std::string(st.message()).c_str());
    std::exit(1);
  }
}

struct Row {
  std::string kernel, variant, shape;
  int threads;
  std::function<void()> body;
};

// One call of `body`, in seconds.
double TimeOnce(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Paired {
  double p25, median, p75;
};

// Times `kernel` and `roof` back to back `pairs` times, alternating which
// goes first, and returns the quartiles of roof time / kernel time: the
// kernel's throughput over the roofline's (both move the same bytes), each
// pair measured within a few milliseconds so both see the same machine.
Paired PairedRatio(const std::function<void()>& kernel, const std::function<void()>& roof,
                   int pairs) {
  kernel();
  roof();
  std::vector<double> r;
  for (int i = 0; i < pairs; ++i) {
    double tk, tr;
    if (i % 2 == 0) {
      tk = TimeOnce(kernel);
      tr = TimeOnce(roof);
    } else {
      tr = TimeOnce(roof);
      tk = TimeOnce(kernel);
    }
    r.push_back(tr / tk);
  }
  std::sort(r.begin(), r.end());
  return {r[r.size() / 4], r[r.size() / 2], r[r.size() * 3 / 4]};
}

class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      auto it = r.counters.find("GB/s");
      if (it == r.counters.end()) continue;
      std::string name = r.benchmark_name();
      if (r.run_type == Run::RT_Aggregate) {
        if (r.aggregate_name != "max") continue;
        name.resize(name.size() - 4);  // "_max"
      }
      const std::string suffix = "/real_time";
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        name.resize(name.size() - suffix.size());
      }
      // The best repetition: the least disturbed by other tenants.
      gbps[name] = std::max(gbps[name], it->second.value);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> gbps;
};

}  // namespace
}  // namespace kernels
}  // namespace zshard

int main(int argc, char** argv) {
  using namespace zshard::kernels;
  size_t n = size_t{64} << 20;
  int pairs = 41;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--size=", 7) == 0) {
      char* end = nullptr;
      n = std::strtoull(argv[i] + 7, &end, 10) / 64 * 64;
      if (*end != '\0' || n == 0 || n > (size_t{1} << 32)) {
        std::fprintf(stderr, "kernels_bench: --size must be 64..2^32 elements, got '%s'\n",
                     argv[i] + 7);
        return 2;
      }
    } else if (std::strncmp(argv[i], "--pairs=", 8) == 0) {
      char* end = nullptr;
      const long v = std::strtol(argv[i] + 8, &end, 10);
      if (*end != '\0' || v < 1 || v > 100000) {
        std::fprintf(stderr, "kernels_bench: --pairs must be 1..100000, got '%s'\n", argv[i] + 8);
        return 2;
      }
      pairs = static_cast<int>(v);
    } else {
      rest.push_back(argv[i]);
    }
  }
  // Defaults, unless given: 20 repetitions of 0.05 s each, in random order,
  // so every kernel and its roofline see the same machine conditions.
  static char reps[] = "--benchmark_repetitions=20";
  static char interleave[] = "--benchmark_enable_random_interleaving=true";
  static char min_time[] = "--benchmark_min_time=0.05";
  static char only_aggregates[] = "--benchmark_display_aggregates_only=true";
  auto given = [&](const char* prefix) {
    for (char* a : rest) {
      if (std::strncmp(a, prefix, std::strlen(prefix)) == 0) return true;
    }
    return false;
  };
  if (!given("--benchmark_repetitions")) rest.push_back(reps);
  if (!given("--benchmark_enable_random_interleaving")) rest.push_back(interleave);
  if (!given("--benchmark_min_time")) rest.push_back(min_time);
  if (!given("--benchmark_display_aggregates_only")) rest.push_back(only_aggregates);
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  // The rooflines use the widest of AVX-512 and AVX2 this CPU has.
  if (!IsaSupported(Isa::kAvx2)) {
    // Exit 77: ctest reports the smoke run as skipped on such CPUs.
    std::fprintf(stderr, "kernels_bench: the rooflines need AVX2, which this CPU lacks\n");
    return 77;
  }
  const std::string roof_isa = IsaSupported(Isa::kAvx512) ? "avx512" : "avx2";

  Buffers b;
  b.n = n;
  b.p = Alloc<float>(n), b.g = Alloc<float>(n), b.m = Alloc<float>(n);
  b.v = Alloc<float>(n), b.out = Alloc<float>(n);
  b.half = Alloc<uint16_t>(n), b.q8 = Alloc<int8_t>(n), b.f8 = Alloc<uint8_t>(n);
  b.scales = Alloc<float>(NumBlocks(n, kBlock));
  // Touch everything once (first touch is slow here) with sane values.
  for (size_t i = 0; i < n; ++i) {
    b.p[i] = 0.01f * static_cast<float>(i % 1000);
    b.g[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 77) - 38);
    b.m[i] = 0;
    b.v[i] = 0;
    b.out[i] = 0;
    b.half[i] = 0;
    b.q8[i] = 0;
    b.f8[i] = 0;
  }
  std::memset(b.scales, 0, NumBlocks(n, kBlock) * sizeof(float));

  std::vector<Isa> variants;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) variants.push_back(isa);
  }
  const Isa best = variants.back();
  std::map<std::string, std::unique_ptr<CpuKernels>> kernels;
  std::vector<Row> rows;
  const double nd = static_cast<double>(n);
  auto add = [&](const std::string& kernel, const std::string& variant,
                 const std::string& shape, int threads, double bytes,
                 std::function<void()> body) {
    const std::string name = kernel + "/" + variant + "/" + std::to_string(threads) + "t";
    benchmark::RegisterBenchmark(name.c_str(), [body, bytes](benchmark::State& st) {
      for (auto _ : st) body();
      st.counters["GB/s"] = benchmark::Counter(
          bytes * static_cast<double>(st.iterations()) / 1e9, benchmark::Counter::kIsRate);
    })->Unit(benchmark::kMillisecond)->UseRealTime()
        ->ComputeStatistics("max", [](const std::vector<double>& v) {
          return *std::max_element(v.begin(), v.end());
        });
    rows.push_back({kernel, variant, shape, threads, body});
  };
  for (int threads : {1, 2}) {
    for (Isa isa : variants) {
      CpuKernelsOptions o;
      o.isa = isa;
      o.threads = threads;
      const std::string key = std::string(IsaName(isa)) + std::to_string(threads);
      kernels[key] = std::move(*CpuKernels::Create(o));
      CpuKernels* k = kernels[key].get();
      const std::string var = IsaName(isa);
      int step = 0;
      add("adamw", var, "4r3w fp32", threads, 28 * nd, [k, &b, step]() mutable {
        AdamWStep hp;
        hp.step = ++step;
        MustSucceed(k->AdamW(b.p, b.g, b.m, b.v, b.n, hp), "AdamW");
      });
      add("fp32_to_bf16", var, "f32->16", threads, 6 * nd,
          [k, &b] { MustSucceed(k->Fp32ToBf16(b.p, b.half, b.n), "Fp32ToBf16"); });
      add("bf16_to_fp32", var, "16->f32", threads, 6 * nd,
          [k, &b] { MustSucceed(k->Bf16ToFp32(b.half, b.out, b.n), "Bf16ToFp32"); });
      add("fp32_to_fp16", var, "f32->16", threads, 6 * nd,
          [k, &b] { MustSucceed(k->Fp32ToFp16(b.p, b.half, b.n), "Fp32ToFp16"); });
      add("fp16_to_fp32", var, "16->f32", threads, 6 * nd,
          [k, &b] { MustSucceed(k->Fp16ToFp32(b.half, b.out, b.n), "Fp16ToFp32"); });
      add("int8_quant", var, "f32->8", threads, 5 * nd + 4 * nd / kBlock,
          [k, &b] { MustSucceed(k->QuantizeInt8(b.p, b.n, kBlock, b.q8, b.scales), "QuantizeInt8"); });
      add("int8_dequant", var, "8->f32", threads, 5 * nd + 4 * nd / kBlock,
          [k, &b] { MustSucceed(k->DequantizeInt8(b.q8, b.scales, b.n, kBlock, b.out), "DequantizeInt8"); });
      add("fp8_quant", var, "f32->8", threads, 5 * nd + 4 * nd / kBlock,
          [k, &b] { MustSucceed(k->QuantizeFp8(b.p, b.n, kBlock, b.f8, b.scales), "QuantizeFp8"); });
      add("fp8_dequant", var, "8->f32", threads, 5 * nd + 4 * nd / kBlock,
          [k, &b] { MustSucceed(k->DequantizeFp8(b.f8, b.scales, b.n, kBlock, b.out), "DequantizeFp8"); });
      add("grad_check", var, "f32 read", threads, 4 * nd,
          [k, &b] { MustSucceed(k->GradCheck(b.g, b.n, 1.0f).status(), "GradCheck"); });
    }
    // The rooflines, each shape its own benchmark; a kernel is compared
    // with the fastest shape over its streams.
    RoofCast roof_cast = [&](const std::string& key, const std::string& streams, double bytes,
                             const Shapes& shapes) {
      for (const auto& [name, part] : shapes) {
        add("roofline_" + key + "." + name, roof_isa, streams, threads, bytes,
            [&b, threads, part = part] { Split(b.n, threads, part); });
      }
    };
    if (IsaSupported(Isa::kAvx512)) {
      avx512::AddRooflines(b, nd, roof_cast);
    } else {
      avx2::AddRooflines(b, nd, roof_cast);
    }
  }

  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();

  auto gbps = [&](const std::string& kernel, const std::string& variant, int t) {
    auto it = collector.gbps.find(kernel + "/" + variant + "/" + std::to_string(t) + "t");
    return it == collector.gbps.end() ? 0.0 : it->second;
  };
  // Each stream set's roofline: its fastest shape.
  std::map<std::pair<std::string, int>, double> roof;
  std::map<std::pair<std::string, int>, std::string> roof_shape;
  std::printf("\n%-10s %7s %-9s %9s\n", "roofline", "threads", "shape", "GB/s");
  for (const Row& r : rows) {
    if (r.kernel.rfind("roofline", 0) != 0) continue;
    const double g = gbps(r.kernel, r.variant, r.threads);
    const std::string shape = r.kernel.substr(r.kernel.find('.') + 1);
    std::printf("%-10s %7d %-9s %9.2f\n", r.shape.c_str(), r.threads, shape.c_str(), g);
    if (g > roof[{r.shape, r.threads}]) {
      roof[{r.shape, r.threads}] = g;
      roof_shape[{r.shape, r.threads}] = shape;
    }
  }
  std::printf("\n%-14s %-8s %-10s %7s %9s %12s %-8s %9s\n", "kernel", "variant", "streams",
              "threads", "GB/s", "roofline", "(shape)", "ratio");
  for (const Row& r : rows) {
    if (r.kernel.rfind("roofline", 0) == 0) continue;
    const double g = gbps(r.kernel, r.variant, r.threads);
    const double rf = roof[{r.shape, r.threads}];
    std::printf("%-14s %-8s %-10s %7d %9.2f %12.2f %-8s %9.3f\n", r.kernel.c_str(),
                r.variant.c_str(), r.shape.c_str(), r.threads, g, rf,
                roof_shape[{r.shape, r.threads}].c_str(), rf > 0 ? g / rf : 0.0);
  }
  const std::string bv = IsaName(best);
  // The dispatched kernels again, each paired with every roofline shape over
  // its streams; the lowest shape's median ratio counts. Best-of-N above
  // favours whichever side has more samples (the roofline has N per shape
  // and several shapes) and the shape that peaked once; the paired median
  // against every shape favours neither.
  std::map<std::pair<std::string, int>, double> paired;
  std::printf("\npaired with each roofline shape, %d pairs back to back; the lowest median\n",
              pairs);
  std::printf("%-14s %-8s %7s %-10s %7s %7s %7s\n", "kernel", "variant", "threads", "shape",
              "p25", "median", "p75");
  for (const Row& r : rows) {
    if (r.kernel.rfind("roofline", 0) == 0 || r.variant != bv ||
        gbps(r.kernel, r.variant, r.threads) <= 0) {
      continue;  // not the dispatched variant, or filtered out
    }
    Paired worst{0, 0, 0};
    std::string worst_shape;
    for (const Row& rr : rows) {
      if (rr.kernel.rfind("roofline", 0) != 0 || rr.shape != r.shape ||
          rr.threads != r.threads || gbps(rr.kernel, rr.variant, rr.threads) <= 0) {
        continue;
      }
      const Paired q = PairedRatio(r.body, rr.body, pairs);
      if (worst_shape.empty() || q.median < worst.median) {
        worst = q;
        worst_shape = rr.kernel.substr(rr.kernel.find('.') + 1);
      }
    }
    if (worst_shape.empty()) continue;
    paired[{r.kernel, r.threads}] = worst.median;
    std::printf("%-14s %-8s %7d %-10s %7.3f %7.3f %7.3f\n", r.kernel.c_str(), r.variant.c_str(),
                r.threads, worst_shape.c_str(), worst.p25, worst.median, worst.p75);
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("elements %zu, best variant %s, quantization block %zu\n", n, bv.c_str(), kBlock);
  // What two threads give over one, paired as above: AdamW's, and the
  // machine's (the 4r3w roofline's plain shape), which AdamW's cannot beat.
  auto find_row = [&](const std::string& kernel, const std::string& variant, int t) {
    const Row* found = nullptr;
    for (const Row& r : rows) {
      if (r.kernel == kernel && r.variant == variant && r.threads == t &&
          gbps(kernel, variant, t) > 0) {
        found = &r;
      }
    }
    return found;
  };
  auto two_vs_one = [&](const std::string& kernel, const std::string& variant) {
    const Row* one = find_row(kernel, variant, 1);
    const Row* two = find_row(kernel, variant, 2);
    return one && two ? PairedRatio(two->body, one->body, pairs).median : 0.0;
  };
  const double adamw_2t_vs_1t = two_vs_one("adamw", bv);
  std::printf("two threads / one, paired medians: adamw %.3f, machine (4r3w plain) %.3f\n",
              adamw_2t_vs_1t, two_vs_one("roofline_4r3w.plain", roof_isa));
  auto med = [&](const std::string& kernel, int t) {
    auto it = paired.find({kernel, t});
    return it == paired.end() ? 0.0 : it->second;
  };
  const char* kOfInterest[] = {"adamw",      "fp32_to_bf16", "int8_quant", "fp8_quant",
                               "int8_dequant", "fp8_dequant", "grad_check"};
  for (int t : {1, 2}) {
    std::printf("paired medians, %d thread%s:", t, t > 1 ? "s" : "");
    for (const char* k : kOfInterest) std::printf(" %s=%.3f", k, med(k, t));
    std::printf("\n");
  }
  std::printf(
      "RATIOS adamw_vs_roofline=%.3f adamw_vs_scalar=%.3f bf16_cast_vs_roofline=%.3f "
      "int8_quant_vs_roofline=%.3f fp8_quant_vs_roofline=%.3f adamw_2t_vs_1t=%.3f "
      "int8_dequant_vs_roofline=%.3f fp8_dequant_vs_roofline=%.3f\n",
      med("adamw", 1), ratio(gbps("adamw", bv, 1), gbps("adamw", "scalar", 1)),
      med("fp32_to_bf16", 1), med("int8_quant", 1), med("fp8_quant", 1),
      adamw_2t_vs_1t, med("int8_dequant", 1),
      med("fp8_dequant", 1));
  return 0;
}
