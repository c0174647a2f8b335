// Trainer clients against real shard servers on 127.0.0.1 (in one process):
// the full fetch / push / reduce / AdamW cycle, compared with an in-memory
// reference, plus the residency bound and prefetching.
#include "client/core/trainer_client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/transport/inline/inline_transport.h"
#include "common/transport/transport_factory.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/in_process_shards.h"
#include "tests/test_models.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/cpu_kernels.h"

namespace zshard {
namespace {

using testing::InitValue;
using testing::MakeSpec;

constexpr uint32_t kShards = 3;
constexpr uint32_t kTrainers = 2;
constexpr int kSteps = 4;

// A deterministic "gradient" of the parameters a trainer saw.
float FakeGrad(float p, uint32_t rank, uint64_t step, uint64_t i) {
  return std::sin(p * static_cast<float>(rank + 1) + 0.001f * i) +
         0.01f * static_cast<float>(step);
}

// The data planes a suite runs over: every transport built. A transport
// that is not built is skipped.
const std::vector<std::string> kDataPlanes = {"inline", "ucx"};

bool Built(const std::string& plane) {
  return plane != "ucx" || DefaultTransportName() == "ucx";
}

class TrainerClientTest : public ::testing::Test {
 protected:
  // The data plane of this test ("inline", "ucx").
  virtual std::string Plane() const { return "inline"; }

  void SetUp() override {
    if (!Built(Plane())) GTEST_SKIP() << Plane() << " is not built";
    options_template_.cache.prefetch_bytes = 5000 * sizeof(float);
    StartServers(false);
  }

  void StartServers(bool sum_only, WireFormat quantized = WireFormat()) {
    servers_.clear();
    spec_ = MakeSpec({{100}, {3000, 2000}, {3000}, {5000}, {150, 50}});
    ShardServerOptions o;
    o.service.store.alignment = 8;
    o.service.store.persistence_threshold = 1000;
    o.service.store.world_size = trainers_;
    o.service.store.adamw.lr = 0.01;
    o.service.store.sum_only = sum_only;
    o.service.store.quantized_parameters = quantized;
    o.service.store.quantized_gradients = quantized;
    o.service.store.landing_slots = landing_slots_;
    o.trainer_timeout = trainer_timeout_;
    o.service.wait_timeout = absl::Seconds(20);
    o.transport = Plane();
    auto servers = testing::StartShards(o, shards_);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
  }

  TrainerClientOptions ClientOptions(int rank, uint32_t stage = 3) {
    TrainerClientOptions o = options_template_;
    o.stage = stage;
    o.reduce_bucket_bytes = 1000 * sizeof(float);
    o.adamw.lr = 0.01;
    o.cluster.coordinator = servers_[0]->endpoint();
    o.cluster.requested_rank = rank;
    o.cluster.connect_timeout = absl::Seconds(20);
    o.cache.rpc_timeout = absl::Seconds(20);
    o.push.rpc_timeout = absl::Seconds(20);
    return o;
  }

  // Trainer `rank` of the test's cluster, its model initialized by Init.
  absl::StatusOr<std::unique_ptr<TrainerClient>> ConnectRank(
      int rank, uint32_t stage = 3) {
    return TrainerClient::Connect(
        ClientOptions(rank, stage), spec_,
        [this](size_t g, float* out) { return Init(spec_, g, out); });
  }

  static absl::Status Init(const v1::ModelSpec& spec, size_t g, float* out) {
    uint64_t n = 0;
    for (const auto& t : spec.groups(static_cast<int>(g)).tensors()) {
      n += static_cast<uint64_t>(t.shape(0));
    }
    for (uint64_t i = 0; i < n; ++i) out[i] = InitValue(g, i);
    return absl::OkStatus();
  }

  // One trainer: forward in order, backward in reverse, pushing each group.
  // With `shuffle`, each step visits the groups in a different order (a
  // dynamic model): the prefetch plan is wrong every time.
  void Train(int rank, std::vector<std::vector<float>>* final_params,
             TrainerClientStats* stats, bool shuffle = false,
             uint32_t stage = 3,
             std::vector<uint64_t>* leases_per_step = nullptr) {
    auto client = ConnectRank(rank, stage);
    ASSERT_TRUE(client.ok()) << client.status();
    TrainerClient& c = **client;
    const size_t groups = c.map().num_groups();
    for (int step = 0; step < kSteps; ++step) {
      // Leases are transport calls (no gRPC Lease).
      const uint64_t leases_before = c.transport_call_counts()["Lease"];
      std::vector<size_t> order(groups);
      for (size_t g = 0; g < groups; ++g) order[g] = g;
      if (shuffle) {
        std::mt19937 rng(static_cast<uint32_t>(step * 7 + rank));
        std::shuffle(order.begin(), order.end(), rng);
      }
      for (size_t g : order) {
        ASSERT_TRUE(c.Acquire(g).ok());
        ASSERT_TRUE(c.Release(g).ok());
      }
      for (size_t k = groups; k-- > 0;) {
        const size_t g = order[k];
        auto p = c.Acquire(g);
        ASSERT_TRUE(p.ok()) << p.status();
        const float* values = static_cast<const float*>(*p);
        std::vector<float> own(c.map().group_numel(g));
        float* grad = own.data();
        if (lend_) {
          grad = static_cast<float*>(c.GradientBuffer(g));
          ASSERT_NE(grad, nullptr);
          ASSERT_EQ(c.GradientBuffer(g), grad);  // until pushed
        }
        for (size_t i = 0; i < own.size(); ++i) {
          grad[i] = FakeGrad(values[i], c.rank(), c.step(), i);
        }
        ASSERT_TRUE(c.Release(g).ok());
        ASSERT_TRUE(c.PushGradient(g, grad, 0).ok());
      }
      ASSERT_TRUE(c.EndStep().ok());
      if (leases_per_step) {
        leases_per_step->push_back(c.transport_call_counts()["Lease"] -
                                   leases_before);
        EXPECT_EQ(c.rpc_counts()["Lease"], 0u);
      }
    }
    for (size_t g = 0; g < groups; ++g) {
      auto p = c.Acquire(g);
      ASSERT_TRUE(p.ok()) << p.status();
      const float* values = static_cast<const float*>(*p);
      final_params->emplace_back(values, values + c.map().group_numel(g));
      ASSERT_TRUE(c.Release(g).ok());
    }
    *stats = c.stats();
    // Every rank's thread of TrainAll gets here.
    absl::MutexLock lock(&map_mu_);
    map_ = std::make_unique<PartitionMap>(c.map());
  }

