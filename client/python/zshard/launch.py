"""``zshard launch``: local shard servers plus one process per trainer rank.

    zshard launch --shards 4 --trainers 2 [--config ds.json] -- python train.py

starts ``--shards`` zshard-server processes on 127.0.0.1 (free ports), or
joins a running cluster with ``--coordinator``, then runs the command once
per rank with ZSHARD_COORDINATOR, ZSHARD_RANK, RANK, LOCAL_RANK and
WORLD_SIZE in its environment, streams every line it prints with a
``[rank R]`` prefix, and stops everything on exit, Ctrl-C or the first
failure. Its exit status is the first failing rank's (0 when all pass).

With ``--max_restarts N`` (like torchrun's) it restarts instead, up to N
times in all: a rank that exits non-zero runs again (it takes its rank
back once the servers dropped the dead process), and a shard server of its
own that exits is replaced with ``zshard-server --replace=K`` (shard 0's
replacement with ``--peer``), from its buddy's in-memory snapshot.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, List, Optional, Sequence


def _server_binary(explicit: str) -> str:
    candidates = [explicit, os.environ.get("ZSHARD_SERVER_BIN", ""),
                  os.path.join(os.path.dirname(__file__), "bin",
                               "zshard-server"),
                  shutil.which("zshard-server") or ""]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise SystemExit(
        "zshard launch: zshard-server not found (pass --server_bin, set "
        "ZSHARD_SERVER_BIN, or put it on PATH)")


def _pump(stream: IO[bytes], prefix: str, out: IO[str],
          lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


class Launch:
    """The processes of one launch; stop() ends all of them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.servers: List[subprocess.Popen] = []
        self.trainers: List[subprocess.Popen] = []
        self.pumps: List[threading.Thread] = []
        self.lock = threading.Lock()
        self.work = tempfile.mkdtemp(prefix="zshard-launch-")
        self.server_common: List[str] = []
        self.endpoints: List[str] = []  # by shard id
        self.coordinator = ""
        self.restarts = 0

    def _spawn(self, cmd: Sequence[str], prefix: str,
               env: Optional[dict] = None) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        t = threading.Thread(target=_pump,
                             args=(p.stdout, prefix, sys.stdout, self.lock),
                             daemon=True)
        t.start()
        self.pumps.append(t)
        return p

    def _wait_port(self, path: str, proc: subprocess.Popen) -> str:
        deadline = time.monotonic() + self.args.startup_timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(path) and os.path.getsize(path) > 0:
                with open(path) as f:
                    return f.read().strip()
            if proc.poll() is not None:
                raise SystemExit(f"zshard launch: a shard server exited with "
                                 f"status {proc.returncode} while starting")
            time.sleep(0.05)
        raise SystemExit(f"zshard launch: no port from a shard server within "
                         f"{self.args.startup_timeout_s} s")

    def start_servers(self) -> str:
        a = self.args
        binary = _server_binary(a.server_bin)
        common = [f"--num_shards={a.shards}", f"--trainers={a.trainers}"]
        if a.config:
            common.append(f"--config={a.config}")
        if a.checkpoint_dir:
            common.append(f"--checkpoint_dir={a.checkpoint_dir}")
        if a.transport:
            common.append(f"--transport={a.transport}")
        common += a.server_arg
        self.server_common = [binary] + common
        for s in range(a.shards):
            port_file = os.path.join(self.work, f"port{s}")
            cmd = self.server_common + ["--listen=127.0.0.1:0",
                                        f"--port_file={port_file}",
                                        f"--shard_id={s}"]
            if s > 0:
                cmd.append(f"--coordinator={self.coordinator}")
            proc = self._spawn(cmd, f"[shard {s}] ")
            self.servers.append(proc)
            self.endpoints.append(
                f"127.0.0.1:{self._wait_port(port_file, proc)}")
            if s == 0:
                self.coordinator = self.endpoints[0]
        return self.coordinator

    def replace_shard(self, s: int) -> None:
        """Starts zshard-server --replace=s for a shard that exited; it
        takes its state from the buddy's snapshot and every shard rolls
        back (shard 0's replacement takes over as the coordinator)."""
        port_file = os.path.join(self.work, f"port{s}-{self.restarts}")
        cmd = self.server_common + ["--listen=127.0.0.1:0",
                                    f"--port_file={port_file}",
                                    f"--shard_id={s}", f"--replace={s}"]
        if s > 0:
            cmd.append(f"--coordinator={self.coordinator}")
        else:
            live = [e for k, e in enumerate(self.endpoints)
                    if k != 0 and self.servers[k].poll() is None]
            if not live:
                raise SystemExit("zshard launch: no live shard to replace "
                                 "shard 0 from")
            cmd.append(f"--peer={live[0]}")
        proc = self._spawn(cmd, f"[shard {s}] ")
        self.servers[s] = proc
        self.endpoints[s] = f"127.0.0.1:{self._wait_port(port_file, proc)}"
        if s == 0:
            self.coordinator = self.endpoints[0]

    def _rank_env(self, r: int) -> dict:
        a = self.args
        env = dict(os.environ)
        env.update(ZSHARD_COORDINATOR=self.coordinator, ZSHARD_RANK=str(r),
                   RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.trainers))
        if a.config:
            env["ZSHARD_CONFIG"] = a.config
        return env

    def _may_restart(self, what: str, status: int) -> bool:
        """Whether `what` (that exited with `status`) is restarted; says
        which."""
        if self.restarts >= self.args.max_restarts:
            return False
        self.restarts += 1
        with self.lock:
            print(f"zshard launch: {what} exited with status {status}; "
                  f"restarting it (restart {self.restarts} of "
                  f"{self.args.max_restarts})", file=sys.stderr)
        return True

    def run_trainers(self, coordinator: str) -> int:
        a = self.args
        self.coordinator = coordinator
        for r in range(a.trainers):
            self.trainers.append(
                self._spawn(a.command, f"[rank {r}] ", self._rank_env(r)))
        done = [False] * a.trainers
        while not all(done):
            for r, p in enumerate(self.trainers):
                rc = p.poll()
                if rc is None or done[r]:
                    continue
                if rc == 0:
                    done[r] = True
                    continue
                status = rc if rc > 0 else 128 - rc
                if self._may_restart(f"rank {r}", rc):
                    self.trainers[r] = self._spawn(
                        a.command, f"[rank {r}] ", self._rank_env(r))
                    continue
                with self.lock:
                    print(f"zshard launch: rank {r} exited with status "
                          f"{rc}; stopping the others", file=sys.stderr)
                return status
            for s, p in enumerate(self.servers):
                if p.poll() is None:
                    continue
                if self._may_restart(f"shard {s}", p.returncode):
                    self.replace_shard(s)
                    continue
                with self.lock:
                    print(f"zshard launch: shard {s} exited with status "
                          f"{p.returncode}; stopping", file=sys.stderr)
                return 1
            time.sleep(0.05)
        return 0

    def stop(self) -> None:
        procs = self.trainers + self.servers
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for t in self.pumps:
            t.join(timeout=5)
        shutil.rmtree(self.work, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zshard launch",
        description="Start local shard servers (or join --coordinator) and "
        "run COMMAND once per trainer rank.")
    p.add_argument("--shards", type=int, default=1,
                   help="local shard servers to start (default 1)")
    p.add_argument("--trainers", type=int, default=1,
                   help="trainer processes (ranks) to run (default 1)")
    p.add_argument("--config", default="",
                   help="ds_config.json for the servers (ZSHARD_CONFIG in "
                   "the trainers' environment)")
    p.add_argument("--coordinator", default="",
                   help="host:port of a running cluster's shard 0: start no "
                   "servers")
    p.add_argument("--checkpoint_dir", default="",
                   help="the servers' --checkpoint_dir")
    p.add_argument("--transport", default="",
                   help="the servers' --transport (ucx or inline)")
    p.add_argument("--server_bin", default="",
                   help="zshard-server to run (default: ZSHARD_SERVER_BIN, "
                   "the package's bin/, then PATH)")
    p.add_argument("--server_arg", action="append", default=[],
                   help="extra flag for every server (repeatable)")
    p.add_argument("--startup_timeout_s", type=float, default=60,
                   help="how long a server may take to start")
    p.add_argument("--max_restarts", type=int, default=0,
                   help="restart a failed rank, and replace a shard server "
                   "of its own that exited (--replace), up to this many "
                   "times in all (default 0: stop everything at the first)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the trainer command")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser().error("expected -- COMMAND to run per trainer")
    if args.shards < 1 or args.trainers < 1:
        parser().error("--shards and --trainers must be >= 1")
    if args.max_restarts < 0:
        parser().error("--max_restarts must be >= 0")
    launch = Launch(args)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        coordinator = args.coordinator or launch.start_servers()
        return launch.run_trainers(coordinator)
    except KeyboardInterrupt:
        return 130
    finally:
        launch.stop()
