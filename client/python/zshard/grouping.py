"""How a torch.nn.Module becomes zshard groups (the fetch unit).

Like FSDP's auto-wrap policy / DeepSpeed's ``transformer_layer_cls_to_wrap``:
one group per module of the named classes, or by default one per repeated
block (the children of a ``ModuleList`` whose entries share one class, e.g.
GPT-2's ``transformer.h`` or Llama's ``model.layers``); every parameter in
none of them goes to a ``root`` group.
"""

from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .errors import invalid_argument

WrapClasses = Optional[Sequence[Union[str, type]]]


@dataclass
class Group:
    """One group: its modules and its parameters, in registration order."""
    name: str
    modules: List[nn.Module]
    # (qualified name, parameter), each parameter in exactly one group.
    params: List[Tuple[str, nn.Parameter]] = field(default_factory=list)


def _matches(module: nn.Module, classes: Sequence[Union[str, type]]) -> bool:
    for c in classes:
        if isinstance(c, str):
            if type(module).__name__ == c:
                return True
        elif isinstance(module, c):
            return True
    return False


def _repeated_blocks(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """The children of every outermost ModuleList of >= 2 same-class
    modules that hold parameters."""
    blocks: List[Tuple[str, nn.Module]] = []
    taken: List[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(child) for child in module}
        if len(kinds) != 1:
            continue
        if not any(True for _ in module[0].parameters()):
            continue
        taken.append(name)
        blocks.extend((f"{name}.{i}" if name else str(i), child)
                      for i, child in enumerate(module))
    return blocks


def _wrapped(model: nn.Module,
             classes: Sequence[Union[str, type]]) -> List[Tuple[str, nn.Module]]:
    found: List[Tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if module is model:
            continue
        if any(name.startswith(f + ".") for f, _ in found):
            continue
        if _matches(module, classes):
            found.append((name, module))
    if not found:
        names = [c if isinstance(c, str) else c.__name__ for c in classes]
        raise invalid_argument(
            f"wrap_classes {names}: no module of these classes in the model")
    return found


def make_groups(model: nn.Module, wrap_classes: WrapClasses = None) -> List[Group]:
    """Splits ``model``'s parameters into groups: ``root`` (if it has any)
    first, then the blocks in module order. Tied parameters appear once, in
    the first group that reaches them."""
    if wrap_classes:
        blocks = _wrapped(model, wrap_classes)
    else:
        blocks = _repeated_blocks(model)
    groups = [Group(name, [module]) for name, module in blocks]
    seen = set()
    for group in groups:
        prefix = group.name + "."
        for pname, p in group.modules[0].named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            group.params.append((prefix + pname, p))
    root = Group("root", [model])
    for pname, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            root.params.append((pname, p))
    out = ([root] if root.params else []) + [g for g in groups if g.params]
    if not out:
        raise invalid_argument("the model has no parameters")
    return out


def check_dtypes(groups: Iterable[Group]) -> None:
    """Raises INVALID_ARGUMENT naming the first parameter zshard cannot
    train (not a float32 / bfloat16 / float16 tensor on the CPU or meta)."""
    for group in groups:
        for name, p in group.params:
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise invalid_argument(
                    f"parameter {name}: unsupported dtype {p.dtype} (zshard "
                    "keeps float32 masters; parameters must be float32, "
                    "bfloat16 or float16)")
            if p.device.type not in ("cpu", "meta"):
                raise invalid_argument(
                    f"parameter {name}: on {p.device}; the Python trainer "
                    "computes on the CPU")