  // Train() on every rank at once (trainers_ of them).
  void TrainAll(std::vector<std::vector<float>>* finals,
                TrainerClientStats* stats) {
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < trainers_; ++r) {
      threads.emplace_back(
          [&, r] { Train(static_cast<int>(r), &finals[r], &stats[r]); });
    }
    for (auto& t : threads) t.join();
  }

  // The servers' AdamW of step `step` (lr 0.01, the ranks' sum averaged)
  // on in-memory state.
  absl::Status ReferenceStep(int step, std::vector<float>* p,
                             std::vector<float>* sum, std::vector<float>* m,
                             std::vector<float>* v) const {
    kernels::AdamWStep hp;
    hp.lr = 0.01f;
    hp.step = step + 1;
    hp.grad_scale = 1.0f / static_cast<float>(trainers_);
    return kernels::ReferenceAdamW(p->data(), sum->data(), m->data(),
                                   v->data(), p->size(), hp);
  }

  // The same gradients summed in rank order, the same AdamW, in memory.
  void ExpectReference(const std::vector<std::vector<float>>* finals) {
    const size_t groups = static_cast<size_t>(spec_.groups_size());
    for (size_t g = 0; g < groups; ++g) {
      size_t n = 0;
      for (const auto& t : spec_.groups(static_cast<int>(g)).tensors()) {
        n += static_cast<size_t>(t.shape(0));
      }
      std::vector<float> p(n), m(n, 0), v(n, 0), sum(n);
      ASSERT_TRUE(Init(spec_, g, p.data()).ok());
      for (int step = 0; step < kSteps; ++step) {
        for (size_t i = 0; i < n; ++i) {
          sum[i] = FakeGrad(p[i], 0, step, i);
          for (uint32_t r = 1; r < trainers_; ++r) {
            sum[i] += FakeGrad(p[i], r, step, i);
          }
        }
        ASSERT_TRUE(ReferenceStep(step, &p, &sum, &m, &v).ok());
      }
      for (uint32_t r = 0; r < trainers_; ++r) {
        ASSERT_EQ(finals[r][g], p) << "group " << g << " rank " << r;
      }
    }
  }

  // What a trainer sees of a shard's slice published in `wire`: each
  // slice quantized on its own (blocks from its start), then decoded.
  static void ThroughWire(const WireFormat& wire, const PartitionMap& map,
                          size_t g, bool compact, std::vector<float>* values) {
    auto k = kernels::CpuKernels::Create();
    ASSERT_TRUE(k.ok());
    for (uint32_t s = 0; s < map.num_shards(); ++s) {
      const Slice sl = compact ? map.compact_slice(g, s) : map.slice(g, s);
      std::vector<char> bytes(wire.Bytes(sl.size()));
      ASSERT_TRUE(PackQuantized(**k, wire, values->data() + sl.begin,
                                sl.size(), bytes.data())
                      .ok());
      ASSERT_TRUE(UnpackQuantized(**k, wire, bytes.data(), sl.size(),
                                  values->data() + sl.begin)
                      .ok());
    }
  }

  // ExpectReference with quantized transfers: the trainers compute on the
  // decoded published values, and the shards sum the decoded gradients in
  // rank order; the master weights stay fp32.
  void ExpectQuantizedReference(const std::vector<std::vector<float>>* finals,
                                const WireFormat& wire) {
    const PartitionMap& map = *map_;
    for (size_t g = 0; g < map.num_groups(); ++g) {
      const size_t n = map.group_numel(g);
      std::vector<float> p(n), seen, m(n, 0), v(n, 0), sum(n), grad(n);
      ASSERT_TRUE(Init(spec_, g, p.data()).ok());
      for (int step = 0; step < kSteps; ++step) {
        seen = p;
        ThroughWire(wire, map, g, false, &seen);
        for (uint32_t r = 0; r < kTrainers; ++r) {
          for (size_t i = 0; i < n; ++i) grad[i] = FakeGrad(seen[i], r, step, i);
          ThroughWire(wire, map, g, true, &grad);
          for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? grad[i] : sum[i] + grad[i];
        }
        ASSERT_TRUE(ReferenceStep(step, &p, &sum, &m, &v).ok());
      }
      seen = p;
      ThroughWire(wire, map, g, false, &seen);
      for (uint32_t r = 0; r < kTrainers; ++r) {
        ASSERT_EQ(finals[r][g], seen) << "group " << g << " rank " << r;
      }
    }
  }

