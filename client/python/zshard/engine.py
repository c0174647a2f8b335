"""ZShardEngine: a torch.nn.Module trained through the shard servers.

ZeRO-3 on the trainer side, driven by module hooks:

* forward: before a group's module runs, its parameters are acquired (the
  prefetcher has usually fetched them already) and each parameter is bound
  to a zero-copy view of the client's memory; after it, they are given back
  and hold no storage;
* backward: an identity autograd function on the group's outputs acquires
  the group again just before its backward; once every trainable parameter
  of the group has its gradient, the group's flat gradient is pushed (the
  push continues in the background) and the group is given back, while
  backward goes on with the groups before it;
* the root group (parameters outside the blocks: embeddings, final norm,
  head) is held from the model's forward to the end of its backward.

Thread-safety: one engine per training loop, called from one thread (the
autograd engine runs CPU backward on the caller's thread).
"""

import ctypes
import os
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import _zshard
from . import linear as zlinear
from .config import ConfigArg, load_config
from .errors import (RolledBack, ZShardError, failed_precondition,
                     invalid_argument)
from .grouping import Group, WrapClasses, check_dtypes, make_groups
from .materialize import InitFrom, ValueSource, replace_meta_parameters


def _as_buffer(t: torch.Tensor) -> Any:
    """A writable buffer over a contiguous CPU tensor's bytes (valid while
    ``t`` lives); needs no numpy."""
    n = t.numel() * t.element_size()
    return (ctypes.c_ubyte * n).from_address(t.data_ptr())


