#include "client/core/cluster.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/base/thread_name.h"
#include "common/config/training_config.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

// When `counter` is not null, it counts every call of the stub.
std::unique_ptr<v1::ShardService::Stub> MakeStub(
    const RpcCredentials& credentials, const std::string& endpoint,
    RpcCounter* counter = nullptr) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  RpcCredentials::InterceptorFactories extra;
  if (counter) extra.push_back(counter->Factory());
  return v1::ShardService::NewStub(
      credentials.Channel(endpoint, args, std::move(extra)));
}

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string DefaultTrainerId() {
  return absl::StrCat(HostName(), ":", getpid());
}

// A random id for this process (never 0).
uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

// One Join call, waiting for the shard to serve until `deadline`.
absl::Status JoinShard(v1::ShardService::Stub& stub,
                       const ClusterOptions& options, const std::string& id,
                       uint64_t instance, int rank, absl::Time deadline,
                       v1::JoinResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ctx.set_wait_for_ready(true);
  v1::JoinRequest req;
  req.set_requested_rank(rank);
  req.set_trainer_id(id);
  req.set_transport(options.transport);
  req.set_host(HostName());
  req.set_pid(static_cast<uint32_t>(getpid()));
  req.set_instance_id(instance);
  return FromGrpcStatus(stub.Join(&ctx, req, resp));
}

// Joins the coordinator; while every rank is held by a live trainer, or
// the rank asked for is (one that is gone is dropped within the
// coordinator's timeout: a restarted process of a rank waits for its dead
// predecessor to be dropped), asks again.
absl::Status JoinCoordinator(v1::ShardService::Stub& stub,
                             const ClusterOptions& options,
                             const std::string& id, uint64_t instance,
                             absl::Time deadline, v1::JoinResponse* resp) {
  bool told = false;
  for (;;) {
    absl::Status st = JoinShard(stub, options, id, instance,
                                options.requested_rank, deadline, resp);
    const bool held =
        absl::IsResourceExhausted(st) ||
        (absl::IsAlreadyExists(st) && options.requested_rank >= 0);
    if (!held || absl::Now() + absl::Seconds(1) >= deadline) return st;
    if (!told) {
      std::cerr << "zshard trainer: " << st.message()
                << "; waiting for a rank to free up\n";
      told = true;
    }
    absl::SleepFor(absl::Seconds(1));  // a retry backoff, bounded by deadline
  }
}