  uint32_t trainers_ = kTrainers;
  uint32_t shards_ = kShards;
  uint32_t landing_slots_ = 4;  // each shard's --landing_slots
  bool lend_ = false;  // Train() writes gradients into GradientBuffer's
  absl::Duration trainer_timeout_ = absl::Seconds(10);  // shard 0's
  v1::ModelSpec spec_;
  // The last trainer's: written under map_mu_ by the trainers' threads,
  // read once they are joined.
  absl::Mutex map_mu_;
  std::unique_ptr<PartitionMap> map_;
  std::vector<std::unique_ptr<ShardServer>> servers_;
  TrainerClientOptions options_template_;
};

class TrainerClientOrderTest
    : public TrainerClientTest,
      public ::testing::WithParamInterface<std::tuple<bool, std::string>> {
 protected:
  std::string Plane() const override { return std::get<1>(GetParam()); }
};

TEST_P(TrainerClientOrderTest, TwoTrainersMatchTheInMemoryReference) {
  std::vector<std::vector<float>> finals[kTrainers];
  TrainerClientStats stats[kTrainers];
  std::vector<std::thread> threads;
  const bool shuffle = std::get<0>(GetParam());
  for (uint32_t r = 0; r < kTrainers; ++r) {
    threads.emplace_back(
        [&, r] { Train(static_cast<int>(r), &finals[r], &stats[r], shuffle); });
  }
  for (auto& t : threads) t.join();
  if (HasFatalFailure()) return;

  ExpectReference(finals);
  if (HasFatalFailure()) return;
  // A trainer (re)joining between steps continues at the servers' version.
  auto rejoined = ConnectRank(1);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ((*rejoined)->step(), static_cast<uint64_t>(kSteps));
  for (uint32_t r = 0; r < kTrainers; ++r) {
    EXPECT_LE(stats[r].params.peak_resident_bytes, stats[r].resident_bound);
    if (!shuffle) {
      EXPECT_GT(stats[r].params.prefetch_hits, 0u);
    }
    EXPECT_GT(stats[r].grads.bytes_pushed, 0u);
    // Never the whole model: 13300 floats in all.
    EXPECT_LT(stats[r].params.peak_resident_bytes, 13300u * sizeof(float));
  }
}

INSTANTIATE_TEST_SUITE_P(
    FixedAndChangingGroupOrder, TrainerClientOrderTest,
    ::testing::Combine(::testing::Bool(), ::testing::ValuesIn(kDataPlanes)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "Changing" : "Fixed") + "_" +
             std::get<1>(info.param);
    });

// ZeRO stages 0-3 over the same servers (stage 0: servers only sum): the
// same parameters after every step, and residency by kind as ZeRO predicts.
class TrainerClientStageTest
    : public TrainerClientTest,
      public ::testing::WithParamInterface<std::tuple<uint32_t, std::string>> {
 protected:
  std::string Plane() const override { return std::get<1>(GetParam()); }
};

