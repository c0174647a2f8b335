// The public Trainer (client/include/zshard/client/trainer.h) over the
// library's TrainerClient.
#include "zshard/client/trainer.h"

#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/core/rejoin.h"
#include "client/core/trainer_client.h"
#include "common/base/grpc_status.h"
#include "common/base/rpc_credentials.h"
#include "common/base/status_macros.h"
#include "common/config/loss_scaler.h"
#include "common/config/training_config.h"
#include "common/model/model_spec.h"
#include "grpcpp/grpcpp.h"
#include "zshard/v1/admin.grpc.pb.h"

namespace zshard {
namespace {

absl::Status CheckOptions(const TrainerOptions& o) {
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "TrainerOptions.coordinator: required (host:port of shard 0)");
  }
  if (o.rank < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainerOptions.rank: expected -1 or a rank, got ", o.rank));
  }
  if (!o.transport.empty() && o.transport != "ucx" && o.transport != "inline") {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainerOptions.transport: expected ucx or inline, got '",
                     o.transport, "'"));
  }
  for (const auto& [name, v] : {std::pair<const char*, double>{
                                    "connect_timeout_s", o.connect_timeout_s},
                                {"rpc_timeout_s", o.rpc_timeout_s}}) {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TrainerOptions.", name, ": expected a positive number, got ", v));
    }
  }
  return absl::OkStatus();
}

v1::ModelSpec ToSpec(const ModelDesc& model) {
  v1::ModelSpec spec;
  spec.set_name(model.name);
  for (const GroupDesc& g : model.groups) {
    v1::GroupSpec* group = spec.add_groups();
    group->set_name(g.name);
    for (const TensorDesc& t : g.tensors) {
      v1::TensorSpec* tensor = group->add_tensors();
      tensor->set_name(t.name);
      for (int64_t d : t.shape) tensor->add_shape(d);
      tensor->set_dtype(v1::FLOAT32);
      tensor->set_trainable(t.trainable);
    }
  }
  return spec;
}

}  // namespace

struct Trainer::Impl {
  explicit Impl(const TrainingConfig& c) : config(c), scaler(c.fp16) {}
  std::unique_ptr<TrainerClient> client;
  // What Rejoin connects with.
  TrainerClientOptions options;
  v1::ModelSpec spec;
  // Clients given up by Rejoin: silenced, kept while lent buffers may still
  // be viewed.
  std::vector<std::unique_ptr<TrainerClient>> retired;
  bool bf16 = false;
  std::string coordinator;
  std::shared_ptr<const RpcCredentials> credentials;
  TrainingConfig config;
  LossScaler scaler;
  uint64_t applied = 0;  // optimizer steps applied (skipped ones excluded)
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Connect(
    const TrainerOptions& options, const ModelDesc& model, const InitFn& init) {
  ZS_RETURN_IF_ERROR(CheckOptions(options));
  const v1::ModelSpec spec = ToSpec(model);
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  TrainingConfig config = DefaultTrainingConfig();
  if (!options.config_path.empty()) {
    auto loaded = LoadTrainingConfig(options.config_path);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("TrainerOptions.config_path: ",
                                       loaded.status().message()));
    }
    config = *loaded;
  }
  RpcClientSecurity security;
  security.tls_ca = options.tls_ca;
  security.tls_cert = options.tls_cert;
  security.tls_key = options.tls_key;
  security.token_file = options.token_file;
  security.token_flag = "token_file";
  auto credentials = RpcCredentials::Load(security);
  if (!credentials.ok()) return credentials.status();
  TrainerClientOptions o;
  o.cluster.credentials = *credentials;
  o.cluster.coordinator = options.coordinator;
  o.cluster.requested_rank = options.rank;
  o.cluster.trainer_id = options.trainer_id;  // "": the cluster's host:pid
  o.cluster.transport = options.transport;
  o.cluster.connect_timeout = absl::Seconds(options.connect_timeout_s);
  o.register_timeout = absl::Seconds(options.connect_timeout_s);
  o.cache.rpc_timeout = absl::Seconds(options.rpc_timeout_s);
  o.push.rpc_timeout = absl::Seconds(options.rpc_timeout_s);
  ApplyTrainingConfig(config, options.prefetch_bytes, &o);
  auto impl = std::make_unique<Impl>(config);
  impl->bf16 = o.bf16;
  impl->coordinator = options.coordinator;
  impl->credentials = *credentials;
  impl->options = o;
  impl->spec = spec;
  ZS_ASSIGN_OR_RETURN(impl->client, TrainerClient::Connect(o, spec, init));
  impl->applied = impl->client->step();
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

uint32_t Trainer::rank() const { return impl_->client->rank(); }
uint32_t Trainer::world_size() const { return impl_->client->world_size(); }
uint32_t Trainer::accumulation_steps() const {
  return impl_->client->accumulation_steps();
}
uint64_t Trainer::step() const { return impl_->client->step(); }
size_t Trainer::num_groups() const { return impl_->client->map().num_groups(); }
size_t Trainer::element_size() const { return impl_->bf16 ? 2 : 4; }
std::string Trainer::transport() const { return impl_->client->transport(); }

uint64_t Trainer::group_elements(size_t group) const {
  const PartitionMap& map = impl_->client->map();
  return group < map.num_groups() ? map.group_numel(group) : 0;
}

