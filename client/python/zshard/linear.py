"""A linear layer whose backward reads the weight parameter itself.

``torch.nn.functional.linear`` saves ``weight.t()`` for backward: a view of
the storage the weight had during forward. zshard gives that storage back
after the group's forward and binds the parameter to freshly fetched memory
before its backward, so a saved view would keep the forward's memory alive
(and the whole model resident). This function saves the parameter (a leaf,
which follows its rebinding) instead, as DeepSpeed's ZeRO-3 does. The
engine installs it while a managed module runs forward.
"""

import contextlib
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F

_original_linear = F.linear


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, weight, bias)
        return _original_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor
                 ) -> Tuple[Optional[torch.Tensor], ...]:
        x, weight, bias = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(weight)
        if ctx.needs_input_grad[1]:
            g2 = grad.reshape(-1, grad.shape[-1])
            grad_w = g2.t().matmul(x.reshape(-1, x.shape[-1]))
        if bias is not None and ctx.needs_input_grad[2]:
            grad_b = grad.reshape(-1, grad.shape[-1]).sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear`` with a backward that reads ``weight`` as a leaf."""
    if torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad):
        return _Linear.apply(x, weight, bias)
    return _original_linear(x, weight, bias)


class _Installed:
    depth = 0


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Replaces ``torch.nn.functional.linear`` with ``linear`` inside the
    block (re-entrant; restored on exit)."""
    if _Installed.depth == 0:
        F.linear = linear
    _Installed.depth += 1
    try:
        yield
    finally:
        _Installed.depth -= 1
        if _Installed.depth == 0:
            F.linear = _original_linear