TEST_P(TrainerClientStageTest, SameParametersDifferentResidency) {
  const uint32_t stage = std::get<0>(GetParam());
  if (stage == 0) StartServers(/*sum_only=*/true);
  std::vector<std::vector<float>> finals[kTrainers];
  TrainerClientStats stats[kTrainers];
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    threads.emplace_back([&, r] {
      Train(static_cast<int>(r), &finals[r], &stats[r], false, stage);
    });
  }
  for (auto& t : threads) t.join();
  if (HasFatalFailure()) return;
  ExpectReference(finals);
  const uint64_t model = 13300 * sizeof(float), group = 5000 * sizeof(float);
  for (uint32_t r = 0; r < kTrainers; ++r) {
    const auto& s = stats[r];
    switch (stage) {
      case 0:
        EXPECT_EQ(s.param_bytes, model);
        EXPECT_EQ(s.optimizer_bytes, 2 * model);
        EXPECT_LE(s.grad_bytes, 4 * group);
        break;
      case 1:
        EXPECT_EQ(s.param_bytes, model);
        EXPECT_EQ(s.grad_bytes, model);  // every gradient held to the end
        break;
      case 2:
        EXPECT_EQ(s.param_bytes, model);
        EXPECT_LT(s.grad_bytes, model);
        // One bucket filling, one in flight: each the bucket plus a group.
        EXPECT_LE(s.grad_bytes, 2 * (1000 * sizeof(float) + group));
        break;
      case 3:
        EXPECT_LT(s.param_bytes, model);
        EXPECT_LE(s.param_bytes, s.resident_bound);
        break;
    }
    EXPECT_EQ(stage == 0 ? 0u : 1u, s.optimizer_bytes == 0 ? 1u : 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, TrainerClientStageTest,
                         ::testing::Combine(::testing::Values(0u, 1u, 2u, 3u),
                                            ::testing::ValuesIn(kDataPlanes)),
                         [](const auto& info) {
                           return "Stage" +
                                  std::to_string(std::get<0>(info.param)) +
                                  "_" + std::get<1>(info.param);
                         });

// ZeRO++'s quantized weights and gradients (int8 and fp8, blocks of 64):
// the same bits as an in-memory reference that quantizes where the wire
// does, and a quarter of the bytes of fp32 on the wire (plus the scales and
// padding of each slice), fetched and pushed alike.
class TrainerClientQuantizedTest
    : public TrainerClientTest,
      public ::testing::WithParamInterface<
          std::tuple<WireFormat::Kind, std::string>> {
 protected:
  std::string Plane() const override { return std::get<1>(GetParam()); }
};

TEST_P(TrainerClientQuantizedTest, MatchTheQuantizedReferenceInAQuarterOfTheBytes) {
  const WireFormat wire = WireFormat::Quantized(std::get<0>(GetParam()), 64);
  StartServers(false, wire);
  options_template_.cache.quantized = wire;
  options_template_.push.quantized = wire;
  std::vector<std::vector<float>> finals[kTrainers];
  TrainerClientStats stats[kTrainers];
  TrainAll(finals, stats);
  if (HasFatalFailure()) return;
  ExpectQuantizedReference(finals, wire);
  if (HasFatalFailure()) return;
  // Every slice pushed once per step; its bytes in the wire format.
  uint64_t wire_bytes = 0, fp32_bytes = 0;
  for (size_t g = 0; g < map_->num_groups(); ++g) {
    for (uint32_t s = 0; s < kShards; ++s) {
      wire_bytes += wire.Bytes(map_->compact_slice(g, s).size());
      fp32_bytes += 4 * map_->compact_slice(g, s).size();
    }
  }
  for (uint32_t r = 0; r < kTrainers; ++r) {
    EXPECT_EQ(stats[r].grads.bytes_pushed, kSteps * wire_bytes);
    EXPECT_GT(stats[r].params.bytes_fetched, 0u);
    EXPECT_LE(static_cast<double>(wire_bytes) / fp32_bytes, 0.27);
  }
  // A trainer that asks for the plain copy still gets it: fp32 here.
  options_template_.cache.quantized = WireFormat();
  auto plain = ConnectRank(1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto p = (*plain)->Acquire(3);
  ASSERT_TRUE(p.ok()) << p.status();
}

INSTANTIATE_TEST_SUITE_P(
    Formats, TrainerClientQuantizedTest,
    ::testing::Combine(::testing::Values(WireFormat::Kind::kInt8,
                                         WireFormat::Kind::kFp8),
                       ::testing::ValuesIn(kDataPlanes)),
    [](const auto& info) {
      return std::string(WireFormat::Quantized(std::get<0>(info.param), 64)
                             .name()) +
             "_" + std::get<1>(info.param);
    });

// ZeRO++'s hpZ: 4 trainers as 2 hosts of 2 (zero_hpz_partition_size 2)
// over 4 shards. Each trainer fetches the slices of every other shard over
// the network and reads the rest from its host's shared memory: the same
// bits as the in-memory reference (and as the run without it), and each
// host fetches at most 0.55 of the bytes its two trainers fetch without it.
class TrainerClientHpzTest
    : public TrainerClientTest,
      public ::testing::WithParamInterface<std::string> {
 protected:
  std::string Plane() const override { return GetParam(); }
  void SetUp() override {
    trainers_ = 4;
    shards_ = 4;
    TrainerClientTest::SetUp();
  }
};

TEST_P(TrainerClientHpzTest, TwoHostsOfTwoFetchHalfTheBytesForTheSameBits) {
  uint64_t fetched[2][4] = {};
  for (uint32_t hpz : {1u, 2u}) {
    if (hpz == 2) StartServers(false);  // from the initial values again
    options_template_.hpz_partition_size = hpz;
    std::vector<std::vector<float>> finals[4];
    TrainerClientStats stats[4];
    TrainAll(finals, stats);
    if (HasFatalFailure()) return;
    ExpectReference(finals);
    if (HasFatalFailure()) return;
    for (uint32_t r = 0; r < trainers_; ++r) {
      fetched[hpz - 1][r] = stats[r].params.bytes_fetched;
      if (hpz == 1) {
        EXPECT_EQ(stats[r].params.bytes_from_host, 0u);
      } else {
        EXPECT_GT(stats[r].params.bytes_from_host, 0u);
      }
    }
  }
  for (uint32_t host = 0; host < 2; ++host) {
    const double with = static_cast<double>(fetched[1][2 * host] +
                                            fetched[1][2 * host + 1]);
    const double without = static_cast<double>(fetched[0][2 * host] +
                                               fetched[0][2 * host + 1]);
    std::printf("host %u: fetched %.0f bytes with hpZ, %.0f without: %.3f\n",
                host, with, without, with / without);
    EXPECT_LE(with / without, 0.55) << "host " << host;
  }
  // Four trainers of one host in a world of 4 work; 3 do not divide it.
  options_template_.hpz_partition_size = 3;
  auto odd = ConnectRank(0);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(odd.status().message(),
                                "zero_hpz_partition_size"))
      << odd.status();
}

INSTANTIATE_TEST_SUITE_P(Planes, TrainerClientHpzTest,
                         ::testing::ValuesIn(kDataPlanes),
                         [](const auto& info) { return info.param; });

// stage3_max_live_parameters caps acquired + prefetched groups (and so the
// residency) below the prefetch window; the result is unchanged.
TEST_F(TrainerClientTest, MaxLiveParametersBoundsResidency) {
  options_template_.cache.prefetch_bytes =
      20000 * sizeof(float);  // whole model
  options_template_.cache.max_live_bytes = 5000 * sizeof(float);
  std::vector<std::vector<float>> finals[kTrainers];
  TrainerClientStats stats[kTrainers];
  TrainAll(finals, stats);
  if (HasFatalFailure()) return;
  ExpectReference(finals);
  for (uint32_t r = 0; r < kTrainers; ++r) {
    // One live group of 5000 + the largest group + persistent (100 + 200).
    EXPECT_LE(stats[r].params.peak_resident_bytes,
              (5000 + 5000 + 300) * sizeof(float));
  }
}

// stage3_max_reuse_distance: with a window wide enough, groups released in
// forward and reused within the distance in backward stay resident, so each
// step fetches fewer groups than with a distance of 0.
TEST_F(TrainerClientTest, ReuseDistanceKeepsGroupsForBackward) {
  uint64_t fetches[2] = {0, 0};
  for (int far = 0; far < 2; ++far) {
    if (far) StartServers(false);
    options_template_.cache.prefetch_bytes = 20000 * sizeof(float);
    options_template_.cache.max_reuse_distance = far ? 1000000000 : 0;
    std::vector<std::vector<float>> finals[kTrainers];
    TrainerClientStats stats[kTrainers];
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < kTrainers; ++r) {
      threads.emplace_back(
          [&, r] { Train(static_cast<int>(r), &finals[r], &stats[r]); });
    }
    for (auto& t : threads) t.join();
    if (HasFatalFailure()) return;
    ExpectReference(finals);
    fetches[far] = stats[0].params.group_fetches;
  }
  EXPECT_LT(fetches[1], fetches[0]);
}

