#include "client/examples/gpt_model.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

void AddTensor(v1::GroupSpec* g, const std::string& name,
               std::vector<int64_t> shape) {
  auto* t = g->add_tensors();
  t->set_name(name);
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(v1::FLOAT32);
  t->set_trainable(true);
}

// Standard normal from two uniforms (Box-Muller) of a fixed generator, so the
// values do not depend on the standard library's distribution code.
float Normal(std::mt19937_64& rng) {
  constexpr double kTwoPi = 6.283185307179586;
  const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(kTwoPi * u2));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& c) {
  if (c.vocab <= 0) return absl::InvalidArgumentError("gpt: vocab must be > 0");
  if (c.context <= 0)
    return absl::InvalidArgumentError("gpt: context must be > 0");
  if (c.layers <= 0)
    return absl::InvalidArgumentError("gpt: layers must be > 0");
  if (c.heads <= 0 || c.d_model <= 0 || c.d_model % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt: d_model (", c.d_model,
                     ") must be a positive multiple of heads (", c.heads, ")"));
  }
  return std::unique_ptr<GptModel>(new GptModel(c));
}

GptModel::GptModel(const GptConfig& c) : config_(c) {
  const int64_t d = c.d_model;
  spec_.set_name(absl::StrCat("gpt-char-v", c.vocab, "-t", c.context, "-d", d,
                              "-l", c.layers, "-h", c.heads));
  auto* embed = spec_.add_groups();
  embed->set_name("embed");
  AddTensor(embed, "wte", {c.vocab, d});
  AddTensor(embed, "wpe", {c.context, d});
  for (int64_t l = 0; l < c.layers; ++l) {
    auto* b = spec_.add_groups();
    const std::string p = absl::StrCat("h", l, ".");
    b->set_name(absl::StrCat("block", l));
    AddTensor(b, p + "ln1.w", {d});
    AddTensor(b, p + "ln1.b", {d});
    AddTensor(b, p + "attn.qkv.w", {3 * d, d});
    AddTensor(b, p + "attn.qkv.b", {3 * d});
    AddTensor(b, p + "attn.proj.w", {d, d});
    AddTensor(b, p + "attn.proj.b", {d});
    AddTensor(b, p + "ln2.w", {d});
    AddTensor(b, p + "ln2.b", {d});
    AddTensor(b, p + "mlp.fc.w", {4 * d, d});
    AddTensor(b, p + "mlp.fc.b", {4 * d});
    AddTensor(b, p + "mlp.proj.w", {d, 4 * d});
    AddTensor(b, p + "mlp.proj.b", {d});
  }
  auto* head = spec_.add_groups();
  head->set_name("head");
  AddTensor(head, "lnf.w", {d});
  AddTensor(head, "lnf.b", {d});
  AddTensor(head, "lm_head.w", {c.vocab, d});
}

uint64_t GptModel::num_parameters() const {
  uint64_t n = 0;
  for (const auto& g : spec_.groups()) n += GroupNumel(g);
  return n;
}

absl::Status GptModel::Init(size_t g, float* out) const {
  if (g >= static_cast<size_t>(spec_.groups_size())) {
    return absl::NotFoundError(absl::StrCat("gpt: no group ", g));
  }
  const uint64_t key[2] = {config_.seed, g};
  std::mt19937_64 rng(Fnv1a64(key, sizeof(key)));
  const float residual_std =
      0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  for (const auto& t : spec_.groups(static_cast<int>(g)).tensors()) {
    const uint64_t n = TensorNumel(t);
    const std::string& name = t.name();
    auto ends_with = [&name](const std::string& s) {
      return name.size() >= s.size() &&
             name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with(".b")) {
      std::fill(out, out + n, 0.0f);
    } else if (ends_with("ln1.w") || ends_with("ln2.w") || name == "lnf.w") {
      std::fill(out, out + n, 1.0f);
    } else {
      const float std = ends_with("proj.w") ? residual_std : 0.02f;
      for (uint64_t i = 0; i < n; ++i) out[i] = std * Normal(rng);
    }
    out += n;
  }
  return absl::OkStatus();
}

torch::Tensor GptModel::Block(const std::vector<torch::Tensor>& p,
                              const torch::Tensor& x) const {
  namespace F = torch::nn::functional;
  const int64_t d = config_.d_model, h = config_.heads, hd = d / h;
  const int64_t b = x.size(0), t = x.size(1);
  torch::Tensor a = torch::layer_norm(x, {d}, p[0], p[1]);
  torch::Tensor qkv = torch::linear(a, p[2], p[3]);
  auto parts = qkv.split(d, 2);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, h, hd}).transpose(1, 2);
  };
  torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) /
                      std::sqrt(static_cast<double>(hd));
  torch::Tensor mask = torch::ones({t, t}, torch::kBool).tril().logical_not();
  att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, d});
  torch::Tensor h1 = x + torch::linear(y, p[4], p[5]);
  torch::Tensor m = torch::layer_norm(h1, {d}, p[6], p[7]);
  m = torch::gelu(torch::linear(m, p[8], p[9]));
  return h1 + torch::linear(m, p[10], p[11]);
}

torch::Tensor GptModel::Forward(size_t g, const std::vector<torch::Tensor>& p,
                                const torch::Tensor& input) const {
  const size_t last = static_cast<size_t>(spec_.groups_size()) - 1;
  if (g == 0) {
    const int64_t t = input.size(1);
    return torch::embedding(p[0], input) + p[1].slice(0, 0, t);
  }
  if (g == last) {
    torch::Tensor x = torch::layer_norm(input, {config_.d_model}, p[0], p[1]);
    return torch::linear(x, p[2]);
  }
  return Block(p, input);
}

torch::Tensor GptModel::Loss(const torch::Tensor& output,
                             const torch::Tensor& target) const {
  return torch::cross_entropy_loss(output.reshape({-1, output.size(-1)}),
                                   target.reshape({-1}));
}

}  // namespace zshard
