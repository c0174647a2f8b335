// Kernel throughput in GB/s of bytes actually read and written, for every
// kernel, variant and thread count, each next to its roofline: a loop over
// the same streams with trivial arithmetic, on the same number of threads.
// Prints a table, then exactly one last line:
//   RATIOS adamw_vs_roofline=X adamw_vs_scalar=X bf16_cast_vs_roofline=X
//          int8_quant_vs_roofline=X fp8_quant_vs_roofline=X adamw_2t_vs_1t=X
// (one thread unless named; the best variant this CPU has).
//
// Each figure is the best of 5 repetitions run in random order (interleaved
// with the other benchmarks), so a kernel and its roofline see the same
// conditions on a shared machine.
//
// Flags: --size=N elements (default 64M); Google Benchmark's own flags pass
// through and override the defaults (e.g. --benchmark_repetitions=1).
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Rooflines: the same streams as the kernels, trivial arithmetic.
__attribute__((target("avx512f"))) void RoofAdamW512(float* p, const float* g,
                                                     float* m, float* v, size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    // max keeps every value finite (and v >= 0) for the kernels run later.
    _mm512_storeu_ps(p + i, _mm512_max_ps(_mm512_loadu_ps(p + i), gi));
    _mm512_storeu_ps(m + i, _mm512_max_ps(_mm512_loadu_ps(m + i), gi));
    _mm512_storeu_ps(v + i, _mm512_max_ps(_mm512_loadu_ps(v + i), gi));
  }
}
// The narrowing/widening rooflines access memory as the kernels do (one
// vector of fp32 and the matching narrower vector per step) but convert
// nothing: they keep the low bytes.
__attribute__((target("avx512f"))) void RoofF32ToU16(const float* in, uint16_t* out,
                                                     size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_castsi512_si256(_mm512_loadu_si512(in + i)));
  }
}
__attribute__((target("avx512f"))) void RoofU16ToF32(const uint16_t* in, float* out,
                                                     size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm512_storeu_si512(out + i, _mm512_castsi256_si512(_mm256_loadu_si256(
                                     reinterpret_cast<const __m256i*>(in + i))));
  }
}
__attribute__((target("avx512f"))) void RoofF32ToU8(const float* in, uint8_t* out,
                                                    size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm512_castsi512_si128(_mm512_loadu_si512(in + i)));
  }
}
__attribute__((target("avx512f"))) void RoofU8ToF32(const uint8_t* in, float* out,
                                                    size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm512_storeu_si512(out + i, _mm512_castsi128_si512(
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
}
__attribute__((target("avx512f"))) float RoofRead(const float* in, size_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t i = 0; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(in + i));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  return lanes[0];
}

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
  double gbps;
};

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
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--size=", 7) == 0) {
      n = std::strtoull(argv[i] + 7, nullptr, 10) / 64 * 64;
    } else {
      rest.push_back(argv[i]);
    }
  }
  // Defaults, unless given: 5 repetitions of 0.2 s each, in random order,
  // so every kernel and its roofline see the same machine conditions.
  static char reps[] = "--benchmark_repetitions=5";
  static char interleave[] = "--benchmark_enable_random_interleaving=true";
  static char min_time[] = "--benchmark_min_time=0.2";
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
  if (!IsaSupported(Isa::kAvx512)) {
    std::fprintf(stderr, "kernels_bench: the rooflines need AVX-512\n");
    return 1;
  }

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
    rows.push_back({kernel, variant, shape, threads, 0});
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
    add("roofline_4r3w", "avx512", "4r3w fp32", threads, 28 * nd, [&b, threads] {
      Split(b.n, threads, [&b](size_t lo, size_t hi) {
        RoofAdamW512(b.p + lo, b.g + lo, b.m + lo, b.v + lo, hi - lo);
      });
    });
    add("roofline_f32_to_16", "avx512", "f32->16", threads, 6 * nd, [&b, threads] {
      Split(b.n, threads, [&b](size_t lo, size_t hi) {
        RoofF32ToU16(b.p + lo, b.half + lo, hi - lo);
      });
    });
    add("roofline_16_to_f32", "avx512", "16->f32", threads, 6 * nd, [&b, threads] {
      Split(b.n, threads, [&b](size_t lo, size_t hi) {
        RoofU16ToF32(b.half + lo, b.out + lo, hi - lo);
      });
    });
    add("roofline_f32_to_8", "avx512", "f32->8", threads, 5 * nd + 4 * nd / kBlock, [&b, threads] {
      Split(b.n, threads, [&b](size_t lo, size_t hi) {
        RoofF32ToU8(b.p + lo, b.f8 + lo, hi - lo);
      });
    });
    add("roofline_8_to_f32", "avx512", "8->f32", threads, 5 * nd + 4 * nd / kBlock, [&b, threads] {
      Split(b.n, threads, [&b](size_t lo, size_t hi) {
        RoofU8ToF32(b.f8 + lo, b.out + lo, hi - lo);
      });
    });
    add("roofline_read", "avx512", "f32 read", threads, 4 * nd, [&b, threads] {
      Split(b.n, threads, [&b](size_t lo, size_t hi) {
        benchmark::DoNotOptimize(RoofRead(b.g + lo, hi - lo));
      });
    });
  }

  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();

  auto gbps = [&](const std::string& kernel, const std::string& variant, int t) {
    auto it = collector.gbps.find(kernel + "/" + variant + "/" + std::to_string(t) + "t");
    return it == collector.gbps.end() ? 0.0 : it->second;
  };
  std::map<std::pair<std::string, int>, double> roof;
  for (const Row& r : rows) {
    if (r.kernel.rfind("roofline", 0) == 0) {
      roof[{r.shape, r.threads}] = gbps(r.kernel, r.variant, r.threads);
    }
  }
  std::printf("\n%-14s %-8s %-10s %7s %9s %12s %9s\n", "kernel", "variant", "streams",
              "threads", "GB/s", "roofline", "ratio");
  for (const Row& r : rows) {
    if (r.kernel.rfind("roofline", 0) == 0) continue;
    const double g = gbps(r.kernel, r.variant, r.threads);
    const double rf = roof[{r.shape, r.threads}];
    std::printf("%-14s %-8s %-10s %7d %9.2f %12.2f %9.3f\n", r.kernel.c_str(),
                r.variant.c_str(), r.shape.c_str(), r.threads, g, rf,
                rf > 0 ? g / rf : 0.0);
  }
  const std::string bv = IsaName(best);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("elements %zu, best variant %s, quantization block %zu\n", n, bv.c_str(), kBlock);
  std::printf(
      "RATIOS adamw_vs_roofline=%.3f adamw_vs_scalar=%.3f bf16_cast_vs_roofline=%.3f "
      "int8_quant_vs_roofline=%.3f fp8_quant_vs_roofline=%.3f adamw_2t_vs_1t=%.3f\n",
      ratio(gbps("adamw", bv, 1), roof[{"4r3w fp32", 1}]),
      ratio(gbps("adamw", bv, 1), gbps("adamw", "scalar", 1)),
      ratio(gbps("fp32_to_bf16", bv, 1), roof[{"f32->16", 1}]),
      ratio(gbps("int8_quant", bv, 1), roof[{"f32->8", 1}]),
      ratio(gbps("fp8_quant", bv, 1), roof[{"f32->8", 1}]),
      ratio(gbps("adamw", bv, 2), gbps("adamw", bv, 1)));
  return 0;
}
