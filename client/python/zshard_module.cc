// _zshard: the Python binding of the public Trainer
// (client/include/zshard/client/trainer.h). Parameters cross as buffers that
// view the client's memory (no copy, no libtorch), gradients as any
// contiguous buffer of the right size. Every call that waits releases the
// GIL; a Status that is not OK becomes zshard.errors.ZShardError carrying
// the status code's name and message.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/mutex_mode.h"
#include "zshard/client/trainer.h"

namespace py = pybind11;

namespace zshard {
namespace {

// Raises zshard.errors.ZShardError(message, code) for a failed status.
[[noreturn]] void Raise(const absl::Status& st) {
  const std::string code = absl::StatusCodeToString(st.code());
  py::object error = py::module_::import("zshard.errors").attr("ZShardError");
  PyErr_SetObject(
      error.ptr(),
      py::make_tuple(absl::StrCat(code, ": ", st.message()), code).ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& st) {
  if (!st.ok()) Raise(st);
}

template <typename T>
T Take(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// One group's acquired parameters: a writable buffer over the client's
// memory (writes are local to this trainer and never reach the servers),
// valid until release() or until the object is collected, whichever comes
// first. Holds the trainer alive. Thread-compatible (under the GIL).
class Lease {
 public:
  Lease(std::shared_ptr<Trainer> trainer, size_t group, const void* data,
        size_t bytes)
      : trainer_(std::move(trainer)),
        joins_(trainer_->joins()),
        group_(group),
        data_(const_cast<void*>(data)),
        bytes_(bytes) {}
  ~Lease() {
    // Collected without release(): give the group back; an error here has
    // no caller to go to and the servers end the lease on their own.
    if (trainer_ && trainer_->joins() == joins_) {
      trainer_->Release(group_).IgnoreError();
    }
  }

  void Release() {
    if (!trainer_) return;
    std::shared_ptr<Trainer> t = std::move(trainer_);
    // Acquired before a rejoin: the client it came from is given up.
    if (t->joins() == joins_) Check(t->Release(group_));
  }
  bool released() const { return trainer_ == nullptr; }
  size_t group() const { return group_; }

  py::buffer_info Buffer() const {
    if (!trainer_) {
      Raise(absl::FailedPreconditionError(
          absl::StrCat("group ", group_, "'s parameters were released")));
    }
    return py::buffer_info(data_, 1, py::format_descriptor<uint8_t>::format(),
                           1, {static_cast<py::ssize_t>(bytes_)}, {1},
                           /*readonly=*/false);
  }

 private:
  std::shared_ptr<Trainer> trainer_;
  const uint64_t joins_;  // the trainer's joins() when acquired
  const size_t group_;
  void* const data_;
  const size_t bytes_;
};

// Model description from Python: [(group_name, [(tensor_name, shape,
// trainable), ...]), ...].
using PyTensor = std::tuple<std::string, std::vector<int64_t>, bool>;
using PyGroup = std::pair<std::string, std::vector<PyTensor>>;

ModelDesc ToModel(const std::string& name, const std::vector<PyGroup>& groups) {
  ModelDesc model;
  model.name = name;
  for (const auto& [gname, tensors] : groups) {
    GroupDesc g;
    g.name = gname;
    for (const auto& [tname, shape, trainable] : tensors) {
      g.tensors.push_back(TensorDesc{tname, shape, trainable});
    }
    model.groups.push_back(std::move(g));
  }
  return model;
}

// init(group, out): fills out (a writable memoryview of group_elements(group)
// fp32 values) on rank 0. Called with the GIL taken again.
using PyInit = std::function<void(size_t, py::memoryview)>;

std::shared_ptr<Trainer> Connect(
    const std::string& coordinator, const std::string& model_name,
    const std::vector<PyGroup>& groups, const PyInit& init, int rank,
    const std::string& trainer_id, const std::string& config_path,
    const std::string& transport, int64_t prefetch_bytes,
    double connect_timeout_s, double rpc_timeout_s, const std::string& tls_ca,
    const std::string& tls_cert, const std::string& tls_key,
    const std::string& token_file) {
  TrainerOptions o;
  o.tls_ca = tls_ca;
  o.tls_cert = tls_cert;
  o.tls_key = tls_key;
  o.token_file = token_file;
  o.coordinator = coordinator;
  o.rank = rank;
  o.trainer_id = trainer_id;
  o.config_path = config_path;
  o.transport = transport;
  o.prefetch_bytes = prefetch_bytes;
  o.connect_timeout_s = connect_timeout_s;
  o.rpc_timeout_s = rpc_timeout_s;
  const ModelDesc model = ToModel(model_name, groups);
  std::vector<uint64_t> numel;
  for (const GroupDesc& g : model.groups) {
    uint64_t n = 0;
    for (const TensorDesc& t : g.tensors) {
      uint64_t e = 1;
      for (int64_t d : t.shape) e *= static_cast<uint64_t>(d < 0 ? 0 : d);
      n += e;
    }
    numel.push_back(n);
  }
  Trainer::InitFn fill = [&](size_t g, float* out) -> absl::Status {
    py::gil_scoped_acquire gil;
    try {
      init(g, py::memoryview::from_buffer(
                  out, {static_cast<py::ssize_t>(numel[g])},
                  {static_cast<py::ssize_t>(sizeof(float))}));
    } catch (py::error_already_set& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("initial values of group ", g, ": ", e.what()));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<Trainer>> t;
  {
    py::gil_scoped_release nogil;
    t = Trainer::Connect(o, model, fill);
  }
  return std::shared_ptr<Trainer>(Take(std::move(t)));
}

std::unique_ptr<Lease> Acquire(const std::shared_ptr<Trainer>& t,
                               size_t group) {
  absl::StatusOr<const void*> data;
  {
    py::gil_scoped_release nogil;
    data = t->Acquire(group);
  }
  const void* p = Take(std::move(data));
  return std::make_unique<Lease>(t, group, p,
                                 t->group_elements(group) * t->element_size());
}

// push_gradient(group, grad, micro_step, trainable_only): `grad` is the
// group's flat gradient, or with trainable_only just its trainable
// elements in order; None for a wholly frozen group.
void PushGradient(Trainer& t, size_t group, const py::object& grad,
                  uint32_t micro_step, bool trainable_only) {
  if (group >= t.num_groups()) {
    Raise(absl::NotFoundError(absl::StrCat(
        "unknown group ", group, " (the model has ", t.num_groups(), ")")));
  }
  if (grad.is_none()) {  // a wholly frozen group: nothing to read
    py::gil_scoped_release nogil;
    Check(t.PushGradient(group, nullptr, micro_step));
    return;
  }
  const py::buffer_info info =
      py::reinterpret_borrow<py::buffer>(grad).request();
  const uint64_t elements =
      trainable_only ? t.trainable_elements(group) : t.group_elements(group);
  const size_t want = elements * t.element_size();
  const size_t got = static_cast<size_t>(info.size * info.itemsize);
  bool contiguous = true;
  py::ssize_t stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != stride) contiguous = false;
    stride *= info.shape[d];
  }
  if (!contiguous || got != want) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "gradient of group ", group, ": expected a contiguous buffer of ", want,
        " bytes (", elements, trainable_only ? " trainable" : "",
        " elements of ", t.element_size(), " bytes), got ", got,
        contiguous ? " bytes" : " bytes, not contiguous")));
  }
  py::gil_scoped_release nogil;
  Check(trainable_only ? t.PushTrainableGradient(group, info.ptr, micro_step)
                       : t.PushGradient(group, info.ptr, micro_step));
}