// FAILED_PRECONDITION naming what shard `s`'s Join answer disagrees with in
// shard 0's (`first`).
absl::Status AgreesWithShard0(uint32_t s, const v1::JoinResponse& first,
                              const v1::JoinResponse& resp) {
  if (resp.shard_id() != s) {
    return absl::FailedPreconditionError(
        absl::StrCat("answers as shard ", resp.shard_id()));
  }
  if (resp.layout().layout_version() != first.layout().layout_version() ||
      resp.world_size() != first.world_size() ||
      resp.gradient_accumulation_steps() !=
          first.gradient_accumulation_steps() ||
      resp.config_hash() != first.config_hash() ||
      resp.step_barrier() != first.step_barrier()) {
    return absl::FailedPreconditionError(
        "disagrees with shard 0 on the layout, the trainer count or "
        "the training config; start every shard with the same flags");
  }
  if (resp.transport() != first.transport()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "runs the ", resp.transport().empty() ? "(none)" : resp.transport(),
        " data plane but shard 0 runs ",
        first.transport().empty() ? "(none)" : first.transport(),
        "; start every shard with the same --transport"));
  }
  if (resp.restored() != first.restored() ||
      resp.restored_step() != first.restored_step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        resp.restored()
            ? absl::StrCat("was restored from step ", resp.restored_step())
            : std::string("was not restored from a checkpoint"),
        " but shard 0 ",
        first.restored()
            ? absl::StrCat("was restored from step ", first.restored_step())
            : std::string("was not"),
        "; start every shard with the same --restore"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Cluster::Annotate(uint32_t shard,
                               const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("shard ", shard, " (", endpoints_[shard],
                                   "): ", status.message()));
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Connect(
    const ClusterOptions& options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("no coordinator address given");
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  const std::string id =
      options.trainer_id.empty() ? DefaultTrainerId() : options.trainer_id;
  std::unique_ptr<Cluster> c(new Cluster());
  c->credentials_ = options.credentials;
  c->verify_only_ = options.verify_only;

  auto coordinator =
      MakeStub(*options.credentials, options.coordinator, c->rpcs_.get());
  c->instance_id_ =
      options.instance_id != 0 ? options.instance_id : NewInstanceId();
  // Joining again with an instance another client of this process holds the
  // rank with: a failed attempt must not give that rank up.
  c->left_ = options.instance_id != 0;
  v1::JoinResponse first;
  absl::Status joined = JoinCoordinator(*coordinator, options, id,
                                        c->instance_id_, deadline, &first);
  if (absl::IsDeadlineExceeded(joined)) {
    // Nothing answered within connect_timeout: the coordinator is not
    // reachable (retrying later may work), as Connect promises.
    return absl::UnavailableError(absl::StrCat(
        "joining the coordinator at ", options.coordinator,
        ": no answer within ", absl::FormatDuration(options.connect_timeout),
        " (", joined.message(), ")"));
  }
  if (!joined.ok()) {
    return absl::Status(
        joined.code(),
        absl::StrCat("joining the coordinator at ", options.coordinator, ": ",
                     joined.message()));
  }
  if (first.shards_size() != static_cast<int>(first.layout().num_shards())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator listed ", first.shards_size(),
        " shards but its layout has ", first.layout().num_shards()));
  }
  c->rank_ = first.rank();
  c->world_size_ = first.world_size();
  for (const auto& e : first.shards()) {
    c->endpoints_.push_back(e.endpoint());
    c->stubs_.push_back(
        e.shard_id() == 0
            ? std::move(coordinator)
            : MakeStub(*options.credentials, e.endpoint(), c->rpcs_.get()));
  }
  c->accumulation_steps_ = first.gradient_accumulation_steps();
  c->config_hash_ = first.config_hash();
  c->step_barrier_ = first.step_barrier();
  c->layout_ = first.layout();
  c->resume_.restored = first.restored();
  c->resume_.step = first.restored_step();
  c->resume_.trainer_state = first.trainer_state();
  c->resume_.last_step_skipped = first.last_step_skipped();
  c->resume_.epoch = first.epoch();
  c->transport_ = first.transport();
  c->transport_addresses_.assign(first.layout().num_shards(), "");
  c->transport_addresses_[0] = first.transport_address();
  c->call_tokens_.assign(first.layout().num_shards(), 0);
  c->call_tokens_[0] = first.call_token();
  // Started once everything it reads (rank, endpoints, epoch) is set.
  if (first.heartbeat_interval_ms() > 0) {
    const absl::Duration beat =
        absl::Milliseconds(first.heartbeat_interval_ms());
    c->beat_thread_ = std::thread([raw = c.get(), beat] {
      NameCurrentThread("zs-heartbeat");
      raw->Heartbeats(beat);
    });
  } else {
    c->left_ = true;  // a coordinator without membership
  }
  if (options.expected_config_hash != 0 &&
      options.expected_config_hash != c->config_hash_) {
    const std::string diff = DescribeConfigDifference(
        first.config_canonical(), options.expected_config_canonical);
    return absl::FailedPreconditionError(absl::StrCat(
        "the servers run a different training config than this trainer",
        diff.empty() ? " (compare the --config files)" : ": ", diff));
  }
  for (uint32_t s = 1; s < c->num_shards(); ++s) {
    v1::JoinResponse resp;
    ZS_RETURN_IF_ERROR(
        c->Annotate(s, JoinShard(*c->stubs_[s], options, id, c->instance_id_,
                                 static_cast<int>(c->rank_), deadline, &resp)));
    ZS_RETURN_IF_ERROR(c->Annotate(s, AgreesWithShard0(s, first, resp)));
    c->transport_addresses_[s] = resp.transport_address();
    c->call_tokens_[s] = resp.call_token();
  }
  return c;
}

absl::StatusOr<PartitionMap> Cluster::RegisterOrVerify(
    const v1::ModelSpec& spec, const InitFn& init, absl::Duration timeout) {
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, num_shards(), layout_.alignment(),
                           layout_.persistence_threshold()));
  if (rank_ == 0 && !verify_only_) {
    ZS_RETURN_IF_ERROR(Register(spec, map, init, timeout));
  } else {
    ZS_RETURN_IF_ERROR(Verify(spec, timeout));
  }
  return map;
}

