#!/usr/bin/env python3
"""Trainer faults under load (issue 16's soak; figures, not a timed test).

4 zshard-server shards and 8 zshard-train trainers on 127.0.0.1 train to
--steps. Every --every_s seconds, until --duration_s has passed or the run
is 80% done, one random trainer gets a fault: SIGKILL, or SIGSTOP held for
2 x --trainer_timeout_s and then SIGCONT (it must then exit, refused). A
replacement is started for each. Afterwards every trainer still running must
finish (exit 0) and every group on every shard must be at exactly --steps
(each step applied once). Reported: faults by kind, the longest time the
run went without a completed step (shard 0's zshard_steps_total, sampled
every 50 ms), and how long the run took. Shard faults are not injected:
shard replacement is not built yet. Last line:
  SOAK faults=N kills=N stops=N hangs=N longest_stall_s=X final_version_ok=0|1
(a hang: no step for more than 3 x --trainer_timeout_s + 10 s).

Usage: soak_bench.py --server build/server/zshard-server \\
         --train build/client/zshard-train --ctl build/client/zshardctl
         [--duration_s 600] [--every_s 30] [--steps 20000]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bench_processes import Processes, start_shards
from recovery_bench import CONFIG, steps_total

MODEL = ["--d_model=32", "--layers=2", "--heads=2", "--context=16"]
SHARDS = 4
TRAINERS = 8


def versions(ctl: str, coordinator: str) -> tuple:
    out = subprocess.run(
        [ctl, "status", f"--server={coordinator}", "--json"],
        capture_output=True, text=True, timeout=30).stdout
    shards = json.loads(out)
    return (min(int(s.get("minVersion", "0")) for s in shards),
            max(int(s.get("maxVersion", "0")) for s in shards))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--duration_s", type=float, default=600)
    ap.add_argument("--every_s", type=float, default=30)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--trainer_timeout_s", type=float, default=2)
    ap.add_argument("--seed", type=int, default=16)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="zs_soak.")
    procs = Processes()
    stall = {"longest": 0.0, "stop": False}
    try:
        config = os.path.join(work, "ds.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        coordinator, metrics_port = start_shards(
            procs, args.server, work, SHARDS,
            [f"--trainers={TRAINERS}", f"--config={config}",
             "--wait_timeout_s=120",
             f"--trainer_timeout_s={args.trainer_timeout_s}"])
        trainer = [args.train, f"--coordinator={coordinator}",
                   f"--config={config}", f"--steps={args.steps}",
                   "--data=/usr/share/common-licenses", "--threads=1",
                   "--log_every=0", "--connect_timeout_s=120"] + MODEL
        started = [0]

        def start_trainer():
            started[0] += 1
            return procs.start(trainer,
                               os.path.join(work, f"trainer{started[0]}.log"))

        def watch():
            last, since = -1, time.monotonic()
            while not stall["stop"]:
                try:
                    v = steps_total(metrics_port)
                except OSError:
                    v = last
                now = time.monotonic()
                if v != last:
                    last, since = v, now
                elif v < args.steps:
                    stall["longest"] = max(stall["longest"], now - since)
                time.sleep(0.05)

        live = [start_trainer() for _ in range(TRAINERS)]
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        refused = []  # stopped trainers that must exit by themselves
        kills = stops = 0
        start = time.monotonic()
        while (time.monotonic() - start < args.duration_s and
               steps_total(metrics_port) < 0.8 * args.steps):
            time.sleep(args.every_s)
            i = rng.randrange(TRAINERS)
            if rng.random() < 0.5:
                live[i].kill()
                live[i].wait(timeout=30)
                kills += 1
            else:
                live[i].send_signal(signal.SIGSTOP)
                time.sleep(2 * args.trainer_timeout_s)
                live[i].send_signal(signal.SIGCONT)
                refused.append(live[i])
                stops += 1
            live[i] = start_trainer()
        ok = True
        for p in refused:
            code = p.wait(timeout=120)
            if code == 0:
                print("soak_bench: a stopped trainer finished instead of "
                      "being refused", file=sys.stderr)
                ok = False
        for p in live:
            code = p.wait(timeout=1800)
            if code != 0:
                print(f"soak_bench: a trainer exited with {code} (logs in "
                      f"{work})", file=sys.stderr)
                ok = False
        elapsed = time.monotonic() - start
        stall["stop"] = True
        lo, hi = versions(args.ctl, coordinator)
        final_ok = lo == hi == args.steps
        hang_s = 3 * args.trainer_timeout_s + 10
        hangs = 1 if stall["longest"] > hang_s else 0
        print(f"faults {kills + stops} (kill -9 {kills}, SIGSTOP "
              f"{2 * args.trainer_timeout_s:.0f} s {stops}); run {elapsed:.0f} s "
              f"to step {args.steps}; longest time without a step "
              f"{stall['longest']:.2f} s; final versions {lo}..{hi}")
        print(f"SOAK faults={kills + stops} kills={kills} stops={stops} "
              f"hangs={hangs} longest_stall_s={stall['longest']:.2f} "
              f"final_version_ok={int(final_ok)}")
        if ok and final_ok and not hangs:
            shutil.rmtree(work, ignore_errors=True)
            return 0
        print(f"soak_bench: logs in {work}", file=sys.stderr)
        return 1
    finally:
        stall["stop"] = True
        procs.stop()


if __name__ == "__main__":
    sys.exit(main())