py::tuple EndStep(Trainer& t, bool overflow) {
  absl::StatusOr<TrainerStepResult> r;
  {
    py::gil_scoped_release nogil;
    r = t.EndStep(overflow);
  }
  const TrainerStepResult done = Take(std::move(r));
  return py::make_tuple(done.skipped, done.grad_norm);
}

// The status code named `code` ("UNAVAILABLE", ...; UNKNOWN otherwise).
absl::StatusCode CodeNamed(const std::string& code) {
  for (int c = 0; c <= 16; ++c) {
    const auto candidate = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(candidate) == code) return candidate;
  }
  return absl::StatusCode::kUnknown;
}

uint64_t Rejoin(Trainer& t, const std::string& code, const std::string& why,
                double timeout_s) {
  absl::StatusOr<uint64_t> r;
  {
    py::gil_scoped_release nogil;
    r = t.Rejoin(absl::Status(CodeNamed(code), why), timeout_s);
  }
  return Take(std::move(r));
}

py::dict RequestCheckpoint(Trainer& t, double timeout_s) {
  absl::StatusOr<TrainerCheckpoint> r;
  {
    py::gil_scoped_release nogil;
    r = t.RequestCheckpoint(timeout_s);
  }
  const TrainerCheckpoint c = Take(std::move(r));
  py::dict d;
  d["step"] = c.step;
  d["base"] = c.base;
  d["bytes_written"] = c.bytes_written;
  d["directory"] = c.directory;
  return d;
}