absl::Status Cluster::Register(const v1::ModelSpec& spec,
                               const PartitionMap& map, const InitFn& init,
                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const uint32_t shards = num_shards();
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<v1::RegisterModelResponse> resps(shards);
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::RegisterModelChunk>>>
      writers;
  for (uint32_t s = 0; s < shards; ++s) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    ctxs.back()->set_deadline(absl::ToChronoTime(deadline));
    writers.push_back(stubs_[s]->RegisterModel(ctxs.back().get(), &resps[s]));
    v1::RegisterModelChunk head;
    *head.mutable_spec() = spec;
    writers.back()->Write(head);
  }
  // One group in memory at a time; each shard gets its slice in 1 MiB chunks.
  constexpr size_t kChunk = (1 << 20) / sizeof(float);
  std::vector<float> values;
  for (size_t g = 0; g < map.num_groups(); ++g) {
    values.assign(map.group_numel(g), 0.0f);
    ZS_RETURN_IF_ERROR(init(g, values.data()));
    for (uint32_t s = 0; s < shards; ++s) {
      const Slice& slice = map.slice(g, s);
      for (uint64_t off = slice.begin; off < slice.end; off += kChunk) {
        const uint64_t n = std::min<uint64_t>(kChunk, slice.end - off);
        v1::RegisterModelChunk chunk;
        chunk.set_group(static_cast<uint32_t>(g));
        chunk.set_offset(off);
        chunk.set_data(reinterpret_cast<const char*>(values.data() + off),
                       n * sizeof(float));
        if (!writers[s]->Write(chunk)) break;  // Finish() says why
      }
    }
  }
  absl::Status first_error;
  for (uint32_t s = 0; s < shards; ++s) {
    writers[s]->WritesDone();
    absl::Status st = Annotate(s, FromGrpcStatus(writers[s]->Finish()));
    if (!st.ok() && first_error.ok()) first_error = st;
  }
  return first_error;
}

Cluster::~Cluster() {
  {
    absl::MutexLock lock(&beat_mu_);
    beat_stop_ = true;
  }
  if (beat_thread_.joinable()) beat_thread_.join();
  if (left_ || stubs_.empty() || !membership().ok()) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::LeaveRequest req;
  req.set_trainer_rank(rank_);
  req.set_instance_id(instance_id_);
  req.set_reason("it left");
  v1::LeaveResponse resp;
  (void)stubs_[0]->Leave(&ctx, req, &resp);  // best effort: else it times out
}

void Cluster::Detach() {
  {
    absl::MutexLock lock(&beat_mu_);
    beat_stop_ = true;
  }
  if (beat_thread_.joinable()) beat_thread_.join();
  left_ = true;
}

void Cluster::Hold() {
  if (beat_thread_.joinable()) left_ = false;
}

void Cluster::Vouched(absl::Time sent) {
  absl::MutexLock lock(&beat_mu_);
  vouched_ = std::max(vouched_, sent);
}

void Cluster::SetBeatSender(BeatSender send) {
  absl::MutexLock lock(&sender_mu_);
  beat_sender_ = std::move(send);
}

