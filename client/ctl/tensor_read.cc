#include "client/ctl/tensor_read.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"
#include "common/model/partition_map.h"
#include "zshard/kernels/cast.h"
#include "zshard/v1/admin.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {
namespace {

// Elements per ReadValues call (ShardStore::kMaxReadElements).
constexpr uint64_t kChunk = 4 << 20;

struct Located {
  uint32_t group = 0;
  uint64_t offset = 0;  // of the tensor's first element in the group
  uint64_t numel = 0;
  std::vector<int64_t> shape;
};

absl::StatusOr<Located> Locate(const v1::ModelSpec& spec,
                               const std::string& name) {
  std::vector<std::string> some;
  for (int g = 0; g < spec.groups_size(); ++g) {
    uint64_t offset = 0;
    for (const auto& t : spec.groups(g).tensors()) {
      if (t.name() == name) {
        Located l;
        l.group = static_cast<uint32_t>(g);
        l.offset = offset;
        l.numel = TensorNumel(t);
        l.shape.assign(t.shape().begin(), t.shape().end());
        return l;
      }
      if (some.size() < 5) some.push_back(t.name());
      offset += TensorNumel(t);
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no tensor named '", name, "' in model '", spec.name(), "' (e.g. ",
      absl::StrJoin(some, ", "), "; zshardctl tensors lists them all)"));
}

void Stats(TensorValues* t) {
  double sum = 0, squares = 0;
  uint64_t finite = 0;
  t->min = std::numeric_limits<double>::infinity();
  t->max = -t->min;
  for (float v : t->values) {
    if (std::isnan(v)) {
      ++t->nan;
    } else if (std::isinf(v)) {
      ++t->inf;
    } else {
      ++finite;
      sum += v;
      squares += static_cast<double>(v) * v;
      t->min = std::min<double>(t->min, v);
      t->max = std::max<double>(t->max, v);
    }
  }
  if (finite == 0) t->min = t->max = 0;
  t->mean = finite ? sum / static_cast<double>(finite) : 0;
  t->norm = std::sqrt(squares);
}

// Reads shard `s`'s part of [lo, hi) (global offsets in `group`) into
// out->values (which start at lo) at *version; a 0 *version becomes the
// version the shard answers with.
absl::Status ReadShard(const TensorReadOptions& o, uint32_t s,
                       const std::string& endpoint, const Slice& slice,
                       uint32_t group, uint64_t lo, uint64_t hi,
                       uint64_t* version, TensorValues* out) {
  const uint64_t b = std::max(lo, slice.begin), e = std::min(hi, slice.end);
  if (b >= e) return absl::OkStatus();
  if (endpoint.empty()) {
    return absl::UnavailableError(
        absl::StrCat("shard ", s, " holds part of '", o.name,
                     "' but has not announced itself to shard 0"));
  }
  auto stub = v1::AdminService::NewStub(o.credentials->Channel(endpoint));
  const size_t es = o.bf16 ? 2 : 4;
  for (uint64_t c = b; c < e; c += kChunk) {
    v1::ReadValuesRequest req;
    req.set_group(group);
    req.set_version(*version);
    req.set_begin(c);
    req.set_end(std::min(e, c + kChunk));
    req.set_dtype(o.bf16 ? v1::BFLOAT16 : v1::FLOAT32);
    v1::ReadValuesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.timeout));
    absl::Status st = FromGrpcStatus(stub->ReadValues(&ctx, req, &resp));
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("shard ", s, " (", endpoint,
                                                  "): ", st.message()));
    }
    const uint64_t n = req.end() - req.begin();
    if (resp.values().size() != n * es) {
      return absl::DataLossError(absl::StrCat("shard ", s, " sent ",
                                              resp.values().size(),
                                              " bytes for ", n, " values"));
    }
    *version = resp.version();
    out->version = resp.version();
    float* dst = out->values.data() + (c - lo);
    if (o.bf16) {
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, resp.values().data() + 2 * i, 2);
        dst[i] = kernels::Bf16BitsToFp32(h);
      }
    } else {
      std::memcpy(dst, resp.values().data(), n * 4);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRange(const std::string& text, uint64_t* begin,
                        uint64_t* end) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--range: expected A:B, got '", text, "'"));
  }
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  *begin = 0;
  *end = 0;
  if ((!a.empty() && !absl::SimpleAtoi(a, begin)) ||
      (!b.empty() && !absl::SimpleAtoi(b, end)) ||
      (!b.empty() && *end <= *begin)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--range: expected A:B with 0 <= A < B (element offsets), got '", text,
        "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorValues> ReadTensor(const TensorReadOptions& o) {
  auto deadline = [&o] { return absl::ToChronoTime(absl::Now() + o.timeout); };
  auto channel = o.credentials->Channel(o.server);
  v1::GetLayoutResponse layout;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ZS_RETURN_IF_ERROR(
        FromGrpcStatus(v1::ShardService::NewStub(channel)->GetLayout(
            &ctx, v1::GetLayoutRequest(), &layout)));
  }
  if (!layout.registered()) {
    return absl::FailedPreconditionError("no model is registered yet");
  }
  ZS_ASSIGN_OR_RETURN(Located at, Locate(layout.spec(), o.name));
  const uint64_t end = o.end == 0 ? at.numel : o.end;
  if (o.begin >= end || end > at.numel) {
    return absl::OutOfRangeError(
        absl::StrCat("--range: [", o.begin, ", ", end, ") is outside '", o.name,
                     "', which has ", at.numel, " elements"));
  }
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(layout.spec(), layout.layout().num_shards(),
                           layout.layout().alignment(),
                           layout.layout().persistence_threshold()));
  v1::GetStatusResponse status;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ZS_RETURN_IF_ERROR(
        FromGrpcStatus(v1::AdminService::NewStub(channel)->GetStatus(
            &ctx, v1::GetStatusRequest(), &status)));
  }
  std::vector<std::string> endpoints(map.num_shards());
  for (const auto& e : status.shards()) {
    if (e.shard_id() < endpoints.size()) endpoints[e.shard_id()] = e.endpoint();
  }
  if (endpoints[0].empty()) endpoints[0] = o.server;
  TensorValues out;
  out.name = o.name;
  out.shape = at.shape;
  out.group = at.group;
  out.begin = o.begin;
  out.end = end;
  out.values.assign(end - o.begin, 0.0f);
  // The version to read: asked for, or the newest the first shard holding
  // part of the tensor has (the others hold it or the one after; should one
  // have moved on meanwhile, the read starts again, at most 3 times).
  const uint64_t lo = at.offset + o.begin, hi = at.offset + end;
  auto read_all = [&](uint64_t version) -> absl::Status {
    for (uint32_t s = 0; s < map.num_shards(); ++s) {
      ZS_RETURN_IF_ERROR(ReadShard(o, s, endpoints[s], map.slice(at.group, s),
                                   at.group, lo, hi, &version, &out));
    }
    return absl::OkStatus();
  };
  absl::Status st = read_all(o.step);
  for (int attempt = 1;
       o.step == 0 && attempt < 3 && absl::IsFailedPrecondition(st);
       ++attempt) {
    st = read_all(0);
  }
  ZS_RETURN_IF_ERROR(st);
  Stats(&out);
  return out;
}

}  // namespace zshard