py::dict Stats(const Trainer& t) {
  const TrainerStats s = t.stats();
  py::dict d;
  d["bytes_fetched"] = s.bytes_fetched;
  d["bytes_from_host"] = s.bytes_from_host;
  d["bytes_pushed"] = s.bytes_pushed;
  d["peak_param_bytes"] = s.peak_param_bytes;
  d["peak_grad_bytes"] = s.peak_grad_bytes;
  d["group_fetches"] = s.group_fetches;
  d["prefetch_hits"] = s.prefetch_hits;
  return d;
}

}  // namespace
}  // namespace zshard

PYBIND11_MODULE(_zshard, m) {
  using zshard::Lease;
  using zshard::Trainer;
  m.doc() = "zshard's trainer library (C++), bound for the zshard package";
  // Debian's abseil checks every lock order at run time; the binaries turn
  // that off in main, the module once when it is imported.
  zshard::DisableMutexDeadlockDetection();

  py::class_<Lease>(m, "Lease", py::buffer_protocol())
      .def_buffer(&Lease::Buffer)
      .def("release", &Lease::Release,
           "Gives the group back; its buffer must not be used afterwards.")
      .def_property_readonly("released", &Lease::released)
      .def_property_readonly("group", &Lease::group);

  py::class_<Trainer, std::shared_ptr<Trainer>>(m, "Trainer")
      .def(py::init(&zshard::Connect), py::arg("coordinator"),
           py::arg("model_name"), py::arg("groups"), py::arg("init"),
           py::arg("rank") = -1, py::arg("trainer_id") = "",
           py::arg("config_path") = "", py::arg("transport") = "",
           py::arg("prefetch_bytes") = -1, py::arg("connect_timeout_s") = 60.0,
           py::arg("rpc_timeout_s") = 30.0, py::arg("tls_ca") = "",
           py::arg("tls_cert") = "", py::arg("tls_key") = "",
           py::arg("token_file") = "")
      .def_property_readonly("rank", &Trainer::rank)
      .def_property_readonly("world_size", &Trainer::world_size)
      .def_property_readonly("accumulation_steps", &Trainer::accumulation_steps)
      .def_property_readonly("step", &Trainer::step)
      .def_property_readonly("num_groups", &Trainer::num_groups)
      .def_property_readonly("element_size", &Trainer::element_size)
      .def_property_readonly("transport", &Trainer::transport)
      .def_property_readonly("loss_scale", &Trainer::loss_scale)
      .def_property_readonly("learning_rate", &Trainer::learning_rate)
      .def("group_elements", &Trainer::group_elements)
      .def("acquire", &zshard::Acquire)
      .def("push_gradient", &zshard::PushGradient, py::arg("group"),
           py::arg("grad"), py::arg("micro_step") = 0,
           py::arg("trainable_only") = false)
      .def("trainable_elements", &Trainer::trainable_elements)
      .def("end_step", &zshard::EndStep, py::arg("overflow") = false)
      .def("set_resume_state",
           [](Trainer& t, std::string s) { t.SetResumeState(std::move(s)); })
      .def("resume_state",
           [](const Trainer& t) { return py::bytes(t.ResumeState()); })
      .def("rejoin", &zshard::Rejoin, py::arg("code"), py::arg("why"),
           py::arg("timeout_s"),
           "After a failure (`code`, `why`): joins the cluster again as this "
           "process and rank and returns the step it rolled back to; raises "
           "ZShardError when it did not roll back.")
      .def("report_step", &Trainer::ReportStep, py::arg("loss"),
           py::arg("samples"), py::arg("step_seconds"),
           "Tells shard 0's status page and metrics how the step that "
           "end_step just finished went; never blocks.")
      .def("request_checkpoint", &zshard::RequestCheckpoint,
           py::arg("timeout_s") = 600.0)
      .def("stats", &zshard::Stats);
}
