"""Small Hugging Face models built from a config (nothing downloaded), the
batches every rank trains on, and the AdamW the servers apply, mirrored in
torch: shared by the Python trainer script and the tests' references."""

import math
from typing import Dict, Tuple

import torch

VOCAB = 256
CONTEXT = 32


def build(kind: str, layers: int = 6, seed: int = 1) -> torch.nn.Module:
    """A GPT-2 or Llama-architecture model, deterministic from ``seed``."""
    import transformers
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=layers,
            n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
        cls = transformers.GPT2LMHeadModel
    elif kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
            num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=CONTEXT,
            bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(f"unknown model kind {kind}")
    cfg._attn_implementation = "eager"
    model = cls(cfg)
    model.train()
    return model


def batch(rank: int, step: int, micro: int = 0, size: int = 2) -> torch.Tensor:
    """Rank ``rank``'s tokens for (step, micro-step): the same everywhere."""
    g = torch.Generator().manual_seed(1000003 * rank + 7919 * step + micro)
    return torch.randint(0, VOCAB, (size, CONTEXT), generator=g)


def loss_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


class KernelAdamW:
    """The servers' AdamW (kernels/reference/adamw_element.h), op for op in
    float32: m = b1 m + (1-b1) g; v = b2 v + ((1-b2) g) g; p = p (1 - lr wd)
    - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), with g the mean of the
    contributions."""

    def __init__(self, params: Dict[str, torch.Tensor], lr: float,
                 betas: Tuple[float, float], eps: float,
                 weight_decay: float) -> None:
        self.p = params
        self.m = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in params.items()}
        self.lr, self.b1, self.b2 = f32(lr), f32(betas[0]), f32(betas[1])
        self.eps, self.wd = f32(eps), f32(weight_decay)
        self.t = 0

    def step(self, grads: Dict[str, torch.Tensor]) -> None:
        self.t += 1
        t32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
        b1, b2 = t32(self.b1), t32(self.b2)
        omb1, omb2 = t32(1.0) - b1, t32(1.0) - b2
        bc1 = 1.0 - self.b1 ** self.t
        bc2 = 1.0 - self.b2 ** self.t
        step_size = t32(self.lr / bc1)
        inv_sqrt_bc2 = t32(1.0 / math.sqrt(bc2))
        decay = t32(1.0) - t32(self.lr) * t32(self.wd)
        eps = t32(self.eps)
        for k, g in grads.items():
            m = b1 * self.m[k] + omb1 * g
            v = b2 * self.v[k] + (omb2 * g) * g
            self.m[k], self.v[k] = m, v
            # torch's float sqrt is not correctly rounded (the kernels'
            # is); in double, then rounded, it is.
            root = torch.sqrt(v.double()).float()
            denom = root * inv_sqrt_bc2 + eps
            self.p[k] = self.p[k] * decay - (step_size * m) / denom