absl::StatusOr<const void*> Trainer::Acquire(size_t group) {
  if (group >= num_groups()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown group ", group, " (the model has ", num_groups(), ")"));
  }
  return impl_->client->Acquire(group);
}

absl::Status Trainer::Release(size_t group) {
  if (group >= num_groups()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown group ", group, " (the model has ", num_groups(), ")"));
  }
  return impl_->client->Release(group);
}

absl::Status Trainer::PushGradient(size_t group, const void* grad,
                                   uint32_t micro_step) {
  ZS_RETURN_IF_ERROR(CheckPush(group, grad, micro_step));
  return impl_->client->PushGradient(group, grad, micro_step);
}

absl::Status Trainer::CheckPush(size_t group, const void* grad,
                                uint32_t micro_step) const {
  if (group >= num_groups()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown group ", group, " (the model has ", num_groups(), ")"));
  }
  if (micro_step >= accumulation_steps()) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-step ", micro_step,
                     " out of range (gradient_accumulation_steps ",
                     accumulation_steps(), ")"));
  }
  if (!grad && impl_->client->map().trainable_numel(group) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "null gradient for group ", group, ", which has trainable tensors"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::PushTrainableGradient(size_t group, const void* grad,
                                            uint32_t micro_step) {
  // The same checks; the client only copies fewer bytes.
  ZS_RETURN_IF_ERROR(CheckPush(group, grad, micro_step));
  return impl_->client->PushTrainableGradient(group, grad, micro_step);
}

uint64_t Trainer::trainable_elements(size_t group) const {
  const PartitionMap& map = impl_->client->map();
  return group < map.num_groups() ? map.trainable_numel(group) : 0;
}

absl::StatusOr<TrainerStepResult> Trainer::EndStep(bool overflow,
                                                   double loss_scale) {
  if (loss_scale < 0) loss_scale = impl_->scaler.scale();
  ZS_ASSIGN_OR_RETURN(StepResult r,
                      impl_->client->EndStep(overflow, loss_scale));
  impl_->scaler.Update(r.skipped);
  if (!r.skipped) ++impl_->applied;
  return TrainerStepResult{r.skipped, r.grad_norm};
}

double Trainer::loss_scale() const { return impl_->scaler.scale(); }

void Trainer::ReportStep(double loss, uint64_t samples, double step_seconds) {
  impl_->client->ReportStep(loss, samples, step_seconds);
}

double Trainer::learning_rate() const {
  return LearningRate(impl_->config, impl_->applied);
}

absl::StatusOr<TrainerCheckpoint> Trainer::RequestCheckpoint(double timeout_s) {
  if (!(timeout_s > 0) || !std::isfinite(timeout_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RequestCheckpoint: timeout_s must be a positive number, got ",
        timeout_s));
  }
  auto stub = v1::AdminService::NewStub(
      impl_->credentials->Channel(impl_->coordinator));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s)));
  v1::RequestCheckpointResponse resp;
  const absl::Status st = FromGrpcStatus(
      stub->RequestCheckpoint(&ctx, v1::RequestCheckpointRequest(), &resp));
  if (!st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("checkpoint (coordinator ", impl_->coordinator,
                                "): ", st.message()));
  }
  TrainerCheckpoint out;
  out.step = resp.step();
  out.base = resp.base();
  out.bytes_written = resp.bytes_written();
  out.directory = resp.directory();
  return out;
}

absl::StatusOr<uint64_t> Trainer::Rejoin(const absl::Status& why,
                                         double timeout_s) {
  if (!(timeout_s > 0) || !std::isfinite(timeout_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rejoin: timeout_s must be a positive number, got ", timeout_s));
  }
  Impl& i = *impl_;
  // Nothing of the old client may land once the new one is admitted; its
  // lent buffers stay where they are.
  i.client->Silence();
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<TrainerClient> fresh,
      RejoinCluster(
          *i.client, why, &i.options, i.spec,
          [](size_t, float*) {
            return absl::InternalError("rejoining verifies the model only");
          },
          absl::Seconds(timeout_s),
          [](const std::string& line) {
            std::cerr << "zshard trainer " << line << "\n";
          }));
  i.coordinator = i.options.cluster.coordinator;
  i.client->Detach();
  i.retired.push_back(std::move(i.client));
  i.client = std::move(fresh);
  i.applied = i.client->step();
  return i.client->resume().step;
}

uint64_t Trainer::joins() const { return impl_->retired.size(); }

std::string Trainer::ResumeState() const {
  return impl_->client->resume().trainer_state;
}

void Trainer::SetResumeState(std::string state) {
  impl_->client->SetTrainerState(std::move(state));
}

TrainerStats Trainer::stats() const {
  const TrainerClientStats s = impl_->client->stats();
  TrainerStats out;
  out.bytes_fetched = s.params.bytes_fetched;
  out.bytes_from_host = s.params.bytes_from_host;
  out.bytes_pushed = s.grads.bytes_pushed;
  out.peak_param_bytes = s.param_bytes;
  out.peak_grad_bytes = s.grad_bytes;
  out.group_fetches = s.params.group_fetches;
  out.prefetch_hits = s.params.prefetch_hits;
  return out;
}

}  // namespace zshard
