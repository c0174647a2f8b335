#include "common/transport/inline/inline_transport_service.h"

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_read_stream.h"
#include "common/transport/inline/inline_transport.h"
#include "common/transport/inline/inline_write_stream.h"

namespace zshard {

namespace {

grpc::ServerUnaryReactor* FinishedCall(grpc::CallbackServerContext* ctx,
                                       const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// One transport call waiting for its handler's answer, which may come on
// any thread, or never (the caller's deadline or cancellation ends the call
// then). The first of the answer and the cancellation finishes the call;
// the state outlives the reactor for an answer that comes after.
class CallReactor : public grpc::ServerUnaryReactor {
 public:
  struct State {
    absl::Mutex mu;
    CallReactor* reactor ABSL_GUARDED_BY(mu);  // null once finished
  };

  explicit CallReactor(v1::TransportMessageResponse* resp)
      : resp_(resp), state_(std::make_shared<State>()) {
    absl::MutexLock lock(&state_->mu);
    state_->reactor = this;
  }

  const std::shared_ptr<State>& state() const { return state_; }

  static void Answer(State& state, absl::StatusOr<std::string> answer) {
    CallReactor* r;
    {
      absl::MutexLock lock(&state.mu);
      r = state.reactor;
      state.reactor = nullptr;
    }
    if (!r) return;  // finished already; the reactor may be gone
    if (answer.ok()) {
      r->resp_->set_reply(std::move(*answer));
      r->Finish(grpc::Status::OK);
    } else {
      r->Finish(ToGrpcStatus(answer.status()));
    }
  }

  void OnCancel() override {
    Answer(*state_, absl::CancelledError("the caller gave up"));
  }
  void OnDone() override { delete this; }

 private:
  v1::TransportMessageResponse* const resp_;
  const std::shared_ptr<State> state_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* InlineTransportService::ReadRegion(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "ReadRegion");
      !denied.ok()) {
    return FailedReadRegionStream(denied);
  }
  transport_->CountReadRegion();
  return StartReadRegionStream(transport_, *request,
                               InlineTransport::kMessageBytes);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* InlineTransportService::WriteRegion(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "WriteRegion");
      !denied.ok()) {
    return FailedWriteRegionStream(denied);
  }
  transport_->CountWriteRegion();
  return StartWriteRegionStream(
      transport_,
      ctx->deadline() != std::chrono::system_clock::time_point::max(),
      response);
}

grpc::ServerUnaryReactor* InlineTransportService::SendMessage(
    grpc::CallbackServerContext* ctx, const v1::TransportMessage* req,
    v1::TransportMessageResponse* resp) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "SendMessage");
      !denied.ok()) {
    return FinishedCall(ctx, denied);
  }
  transport_->CountSendMessage();
  if (!req->call()) {
    return FinishedCall(ctx, ToGrpcStatus(transport_->Deliver(
                                 req->id(), req->header(), req->payload())));
  }
  if (ctx->deadline() == std::chrono::system_clock::time_point::max()) {
    return FinishedCall(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "a transport call needs a deadline"));
  }
  auto* call = new CallReactor(resp);
  absl::Status st = transport_->Answer(
      req->id(), req->header(),
      [state = call->state()](absl::StatusOr<std::string> answer) {
        CallReactor::Answer(*state, std::move(answer));
      });
  if (!st.ok()) CallReactor::Answer(*call->state(), st);
  return call;
}

}  // namespace zshard