absl::Status Cluster::Beat(absl::Duration interval) {
  v1::HeartbeatRequest req;
  req.set_trainer_rank(rank_);
  req.set_instance_id(instance_id_);
  req.set_epoch(resume_.epoch);
  // One deadline for both ways: a shard 0 that stopped answering is
  // noticed within an interval, as before.
  const absl::Time deadline = absl::Now() + interval;
  {
    absl::MutexLock lock(&sender_mu_);
    if (beat_sender_) {
      absl::Status st = beat_sender_(req, deadline);
      if (st.ok() || absl::IsFailedPrecondition(st) ||
          absl::IsInvalidArgument(st) || absl::IsAborted(st)) {
        return st;
      }
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::HeartbeatResponse resp;
  return FromGrpcStatus(stubs_[0]->Heartbeat(&ctx, req, &resp));
}

void Cluster::Heartbeats(absl::Duration interval) {
  absl::MutexLock lock(&beat_mu_);
  for (;;) {
    beat_mu_.AwaitWithTimeout(absl::Condition(&beat_stop_), interval);
    if (beat_stop_) return;
    // A step report shard 0 accepted within the interval was a heartbeat.
    if (absl::Now() - vouched_ < interval) continue;
    beat_mu_.Unlock();
    const absl::Status st = Beat(interval);
    // Unanswered: did a replacement of shard 0 take over? (Otherwise keep
    // trying; the coordinator decides.)
    absl::StatusOr<std::string> moved = absl::NotFoundError("");
    if (!st.ok() && !absl::IsFailedPrecondition(st) &&
        !absl::IsInvalidArgument(st) && !absl::IsAborted(st)) {
      moved = FindCoordinator(endpoints_, resume_.epoch, *credentials_,
                              absl::Now() + interval);
    }
    beat_mu_.Lock();
    if (absl::IsFailedPrecondition(st) || absl::IsInvalidArgument(st)) {
      membership_ = absl::FailedPreconditionError(
          absl::StrCat("the coordinator dropped this trainer: ", st.message()));
    } else if (absl::IsAborted(st)) {
      membership_ = st;  // rolled back: the rank is kept for its rejoin
    } else if (moved.ok()) {
      moved_to_ = *moved;
      membership_ = absl::UnavailableError(absl::StrCat(
          "the coordinator (shard 0) at ", endpoints_[0],
          " stopped answering and the shards name ", *moved,
          " as its replacement; this trainer must join again there"));
    } else {
      continue;
    }
    std::cerr << "zshard trainer rank " << rank_ << ": "
              << membership_.message() << "\n";
    if (lost_hook_) lost_hook_(membership_);
    return;
  }
}

absl::Status Cluster::membership() const {
  absl::MutexLock lock(&beat_mu_);
  return membership_;
}

std::string Cluster::moved_to() const {
  absl::MutexLock lock(&beat_mu_);
  return moved_to_;
}

void Cluster::SetLostHook(std::function<void(const absl::Status&)> hook) {
  absl::MutexLock lock(&beat_mu_);
  lost_hook_ = std::move(hook);
}

absl::StatusOr<uint64_t> Cluster::Admit(absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::AdmitRequest req;
  req.set_trainer_rank(rank_);
  req.set_instance_id(instance_id_);
  v1::AdmitResponse resp;
  absl::Status st = FromGrpcStatus(stubs_[0]->Admit(&ctx, req, &resp));
  if (!st.ok()) return Annotate(0, st);
  return resp.start_step();
}

absl::StatusOr<uint64_t> Cluster::AgreedVersion(absl::Duration timeout) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (uint32_t s = 0; s < num_shards(); ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1::GetLayoutResponse resp;
    absl::Status st = FromGrpcStatus(
        stubs_[s]->GetLayout(&ctx, v1::GetLayoutRequest(), &resp));
    if (!st.ok()) return Annotate(s, st);
    if (!resp.owns_slices()) continue;
    lo = std::min(lo, resp.min_version());
    hi = std::max(hi, resp.max_version());
  }
  if (lo == UINT64_MAX) return 0;
  if (lo != hi) {
    return absl::FailedPreconditionError(
        absl::StrCat("a step is half applied (group versions ", lo, "..", hi,
                     "); a trainer can join only between steps"));
  }
  return lo;
}

absl::Status Cluster::Verify(const v1::ModelSpec& spec,
                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const uint64_t hash = SpecHash(spec);
  for (uint32_t s = 0; s < num_shards(); ++s) {
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      v1::GetLayoutResponse resp;
      absl::Status st = FromGrpcStatus(
          stubs_[s]->GetLayout(&ctx, v1::GetLayoutRequest(), &resp));
      if (!st.ok()) return Annotate(s, st);
      if (resp.registered()) {
        if (resp.spec_hash() != hash) {
          return Annotate(s, absl::FailedPreconditionError(
                                 "a different model is registered: " +
                                 FirstSpecDifference(resp.spec(), spec)));
        }
        break;
      }
      if (absl::Now() + absl::Milliseconds(100) >= deadline) {
        return Annotate(s, absl::DeadlineExceededError(
                               "no model was registered before the deadline "
                               "(rank 0 registers it)"));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Cluster::FindCoordinator(
    const std::vector<std::string>& endpoints, uint64_t min_epoch,
    const RpcCredentials& credentials, absl::Time deadline) {
  // Every shard at once: a stopped one must not use up the others' time.
  std::vector<v1::GetLayoutResponse> answers(endpoints.size());
  std::vector<char> answered(
      endpoints.size(), 0);  // not vector<bool>: each thread writes its own
  std::vector<std::thread> asks;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (endpoints[i].empty()) continue;
    asks.emplace_back([&, i] {
      auto stub = MakeStub(credentials, endpoints[i]);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      answered[i] =
          stub->GetLayout(&ctx, v1::GetLayoutRequest(), &answers[i]).ok();
    });
  }
  for (std::thread& t : asks) t.join();
  std::string found;
  uint64_t newest = min_epoch;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const v1::GetLayoutResponse& a = answers[i];
    if (answered[i] && a.epoch() > newest && !a.coordinator().empty()) {
      newest = a.epoch();
      found = a.coordinator();
    }
  }
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no shard names a coordinator newer than epoch ", min_epoch));
  }
  return found;
}

}  // namespace zshard
