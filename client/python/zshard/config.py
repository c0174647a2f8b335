"""The parts of a DeepSpeed ds_config the Python trainer acts on itself.

The servers and the C++ trainer library read the same file for everything
else (stages, optimizer, schedules, loss scaling, clipping); this module
only resolves where the file is and the keys the engine needs in Python.
"""

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from .errors import invalid_argument

ConfigArg = Union[None, str, os.PathLike, Dict[str, Any]]


@dataclass
class EngineConfig:
    """What the engine reads from the ds_config, and the file's path."""
    path: str  # "" when none was given (DeepSpeed's defaults)
    micro_batch: int = 1
    accumulation_steps: int = 1
    fp16: bool = False
    bf16: bool = False
    stage: int = 3
    raw: Optional[Dict[str, Any]] = None


def _section_enabled(cfg: Dict[str, Any], key: str) -> bool:
    section = cfg.get(key)
    if section is None:
        return False
    if not isinstance(section, dict):
        raise invalid_argument(f"ds_config {key}: expected an object")
    enabled = section.get("enabled", False)
    if not isinstance(enabled, bool):
        raise invalid_argument(f"ds_config {key}.enabled: expected true or "
                               f"false, got {enabled!r}")
    return enabled


def _positive_int(cfg: Dict[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if value == "auto":
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid_argument(f"ds_config {key}: expected an integer >= 1, "
                               f"got {value!r}")
    return value


def load_config(config: ConfigArg) -> EngineConfig:
    """Resolves ``config`` (a path, a dict, or None) into an EngineConfig.

    A dict is written to a private temporary file so the C++ library reads
    exactly what the caller passed. Raises ZShardError (INVALID_ARGUMENT)
    naming the key or file that is wrong.
    """
    if config is None:
        return EngineConfig(path="", raw={})
    if isinstance(config, dict):
        fd, path = tempfile.mkstemp(prefix="zshard-ds-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        raw = config
    else:
        path = os.fspath(config)
        try:
            with open(path) as f:
                raw = json.load(f)
        except OSError as e:
            raise invalid_argument(f"config {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise invalid_argument(f"config {path}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise invalid_argument(f"config {path}: expected a JSON object")
    zero = raw.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return EngineConfig(
        path=path,
        micro_batch=_positive_int(raw, "train_micro_batch_size_per_gpu", 1),
        accumulation_steps=_positive_int(raw, "gradient_accumulation_steps",
                                         1),
        fp16=_section_enabled(raw, "fp16"),
        bf16=_section_enabled(raw, "bf16"),
        stage=stage if isinstance(stage, int) else 3,
        raw=raw)