// A step's fetches lease every group of a shard at once: after the first
// step (which learns the groups), one Lease transport call per shard and
// step, even
// with a window so small that backward fetches every group again (it was
// one per window and shard, forward and backward).
TEST_F(TrainerClientTest, OneLeaseCallPerShardAndStep) {
  options_template_.cache.prefetch_bytes = 2000 * sizeof(float);
  options_template_.cache.max_reuse_distance = 0;
  std::vector<std::vector<float>> finals[kTrainers];
  TrainerClientStats stats[kTrainers];
  std::vector<uint64_t> leases[kTrainers];
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    threads.emplace_back([&, r] {
      Train(static_cast<int>(r), &finals[r], &stats[r], false, 3, &leases[r]);
    });
  }
  for (auto& t : threads) t.join();
  if (HasFatalFailure()) return;
  ExpectReference(finals);
  for (uint32_t r = 0; r < kTrainers; ++r) {
    ASSERT_EQ(leases[r].size(), static_cast<size_t>(kSteps));
    // Backward fetched groups again (the window holds few).
    EXPECT_GT(stats[r].params.group_fetches,
              static_cast<uint64_t>(kSteps) * spec_.groups_size());
    // A step's lease to a shard may go out while the previous step ends
    // (prefetch) and is then counted there: steps 1..3 hold the leases of
    // versions 1..4 at most, one call per shard and version.
    uint64_t after_first = 0;
    for (int step = 1; step < kSteps; ++step) after_first += leases[r][step];
    EXPECT_LE(after_first, uint64_t{kShards} * kSteps) << "rank " << r;
  }
}

// overlap_comm false: a push returns only once the shards have the gradient.
TEST_F(TrainerClientTest, WithoutOverlapPushesAreSynchronous) {
  options_template_.overlap_comm = false;
  auto client = ConnectRank(0);
  ASSERT_TRUE(client.ok()) << client.status();
  const size_t g = 3;
  std::vector<float> grad((*client)->map().group_numel(g), 0.1f);
  ASSERT_TRUE((*client)->PushGradient(g, grad.data(), 0).ok());
  for (uint32_t s = 0; s < kShards; ++s) {
    const auto progress = servers_[s]->service().store().Progress();
    // Rank 0's contribution is in; only rank 1 is awaited.
    EXPECT_EQ(progress[g].waiting_for_ranks, std::vector<uint32_t>{1})
        << "shard " << s;
  }
}

// Every call to the shards is counted by method (RpcCounter): joining
// calls Join on each shard. A push's Landed goes over the transport (no gRPC
// call at all); the first push to a shard reserves its slot over gRPC, the
// next ones land in the credit that Landed's answer carried. Over inline,
// each Landed call rides on its contribution's WriteRegion stream.
TEST_F(TrainerClientTest, CountsItsCallsToTheShardsByMethod) {
  options_template_.overlap_comm = false;
  auto client = ConnectRank(0);
  ASSERT_TRUE(client.ok()) << client.status();
  std::map<std::string, uint64_t> before = (*client)->rpc_counts();
  EXPECT_GE(before["Join"], kShards);
  auto holders_of = [&](size_t g) {
    uint64_t n = 0;
    for (uint32_t s = 0; s < kShards; ++s) {
      n += (*client)->map().slice(g, s).size() > 0;
    }
    return n;
  };
  const size_t g = 3;
  ASSERT_GT(holders_of(g), 1u);
  // Over inline, each contribution's bytes and its Landed call go in one
  // WriteRegion stream (Pair::PutThenCall): no SendMessage for Landed.
  auto served = [&] {
    InlineTransport::Served sum;
    for (auto& server : servers_) {
      auto* t = dynamic_cast<InlineTransport*>(server->transport());
      if (!t) continue;
      const InlineTransport::Served s = t->served();
      sum.write_region += s.write_region;
      sum.write_region_calls += s.write_region_calls;
    }
    return sum;
  };
  const InlineTransport::Served served_before = served();
  std::vector<float> grad((*client)->map().group_numel(g), 0.1f);
  ASSERT_TRUE((*client)->PushGradient(g, grad.data(), 0).ok());
  if (Plane() == "inline") {
    const InlineTransport::Served served_after = served();
    EXPECT_EQ(served_after.write_region - served_before.write_region,
              holders_of(g));
    EXPECT_EQ(
        served_after.write_region_calls - served_before.write_region_calls,
        holders_of(g));
  }
  std::map<std::string, uint64_t> after = (*client)->rpc_counts();
  // Landing slots are asked for, and contributions handed in, over the
  // transport: the pool had a slot free each time.
  EXPECT_EQ(after["Landed"], before["Landed"]);
  EXPECT_EQ(after["ReserveLanding"], before["ReserveLanding"]);
  std::map<std::string, uint64_t> calls_after =
      (*client)->transport_call_counts();
  EXPECT_EQ(calls_after["ReserveLanding"], holders_of(g));
  EXPECT_EQ(calls_after["Landed"], holders_of(g));
  EXPECT_EQ(after["Join"], before["Join"]);
  // The next group lands in the credits: no gRPC call (heartbeats aside).
  const size_t h = 2;
  ASSERT_LE(holders_of(h), holders_of(g));
  grad.assign((*client)->map().group_numel(h), 0.1f);
  ASSERT_TRUE((*client)->PushGradient(h, grad.data(), 0).ok());
  uint64_t calls = 0;
  for (const auto& [method, n] : (*client)->rpc_counts()) {
    if (method != "Heartbeat") calls += n;
  }
  for (const auto& [method, n] : after) {
    if (method != "Heartbeat") calls -= n;
  }
  EXPECT_EQ(calls, 0u);
}

