"""What the Python tests share: the environment ctest gives them
(ZSHARD_TEST_PYTHON, ZSHARD_PYTHONPATH, ZSHARD_SERVER_BIN), a ds_config
writer, and running ``zshard launch`` with a deadline."""

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = sys.executable


def env() -> Dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.environ["ZSHARD_PYTHONPATH"] + os.pathsep + HERE
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def ds_config(dirname: str, **extra: Any) -> str:
    cfg: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
            "weight_decay": 0.01}},
        "zero_optimization": {"stage": 3},
    }
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    path = os.path.join(dirname, "ds_config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def launch(config: str, script_args: List[str], shards: int = 4,
           trainers: int = 2, timeout_s: float = 300,
           launch_args: Optional[List[str]] = None,
           script: str = "train_hf.py") -> subprocess.CompletedProcess:
    """Runs ``zshard launch`` (real server processes, one trainer process
    per rank); the output is returned, and printed when it fails."""
    cmd = [PYTHON, "-m", "zshard", "launch", f"--shards={shards}",
           f"--trainers={trainers}", f"--config={config}",
           f"--server_bin={os.environ['ZSHARD_SERVER_BIN']}"]
    cmd += (launch_args or []) + ["--", PYTHON, os.path.join(HERE, script)]
    cmd += script_args
    r = subprocess.run(cmd, env=env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    if r.returncode != 0:
        print(r.stdout)
    return r


def workdir() -> str:
    return tempfile.mkdtemp(prefix="zshard-pytest-")


class Servers:
    """Shard servers started the way ``zshard launch`` starts them, for
    tests that run a trainer in their own process; stop() ends them."""

    def __init__(self, config: str, shards: int = 1, trainers: int = 1,
                 extra: Optional[List[str]] = None) -> None:
        from zshard import launch as zlaunch
        args = zlaunch.parser().parse_args(
            [f"--shards={shards}", f"--trainers={trainers}",
             f"--config={config}",
             f"--server_bin={os.environ['ZSHARD_SERVER_BIN']}"] +
            [f"--server_arg={a}" for a in (extra or [])] + ["--", "true"])
        self._launch = zlaunch.Launch(args)
        try:
            self.coordinator = self._launch.start_servers()
        except BaseException:
            self._launch.stop()
            raise

    def stop(self) -> None:
        self._launch.stop()