def _return_freed_memory() -> None:
    """Gives the model's freed parameter memory back to the system (glibc
    keeps freed heap pages otherwise, and the trainer would go on looking as
    big as the whole model). A no-op where malloc_trim does not exist."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _GroupState:
    """One group's parameters on this trainer."""

    def __init__(self, index: int, group: Group, model: nn.Module) -> None:
        self.index = index
        self.name = group.name
        self.params = [p for _, p in group.params]
        self.names = [n for n, _ in group.params]
        self.shapes = [tuple(p.shape) for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.offsets = []
        off = 0
        for n in self.numels:
            self.offsets.append(off)
            off += n
        self.numel = off
        self.owners = []
        for name in self.names:
            owner, _, attr = name.rpartition(".")
            self.owners.append((model.get_submodule(owner), attr))
        self.trainable = [p.requires_grad for p in self.params]
        self.frozen = not all(self.trainable)
        self.lease: Optional[Any] = None  # held while bound
        self.lease_ref: Optional[weakref.ref] = None
        self.bound = False
        self.in_backward = False
        self.backward_done = False  # the gradient reached the inputs
        self.waiting = 0  # trainable parameters without a gradient yet
        self.pushed = False


class _OnBackward(torch.autograd.Function):
    """Identity on some tensors whose backward first calls ``callback``:
    on a group's outputs it binds the group before its backward; on its
    inputs it marks the group's backward as done."""

    @staticmethod
    def forward(ctx, callback: Callable[[], None],
                *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.callback = callback
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> Tuple[Any, ...]:
        ctx.callback()
        return (None,) + grads


def _tensors_in(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    return []


def _replace_tensors(value: Any, swap: Dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return swap.get(id(value), value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_replace_tensors(v, swap) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_replace_tensors(v, swap) for v in value)
    if isinstance(value, dict):
        # A plain dict is rebuilt; a ModelOutput (an ordered dict with
        # attributes) is updated in place to keep its class.
        out = dict(value) if type(value) is dict else value
        for k, v in list(value.items()):
            out[k] = _replace_tensors(v, swap)
        return out
    return value


def _security_from_env() -> dict:
    """TLS and token files from ZSHARD_TLS_CA, ZSHARD_TLS_CERT,
    ZSHARD_TLS_KEY and ZSHARD_TOKEN_FILE (unset: plaintext, no token)."""
    return {
        "tls_ca": os.environ.get("ZSHARD_TLS_CA", ""),
        "tls_cert": os.environ.get("ZSHARD_TLS_CERT", ""),
        "tls_key": os.environ.get("ZSHARD_TLS_KEY", ""),
        "token_file": os.environ.get("ZSHARD_TOKEN_FILE", ""),
    }


class ZShardEngine:
    """What ``zshard.initialize`` returns first; see the package docs."""

    def __init__(self, model: nn.Module, config: ConfigArg = None,
                 coordinator: Optional[str] = None,
                 wrap_classes: WrapClasses = None,
                 rank: Optional[int] = None, transport: str = "",
                 prefetch_bytes: int = -1, connect_timeout_s: float = 60.0,
                 rpc_timeout_s: float = 30.0, model_name: str = "",
                 trainer_id: str = "", init_from: InitFrom = None,
                 rejoin_timeout_s: float = 60.0) -> None:
        if not isinstance(model, nn.Module):
            raise invalid_argument(
                f"model: expected a torch.nn.Module, got {type(model).__name__}")
        coordinator = coordinator or os.environ.get("ZSHARD_COORDINATOR", "")
        if not coordinator:
            raise invalid_argument(
                "coordinator: pass coordinator='host:port' of shard 0 or set "
                "ZSHARD_COORDINATOR (zshard launch sets it)")
        if rank is None:
            rank = int(os.environ.get("ZSHARD_RANK", "-1"))
        self.config = load_config(config)
        if not rejoin_timeout_s >= 0:
            raise invalid_argument(
                f"rejoin_timeout_s: expected >= 0, got {rejoin_timeout_s}")
        self.rejoin_timeout_s = rejoin_timeout_s
        groups = make_groups(model, wrap_classes)
        check_dtypes(groups)
        self.module = model
        self._source = ValueSource(init_from)
        self._groups = [_GroupState(i, g, model) for i, g in enumerate(groups)]
        desc = [(g.name, [(n, list(s), t) for n, s, t in
                          zip(g.names, g.shapes, g.trainable)])
                for g in self._groups]
        self._trainer = _zshard.Trainer(
            coordinator, model_name or type(model).__name__, desc,
            self._initial_values, rank=rank, trainer_id=trainer_id,
            config_path=self.config.path, transport=transport,
            prefetch_bytes=prefetch_bytes,
            connect_timeout_s=connect_timeout_s, rpc_timeout_s=rpc_timeout_s,
            **_security_from_env())
        self.dtype = (torch.bfloat16 if self._trainer.element_size == 2
                      else torch.float32)
        replaced = replace_meta_parameters(model)
        for g in self._groups:
            g.params = [replaced.get(id(p), p) for p in g.params]
        self._empty = torch.empty(0, dtype=self.dtype)
        for g in self._groups:
            for p in g.params:
                p.data = self._empty
                p.grad = None
        if self.dtype != torch.float32:
            model.to(self.dtype)
        _return_freed_memory()
        self._micro_step = 0
        self._backward_done = False
        self._in_backward_pass = False
        self._overflow = False
        # This step's micro-batch losses and start, for report_step.
        self._step_losses: List[float] = []
        self._step_started = time.monotonic()
        self._root = self._groups[0] if groups[0].name == "root" else None
        self._bound_bytes = 0  # of the groups bound now
        self._peak_bound_bytes = 0
        self._linear_ctx: List[Any] = []
        self._install_hooks()

    # ----------------------------------------------------------- properties
    @property
    def rank(self) -> int:
        return self._trainer.rank

    @property
    def world_size(self) -> int:
        return self._trainer.world_size

    @property
    def global_steps(self) -> int:
        """Optimizer steps the servers have applied to this model."""
        return self._trainer.step

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._trainer.accumulation_steps

    @property
    def loss_scale(self) -> float:
        return self._trainer.loss_scale

    @property
    def transport(self) -> str:
        return self._trainer.transport

    def get_lr(self) -> List[float]:
        """The learning rate of the step being computed (one group)."""
        return [self._trainer.learning_rate]

    def is_gradient_accumulation_boundary(self) -> bool:
        return self._micro_step + 1 == self.gradient_accumulation_steps

    def groups(self) -> List[Tuple[str, int]]:
        """(name, elements) of every group, in the servers' order."""
        return [(g.name, g.numel) for g in self._groups]

    def stats(self) -> Dict[str, int]:
        """The client's traffic and residency figures, plus the most
        parameter bytes bound to tensors at once."""
        s = dict(self._trainer.stats())
        s["peak_bound_param_bytes"] = self._peak_bound_bytes
        return s

    def bound_parameter_bytes(self) -> int:
        """Bytes of parameters that hold storage right now, measured from
        the parameters' tensors (not from the engine's own count)."""
        return sum(p.numel() * p.element_size()
                   for g in self._groups for p in g.params)

    # ---------------------------------------------------------- user calls
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.module(*args, **kwargs)
        except ZShardError as e:
            self._recover(e)
            raise

    def train(self, mode: bool = True) -> "ZShardEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "ZShardEngine":
        self.module.eval()
        return self

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of this micro-step: gradients are pushed group by group
        while it runs. FAILED_PRECONDITION when this micro-step already had
        its backward (call step() first)."""
        try:
            self._backward(loss)
        except ZShardError as e:
            self._recover(e)
            raise

    def _backward(self, loss: torch.Tensor) -> None:
        if self._backward_done:
            raise failed_precondition(
                "backward() called twice without step() in between")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise invalid_argument("backward(loss): expected a scalar tensor")
        if not loss.requires_grad:
            raise invalid_argument(
                "backward(loss): the loss does not require grad (was the "
                "forward run under torch.no_grad()?)")
        for g in self._groups:
            g.pushed = False
            g.backward_done = False
            g.waiting = sum(g.trainable)
        scale = self._trainer.loss_scale if self.config.fp16 else 1.0
        self._step_losses.append(float(loss.detach()))
        self._in_backward_pass = True
        try:
            (loss * scale if scale != 1.0 else loss).backward()
            # Groups whose parameters got no gradient (unused, or all
            # frozen) are settled now.
            for g in self._groups:
                if not g.pushed:
                    self._push(g)
                self._unbind(g)
        finally:
            self._in_backward_pass = False
            for g in self._groups:
                g.in_backward = False
        self._backward_done = True

    def step(self) -> None:
        """Ends the micro-step; at the accumulation boundary, waits for the
        servers' step (deadline: the RPC timeout). FAILED_PRECONDITION
        without a backward() since the last step().

        ``forward``, ``backward`` and ``step`` raise ``zshard.RolledBack``
        (with the ``step`` to redo from) when the cluster went back to an
        earlier step because a shard was replaced: the engine has joined it
        again by then (within ``rejoin_timeout_s``)."""
        try:
            self._step()
        except ZShardError as e:
            self._recover(e)
            raise

    def _step(self) -> None:
        if not self._backward_done:
            raise failed_precondition("step() called without backward()")
        self._backward_done = False
        self._micro_step += 1
        if self._micro_step < self.gradient_accumulation_steps:
            return
        self._micro_step = 0
        overflow, self._overflow = self._overflow, False
        self.last_step_skipped, self.last_grad_norm = self._trainer.end_step(
            overflow)
        losses, self._step_losses = self._step_losses, []
        now = time.monotonic()
        self._trainer.report_step(
            sum(losses) / len(losses) if losses else float("nan"),
            self.config.micro_batch * self.gradient_accumulation_steps,
            now - self._step_started)
        self._step_started = now

    def save_checkpoint(self, save_dir: Optional[str] = None,
                        tag: Optional[str] = None,
                        client_state: Optional[Dict[str, Any]] = None,
                        timeout_s: float = 600.0) -> Optional[Dict[str, Any]]:
        """Asks the servers for a checkpoint at this step boundary (rank 0;
        other ranks return None at once). The servers write it under their
        --checkpoint_dir; ``save_dir``, ``tag`` and ``client_state`` are
        accepted for DeepSpeed compatibility and not used. Returns the
        servers' answer: step, base, bytes_written, directory."""
        del save_dir, tag, client_state
        if self._micro_step != 0 or self._backward_done:
            raise failed_precondition(
                "save_checkpoint() in the middle of a step (call it after "
                "step() at an accumulation boundary)")
        if self.rank != 0:
            return None
        return self._trainer.request_checkpoint(timeout_s)

    def zero_grad(self) -> None:
        """Nothing to do: gradients leave the trainer during backward."""

    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """Every parameter's current value (the servers' copy for this step,
        in the compute dtype), fetched group by group: the whole model is
        then held by the caller. Between steps only."""
        if self._micro_step != 0 or self._backward_done:
            raise failed_precondition(
                "full_state_dict() in the middle of a step")
        out: Dict[str, torch.Tensor] = {}
        for g in self._groups:
            if g.bound:
                raise failed_precondition(
                    f"full_state_dict() while group {g.name} is in use")
            lease = self._trainer.acquire(g.index)
            try:
                flat = torch.frombuffer(lease, dtype=self.dtype)
                for name, off, n, shape in zip(g.names, g.offsets, g.numels,
                                               g.shapes):
                    out[name] = flat[off:off + n].view(shape).clone()
            finally:
                lease.release()
        return out

    # -------------------------------------------------------------- hooks
    def _install_hooks(self) -> None:
        self.module.register_forward_pre_hook(self._model_pre_forward)
        self.module.register_forward_hook(self._model_post_forward)
        for g, group in zip(self._groups, self._group_modules()):
            if g is self._root:
                continue
            group.register_forward_pre_hook(
                lambda m, args, kwargs, g=g: self._pre_forward(g, args, kwargs),
                with_kwargs=True)
            group.register_forward_hook(
                lambda m, args, out, g=g: self._post_forward(g, out))
        for g in self._groups:
            for p, trainable in zip(g.params, g.trainable):
                if trainable:
                    p.register_post_accumulate_grad_hook(
                        lambda p, g=g: self._grad_ready(g))

    def _group_modules(self) -> List[nn.Module]:
        mods = []
        for g in self._groups:
            if g is self._root:
                mods.append(self.module)
            else:
                mods.append(self.module.get_submodule(g.name))
        return mods

    def _model_pre_forward(self, module: nn.Module, args: Any) -> None:
        ctx = zlinear.installed()
        ctx.__enter__()
        self._linear_ctx.append(ctx)
        if self._root is not None:
            self._bind(self._root)

    def _model_post_forward(self, module: nn.Module, args: Any,
                            out: Any) -> None:
        if self._linear_ctx:
            self._linear_ctx.pop().__exit__(None, None, None)
        if self._root is not None and not self._in_backward_pass:
            needs_backward = torch.is_grad_enabled() and any(
                t.requires_grad for t in _tensors_in(out))
            if not needs_backward:
                self._unbind(self._root)

    def _pre_forward(self, g: _GroupState, args: Any, kwargs: Any) -> Any:
        self._bind(g)
        if g.in_backward or not torch.is_grad_enabled() or not g.frozen:
            return None
        # With frozen parameters, the gradients of the trainable ones may all
        # exist before the group's backward is over (the frozen ones are
        # still read): the group is given back when the gradient reaches
        # its inputs.
        tensors = [t for t in _tensors_in((args, kwargs)) if t.requires_grad]
        if not tensors:
            return None  # given back at the end of backward
        wrapped = _OnBackward.apply(lambda: self._leave_backward(g.index),
                                    *tensors)
        swap = {id(t): w for t, w in zip(tensors, wrapped)}
        return _replace_tensors(args, swap), _replace_tensors(kwargs, swap)

    def _leave_backward(self, index: int) -> None:
        g = self._groups[index]
        g.backward_done = True
        if g is not self._root and g.pushed:
            self._unbind(g)

    def _post_forward(self, g: _GroupState, out: Any) -> Any:
        if g.in_backward:  # recomputation inside backward keeps it bound
            return None
        self._unbind(g)
        if not torch.is_grad_enabled():
            return None
        tensors = [t for t in _tensors_in(out) if t.requires_grad]
        if not tensors:
            return None
        wrapped = _OnBackward.apply(lambda: self._enter_backward(g.index),
                                    *tensors)
        return _replace_tensors(out, {id(t): w for t, w in
                                      zip(tensors, wrapped)})

    def _enter_backward(self, index: int) -> None:
        g = self._groups[index]
        g.in_backward = True
        self._bind(g)

    def _grad_ready(self, g: _GroupState) -> None:
        g.waiting -= 1
        if g.waiting == 0 and not g.pushed:
            self._push(g)
            # Every use of a trainable parameter has had its backward;
            # frozen ones may still be read (see _pre_forward).
            if g is not self._root and (not g.frozen or g.backward_done):
                self._unbind(g)

    # ------------------------------------------------------------ recovery
    _REJOIN_CODES = ("ABORTED", "UNAVAILABLE", "CANCELLED",
                     "DEADLINE_EXCEEDED")

    def _recover(self, error: ZShardError) -> None:
        """A call failed with ``error``: when the cluster went back to an
        earlier step (a shard was replaced), joins it again and raises
        RolledBack; otherwise returns (the caller re-raises ``error``)."""
        if (isinstance(error, RolledBack) or error.code not in
                self._REJOIN_CODES or self.rejoin_timeout_s <= 0):
            return
        self._forget_step()
        try:
            step = self._trainer.rejoin(error.code, str(error),
                                        self.rejoin_timeout_s)
        except ZShardError:
            return  # not rolled back: the original error stands
        raise RolledBack(
            step, f"ABORTED: the cluster rolled back to step {step} "
            f"({error}); redo the steps from there") from error

    def _forget_step(self) -> None:
        """Drops everything of the step in progress: bound groups,
        gradients, losses, the micro-step."""
        for g in self._groups:
            self._unbind(g)
            g.lease_ref = None
            g.pushed = g.in_backward = g.backward_done = False
            g.waiting = 0
            for p in g.params:
                p.grad = None
        self._micro_step = 0
        self._backward_done = False
        self._in_backward_pass = False
        self._overflow = False
        self._step_losses = []
        self._step_started = time.monotonic()

    # ----------------------------------------------------- bind / release
    def _check_owned(self, g: _GroupState) -> None:
        for (owner, attr), p, name, shape in zip(g.owners, g.params, g.names,
                                                 g.shapes):
            now = owner._parameters.get(attr)
            if now is not p:
                got = tuple(now.shape) if now is not None else None
                raise failed_precondition(
                    f"parameter {name} was replaced after initialize (now "
                    f"shape {got}, registered {shape})")
            if not g.bound and p.numel() != 0:
                raise failed_precondition(
                    f"parameter {name} changed after initialize (shape "
                    f"{tuple(p.shape)}, registered {shape})")

    def _bind(self, g: _GroupState) -> None:
        if g.bound:
            return
        self._check_owned(g)
        lease = g.lease_ref() if g.lease_ref is not None else None
        if lease is None or lease.released:
            lease = self._trainer.acquire(g.index)
            g.lease_ref = weakref.ref(lease)
        g.lease = lease
        flat = torch.frombuffer(lease, dtype=self.dtype)
        for p, off, n, shape in zip(g.params, g.offsets, g.numels, g.shapes):
            p.data = flat[off:off + n].view(shape)
        g.bound = True
        # A running count: summing every parameter here would cost
        # O(parameters) per bind.
        self._bound_bytes += g.numel * flat.element_size()
        self._peak_bound_bytes = max(self._peak_bound_bytes,
                                     self._bound_bytes)

    def _unbind(self, g: _GroupState) -> None:
        """Drops the group's storage; the lease goes back to the client
        when nothing else (a view autograd saved) refers to it."""
        if not g.bound:
            return
        for p in g.params:
            p.data = self._empty
        g.bound = False
        self._bound_bytes -= g.numel * self._empty.element_size()
        g.lease = None  # collected now unless a saved view still holds it

    def _push(self, g: _GroupState) -> None:
        # Every group is pushed: the servers advance a group's version when
        # its contributions have all arrived. The client sends only the
        # trainable elements (a wholly frozen group sends none); the servers
        # keep no optimizer state for frozen tensors and never change them.
        g.pushed = True
        if not any(g.trainable):
            self._trainer.push_gradient(g.index, None, self._micro_step)
            return
        # The trainable tensors' gradients only, in order (a parameter that
        # got none contributes zeros).
        parts = []
        for p, n, trainable in zip(g.params, g.numels, g.trainable):
            if not trainable:
                continue
            if p.grad is not None:
                parts.append(p.grad.detach().reshape(-1).to(self.dtype))
            else:
                parts.append(torch.zeros(n, dtype=self.dtype))
            p.grad = None
        flat = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
        if self.config.fp16 and not self._overflow:
            self._overflow = not bool(torch.isfinite(flat).all())
        self._trainer.push_gradient(g.index, _as_buffer(flat),
                                    self._micro_step, trainable_only=True)

    def _initial_values(self, index: int, out: memoryview) -> None:
        """Rank 0: group ``index``'s values, fp32, into ``out``."""
        g = self._groups[index]
        flat = torch.frombuffer(out, dtype=torch.float32)
        for p, name, shape, off, n in zip(g.params, g.names, g.shapes,
                                          g.offsets, g.numels):
            if self._source:
                value = self._source.get(name, shape)
            elif p.is_meta:
                raise invalid_argument(
                    f"parameter {name} is on the meta device: rank 0 needs "
                    "its initial values (pass init_from=, or build the model "
                    "on the CPU)")
            else:
                value = p.detach()
            flat[off:off + n].copy_(value.reshape(-1))


def initialize(model: nn.Module, config: ConfigArg = None,
               coordinator: Optional[str] = None,
               wrap_classes: WrapClasses = None, **kwargs: Any
               ) -> Tuple[ZShardEngine, "ZShardOptimizer", None,
                          "ZShardScheduler"]:
    """DeepSpeed's ``deepspeed.initialize`` shape: returns (engine,
    optimizer, None, scheduler). See ZShardEngine for the keyword
    arguments."""
    engine = ZShardEngine(model, config=config, coordinator=coordinator,
                          wrap_classes=wrap_classes, **kwargs)
    return engine, ZShardOptimizer(engine), None, ZShardScheduler(engine)


class ZShardOptimizer:
    """The optimizer runs on the servers; this object only reports it."""

    def __init__(self, engine: ZShardEngine) -> None:
        self._engine = engine

    @property
    def param_groups(self) -> List[Dict[str, float]]:
        return [{"lr": self._engine.get_lr()[0]}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        del set_to_none

    def step(self) -> None:
        raise failed_precondition(
            "the optimizer runs on the shard servers: call engine.step()")


class ZShardScheduler:
    """The schedule runs on the servers (ds_config "scheduler")."""

    def __init__(self, engine: ZShardEngine) -> None:
        self._engine = engine

    def get_last_lr(self) -> List[float]:
        return self._engine.get_lr()

    def step(self) -> None:
        """Nothing to do: the servers advance the schedule."""


__all__ = ["ZShardEngine", "ZShardOptimizer", "ZShardScheduler",
           "initialize", "ZShardError"]