// A reservation the pool cannot grant now waits on the shard, over the
// transport (answered once a slot is free), not over gRPC: rank 1's
// contributions land out of order, and with two slots the last one is kept
// for rank 0's; once rank 0's lands and both fold, rank 1's gets its slot.
TEST_F(TrainerClientTest, AFullLandingPoolIsWaitedForOverTheTransport) {
  landing_slots_ = 2;
  StartServers(false);
  options_template_.overlap_comm = false;
  auto first = ConnectRank(0);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ConnectRank(1);
  ASSERT_TRUE(second.ok()) << second.status();
  TrainerClient& a = **first;
  TrainerClient& b = **second;
  auto push = [](TrainerClient& c, size_t g) {
    std::vector<float> grad(c.map().group_numel(g), 0.1f);
    return c.PushGradient(g, grad.data(), 0);
  };
  const size_t g = 3, h = 1;  // both on every shard
  for (uint32_t s = 0; s < shards_; ++s) {
    ASSERT_GT(b.map().slice(g, s).size(), 0u);
    ASSERT_GT(b.map().slice(h, s).size(), 0u);
  }
  ASSERT_TRUE(push(b, g).ok());
  // b's g holds one slot of each pool, the other stays for rank 0's g (the
  // fold order's next): b's h waits on every shard until rank 0 pushes g.
  absl::Status waited;
  std::atomic<bool> late_done{false};
  std::thread late([&] {
    waited = push(b, h);
    late_done = true;
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(late_done.load());
  ASSERT_TRUE(push(a, g).ok());
  late.join();
  ASSERT_TRUE(waited.ok()) << waited;
  // One reservation per contribution and shard, each a transport call (the
  // shard answered h's once a slot was free); none over gRPC.
  EXPECT_EQ(b.rpc_counts()["ReserveLanding"], 0u);
  EXPECT_EQ(b.transport_call_counts()["ReserveLanding"], 2 * shards_);
}

// A step report shard 0 accepted counts as the trainer's heartbeat: while
// a trainer reports steps more often than it would heartbeat it sends no
// Heartbeat and stays a member past the timeout; once it stops reporting,
// its heartbeats resume.
TEST_F(TrainerClientTest, StepReportsStandInForHeartbeats) {
  trainers_ = 1;
  trainer_timeout_ = absl::Seconds(1);  // a heartbeat every 200 ms
  StartServers(false);
  auto client = ConnectRank(0);
  ASSERT_TRUE(client.ok()) << client.status();
  TrainerClient& c = **client;
  const size_t groups = c.map().num_groups();
  for (size_t g = 0; g < groups; ++g) {
    ASSERT_TRUE(c.Acquire(g).ok());
    ASSERT_TRUE(c.Release(g).ok());
  }
  for (size_t g = groups; g-- > 0;) {
    std::vector<float> grad(c.map().group_numel(g), 0.1f);
    ASSERT_TRUE(c.PushGradient(g, grad.data(), 0).ok());
  }
  ASSERT_TRUE(c.EndStep().ok());
  // Heartbeats go over the data plane's transport (no gRPC call) while it
  // is up.
  auto beats = [&c] {
    return c.rpc_counts()["Heartbeat"] + c.transport_call_counts()["Heartbeat"];
  };
  const uint64_t grpc_beats = c.rpc_counts()["Heartbeat"];
  const uint64_t before = beats();
  for (int i = 0; i < 30; ++i) {  // 1.5 s, longer than the timeout
    c.ReportStep(1.0, 1, 0.05);
    absl::SleepFor(absl::Milliseconds(50));
  }
  const uint64_t reporting = beats() - before;
  EXPECT_LE(reporting, 1u);  // one may have been on its way
  EXPECT_TRUE(c.membership().ok()) << c.membership();
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_GE(beats() - before - reporting, 3u);
  EXPECT_TRUE(c.membership().ok()) << c.membership();
  EXPECT_EQ(c.rpc_counts()["Heartbeat"], grpc_beats);
}

// Joining again (a rejoin: the process's instance id and rank) gives the
// rank up only through a client that completed its connect: an attempt that
// fails after the coordinator's answer, or one dropped with Detach, keeps
// it; the client that completed leaves it when destroyed.
TEST_F(TrainerClientTest, AFailedRejoinAttemptKeepsTheRank) {
  trainers_ = 1;
  StartServers(false);
  auto init = [this](size_t g, float* out) { return Init(spec_, g, out); };
  auto first = TrainerClient::Connect(ClientOptions(0), spec_, init);
  ASSERT_TRUE(first.ok()) << first.status();
  TrainerClientOptions again = ClientOptions(0);
  again.cluster.instance_id = (*first)->instance_id();
  again.cluster.verify_only = true;
  auto other = MakeSpec({{100}, {3000, 2001}, {3000}, {5000}, {150, 50}});
  auto failed = TrainerClient::Connect(
      again, other,
      [&other](size_t g, float* out) { return Init(other, g, out); });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition)
      << failed.status();
  auto dropped = TrainerClient::Connect(again, spec_, init);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  (*dropped)->Detach();
  dropped->reset();
  auto rejoined = TrainerClient::Connect(again, spec_, init);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ((*rejoined)->rank(), 0u);
  (*first)->Detach();
  first->reset();
  rejoined->reset();  // leaves: a new process may take rank 0 at once
  TrainerClientOptions fresh = ClientOptions(0);
  fresh.cluster.connect_timeout = absl::Seconds(3);  // trainer timeout: 10 s
  auto next = TrainerClient::Connect(fresh, spec_, init);
  ASSERT_TRUE(next.ok()) << next.status();
}

// Gradients written where GradientBuffer says are pushed without a copy and
// give the same bits; a lent buffer no push took goes back to the pool.
TEST_F(TrainerClientTest, LentGradientBuffersGiveTheSameBits) {
  lend_ = true;
  std::vector<std::vector<float>> finals[kTrainers];
  TrainerClientStats stats[kTrainers];
  TrainAll(finals, stats);
  ExpectReference(finals);
}

TEST_F(TrainerClientTest, AGradientBufferNotPushedIsNotUsed) {
  trainers_ = 1;
  StartServers(false);
  auto client = ConnectRank(0);
  ASSERT_TRUE(client.ok()) << client.status();
  TrainerClient& c = **client;
  EXPECT_EQ(c.GradientBuffer(c.map().num_groups()), nullptr);
  // Lent, then a push from another buffer: that one's values go.
  auto* lent = static_cast<float*>(c.GradientBuffer(0));
  ASSERT_NE(lent, nullptr);
  std::vector<float> grad(c.map().group_numel(0), 0.5f);
  std::fill(lent, lent + grad.size(), NAN);
  for (size_t g = 0; g < c.map().num_groups(); ++g) {
    ASSERT_TRUE(c.Acquire(g).ok());
    ASSERT_TRUE(c.Release(g).ok());
  }
  for (size_t g = c.map().num_groups(); g-- > 0;) {
    std::vector<float> gg(c.map().group_numel(g), 0.5f);
    ASSERT_TRUE(c.PushGradient(g, gg.data(), 0).ok());
  }
  auto r = c.EndStep();
  ASSERT_TRUE(r.ok()) << r.status();
  auto p = c.Acquire(0);
  ASSERT_TRUE(p.ok()) << p.status();
  const float* values = static_cast<const float*>(*p);
  for (size_t i = 0; i < grad.size(); ++i) {
    ASSERT_TRUE(std::isfinite(values[i])) << i;
  }
  ASSERT_TRUE(c.Release(0).ok());
}

// Servers and trainers must run the same training config (hash at Join).
TEST_F(TrainerClientTest, DifferentConfigIsRefused) {
  options_template_.cluster.expected_config_hash = 0x1234;  // not the servers'
  auto client = ConnectRank(0);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(client.status().message().find("different training config"),
            absl::string_view::npos)
      << client.status();
}

TEST_F(TrainerClientTest, DifferentSpecIsRefusedNamingTheTensor) {
  std::vector<std::vector<float>> final0;
  TrainerClientStats stats0;
  std::thread t0([&] {
    auto client = ConnectRank(0);
    ASSERT_TRUE(client.ok()) << client.status();
  });
  t0.join();
  auto other = MakeSpec({{100}, {3000, 2001}, {3000}, {5000}, {150, 50}});
  auto client = TrainerClient::Connect(
      ClientOptions(1), other,
      [&other](size_t g, float* out) { return Init(other, g, out); });
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(
      client.status().message().find("tensor 't2' has shape [2000] vs [2001]"),
      absl::string_view::npos)
      << client.status();
}

class TrainerClientPlaneTest
    : public TrainerClientTest,
      public ::testing::WithParamInterface<std::string> {
 protected:
  std::string Plane() const override { return GetParam(); }

  // Ranks 0 and 1 (joined together: the first step waits for both) with
  // 1 s RPC deadlines and `peer_wait`; on failure both stay null.
  void ConnectTwo(absl::Duration peer_wait, std::unique_ptr<TrainerClient>* c0,
                  std::unique_ptr<TrainerClient>* c1) {
    auto connect = [&](int rank) {
      TrainerClientOptions o = ClientOptions(rank);
      o.cache.rpc_timeout = absl::Seconds(1);
      o.push.rpc_timeout = absl::Seconds(1);
      o.peer_wait = peer_wait;
      return TrainerClient::Connect(o, spec_, [this](size_t g, float* out) {
        return Init(spec_, g, out);
      });
    };
    absl::StatusOr<std::unique_ptr<TrainerClient>> one;
    std::thread joiner([&] { one = connect(1); });
    absl::StatusOr<std::unique_ptr<TrainerClient>> zero = connect(0);
    joiner.join();
    ASSERT_TRUE(zero.ok()) << zero.status();
    ASSERT_TRUE(one.ok()) << one.status();
    *c0 = std::move(*zero);
    *c1 = std::move(*one);
  }
};

TEST_P(TrainerClientPlaneTest, KilledShardIsReportedByNameWithinTheDeadline) {
  TrainerClientOptions o = ClientOptions(0);
  o.cache.rpc_timeout = absl::Seconds(2);
  auto client = TrainerClient::Connect(
      o, spec_, [this](size_t g, float* out) { return Init(spec_, g, out); });
  ASSERT_TRUE(client.ok()) << client.status();
  servers_[2]->Shutdown(absl::ZeroDuration());
  const absl::Time start = absl::Now();
  auto p = (*client)->Acquire(3);
  EXPECT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("shard 2"), absl::string_view::npos)
      << p.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// EndStep starts the next step's fetches, which wait on the shards while
// the step waits for a late trainer (here rank 1, which never comes, for
// up to peer_wait: two minutes). Closing the client does not wait for them.
TEST_P(TrainerClientPlaneTest, ClosingDoesNotWaitForTheNextStepsFetches) {
  auto client = TrainerClient::Connect(
      ClientOptions(0), spec_,
      [this](size_t g, float* out) { return Init(spec_, g, out); });
  ASSERT_TRUE(client.ok()) << client.status();
  TrainerClient& c = **client;
  for (size_t g = c.map().num_groups(); g-- > 0;) {
    ASSERT_TRUE(c.Acquire(g).ok());
    ASSERT_TRUE(c.Release(g).ok());
    const std::vector<float> grad(c.map().group_numel(g), 0.5f);
    ASSERT_TRUE(c.PushGradient(g, grad.data(), 0).ok());
  }
  ASSERT_TRUE(c.EndStep().ok());
  absl::SleepFor(absl::Milliseconds(200));  // the fetches wait on the shards
  const absl::Time start = absl::Now();
  client->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A group's slices to every shard go from one push thread, all started
// before their answers are waited for (GradientPusher::SendGroup): a shard
// that shut down refuses its slices (over either plane: ucx's transport
// outlives the shard's gRPC server in this process), the step's error names
// it, and the other shards took theirs.
TEST_P(TrainerClientPlaneTest, AShardThatShutDownFailsOnlyItsSlicesOfAPush) {
  TrainerClientOptions o = ClientOptions(0);
  o.cache.rpc_timeout = absl::Seconds(2);
  o.push.rpc_timeout = absl::Seconds(2);
  auto client = TrainerClient::Connect(
      o, spec_, [this](size_t g, float* out) { return Init(spec_, g, out); });
  ASSERT_TRUE(client.ok()) << client.status();
  TrainerClient& c = **client;
  const size_t groups = c.map().num_groups();
  for (size_t g = groups; g-- > 0;) {
    ASSERT_TRUE(c.Acquire(g).ok());
    ASSERT_TRUE(c.Release(g).ok());
  }
  auto landed = [this](uint32_t s) {
    const StoreMemory m = servers_[s]->service().store().Memory();
    return m.landed_reserved + m.landed_credit;
  };
  const uint64_t before0 = landed(0), before1 = landed(1);
  servers_[2]->Shutdown(absl::ZeroDuration());
  const absl::Time start = absl::Now();
  for (size_t g = groups; g-- > 0;) {
    const std::vector<float> grad(c.map().group_numel(g), 0.5f);
    ASSERT_TRUE(c.PushGradient(g, grad.data(), 0).ok());
  }
  auto end = c.EndStep();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(end.ok());
  EXPECT_NE(end.status().message().find("shard 2"), absl::string_view::npos)
      << end.status();
  uint64_t on0 = 0, on1 = 0;
  for (size_t g = 0; g < groups; ++g) {
    on0 += c.map().slice(g, 0).size() > 0 ? 1 : 0;
    on1 += c.map().slice(g, 1).size() > 0 ? 1 : 0;
  }
  EXPECT_EQ(landed(0) - before0, on0);
  EXPECT_EQ(landed(1) - before1, on1);
}

// One step of trainer `c` (every group fetched, a gradient pushed for each).
absl::Status OneStep(TrainerClient& c) {
  for (size_t g = c.map().num_groups(); g-- > 0;) {
    ZS_ASSIGN_OR_RETURN(const void* p, c.Acquire(g));
    const float* values = static_cast<const float*>(p);
    std::vector<float> grad(c.map().group_numel(g));
    for (size_t i = 0; i < grad.size(); ++i) {
      grad[i] = FakeGrad(values[i], c.rank(), c.step(), i);
    }
    ZS_RETURN_IF_ERROR(c.Release(g));
    ZS_RETURN_IF_ERROR(c.PushGradient(g, grad.data(), 0));
  }
  return c.EndStep().status();
}

// A trainer whose next step waits for a live trainer that is late by more
// than its RPC deadline waits on: the shards answer before each deadline
// that they wait for trainer 1, and the fetch is asked again.
TEST_P(TrainerClientPlaneTest, ALateTrainerIsWaitedForPastTheRpcDeadline) {
  std::unique_ptr<TrainerClient> early, late;
  ConnectTwo(kDefaultPeerWait, &early, &late);
  ASSERT_TRUE(early && late);
  ASSERT_TRUE(OneStep(*early).ok());
  const absl::Time start = absl::Now();
  std::thread slow([&] {
    absl::SleepFor(absl::Seconds(4));
    EXPECT_TRUE(OneStep(*late).ok());
  });
  auto p = early->Acquire(0);
  slow.join();
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_GE(absl::Now() - start, absl::Seconds(3.5));
}

// Past peer_wait, the error says which trainer the step waits for (the
// shard's answer, not the RPC's "Deadline Exceeded").
TEST_P(TrainerClientPlaneTest, WaitingPastPeerWaitNamesTheLateTrainer) {
  std::unique_ptr<TrainerClient> waiting, silent;
  ConnectTwo(absl::Seconds(2), &waiting, &silent);
  ASSERT_TRUE(waiting && silent);
  ASSERT_TRUE(OneStep(*waiting).ok());
  const absl::Time start = absl::Now();
  auto p = waiting->Acquire(0);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDeadlineExceeded)
      << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "trainer ranks 1"))
      << p.status();
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(10));
}

INSTANTIATE_TEST_SUITE_P(DataPlanes, TrainerClientPlaneTest,
                         ::testing::ValuesIn(kDataPlanes),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zshard
