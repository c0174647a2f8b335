"""Models whose parameters are never all materialized on a trainer.

``empty_parameters()`` builds a model with every parameter on the ``meta``
device (buffers stay real), like accelerate's ``init_empty_weights``; the
engine then gives each parameter real storage only while its group runs.
Rank 0 takes the initial values group by group from ``init_from``: a
safetensors file (read one tensor at a time), a state dict, or a function
of the parameter's name.
"""

import contextlib
import os
from typing import Any, Callable, Dict, Iterator, Mapping, Union

import torch
from torch import nn

from .errors import invalid_argument

InitFrom = Union[None, str, os.PathLike, Mapping[str, torch.Tensor],
                 Callable[[str], torch.Tensor]]


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Inside the block, every parameter a module registers is moved to the
    meta device (no storage); a parameter already on meta (a tied one being
    assigned again) is kept as it is."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"),
                                 requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


class ValueSource:
    """Where rank 0 reads a parameter's initial value from; get() returns
    a float32 tensor of the registered shape or raises INVALID_ARGUMENT
    naming the parameter."""

    def __init__(self, init_from: InitFrom) -> None:
        self._file = None
        self._map: Dict[str, torch.Tensor] = {}
        self._fn = None
        self._what = "init_from"
        if init_from is None:
            return
        if isinstance(init_from, (str, os.PathLike)):
            path = os.fspath(init_from)
            if os.path.isdir(path):
                path = os.path.join(path, "model.safetensors")
            try:
                from safetensors import safe_open
            except ImportError as e:
                raise invalid_argument(
                    f"init_from {path}: reading safetensors needs the "
                    f"safetensors package ({e})") from None
            try:
                self._file = safe_open(path, framework="pt")
            except Exception as e:  # the library raises several kinds
                raise invalid_argument(f"init_from {path}: {e}") from None
            self._keys = set(self._file.keys())
            self._what = f"init_from {path}"
        elif isinstance(init_from, Mapping):
            self._map = dict(init_from)
        elif callable(init_from):
            self._fn = init_from
        else:
            raise invalid_argument(
                "init_from: expected a safetensors path, a state dict or a "
                f"function of the name, got {type(init_from).__name__}")

    def __bool__(self) -> bool:
        return bool(self._file is not None or self._map or self._fn)

    def get(self, name: str, shape: torch.Size) -> torch.Tensor:
        if self._file is not None:
            if name not in self._keys:
                raise invalid_argument(f"{self._what}: no tensor {name}")
            value = self._file.get_tensor(name)
        elif self._fn is not None:
            value = self._fn(name)
        elif name in self._map:
            value = self._map[name]
        else:
            raise invalid_argument(f"{self._what}: no tensor {name}")
        if not isinstance(value, torch.Tensor):
            raise invalid_argument(f"{self._what}: {name} is not a tensor")
        if tuple(value.shape) != tuple(shape):
            raise invalid_argument(
                f"{self._what}: {name} has shape {tuple(value.shape)}, the "
                f"model's is {tuple(shape)}")
        return value.detach().to(torch.float32)


def replace_meta_parameters(model: nn.Module) -> Dict[int, nn.Parameter]:
    """Gives every meta parameter of ``model`` an empty CPU parameter in its
    place (in every module that holds it, so ties stay tied). Returns the
    replacements by the old parameter's id."""
    new: Dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            if id(p) not in new:
                new[id(p)] = nn.Parameter(torch.empty(0, dtype=p.dtype),
                                          requires_grad=p.requires_grad)
            module._parameters[name] = new[id(p)]
    return new
