#!/usr/bin/env python3
"""Trainer faults under load (issue 16's soak; figures, not a timed test).

4 zshard-server shards and 8 zshard-train trainers on 127.0.0.1 train to
--steps. Every --every_s seconds, until --duration_s has passed or the run
is 80% done, one random process gets a fault: a trainer, or (one fault in
--shard_every, default 3) a shard, shard 0 (the coordinator) included. A
trainer gets SIGKILL, or
SIGSTOP held for 2 x --trainer_timeout_s and then SIGCONT (it must then
exit, refused); a new trainer is started. A shard gets SIGKILL, or SIGSTOP
until its replacement serves and then SIGCONT (it must then exit 1,
fenced); the replacement is zshard-server --replace (shard 0's with --peer:
it takes over as the coordinator, and trainers started later are pointed at
it), and every shard rolls back to the newest snapshot held everywhere. Afterwards every trainer still
running must finish (exit 0) and every group on every shard must be at
exactly --steps (each step applied once; the steps after a rollback's
snapshot are redone). Reported: faults by kind, the longest time the run
went without a completed step (the highest zshard_steps_total of the shards
that answer, sampled every 50 ms; a rollback counts as a change), and how long the run took. Last line:
  SOAK faults=N kills=N stops=N shard_kills=N shard_stops=N hangs=N
  longest_stall_s=X final_version_ok=0|1
(a hang: no step for more than 3 x --trainer_timeout_s + --rpc_timeout_s
+ 10 s).

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

from bench_processes import Processes, cleanup_on_sigterm, start_shards, wait_port
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
    cleanup_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--duration_s", type=float, default=600)
    ap.add_argument("--every_s", type=float, default=30)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--trainer_timeout_s", type=float, default=2)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--shard_every", type=int, default=3,
                    help="one fault in this many hits a shard (0: never)")
    ap.add_argument("--rpc_timeout_s", type=int, default=10,
                    help="the trainers' deadline (a stopped shard is noticed "
                    "after it)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="zs_soak.")
    procs = Processes()
    stall = {"longest": 0.0, "stop": False}
    try:
        config = os.path.join(work, "ds.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        shard_flags = [f"--trainers={TRAINERS}", f"--config={config}",
                       "--wait_timeout_s=120",
                       f"--trainer_timeout_s={args.trainer_timeout_s}"]
        metrics = []
        coordinator, _ = start_shards(procs, args.server, work, SHARDS,
                                      shard_flags, metrics)
        shards = list(procs.procs)
        endpoints = [coordinator] + [
            f"127.0.0.1:{wait_port(os.path.join(work, f'port{k}'), p, 5)}"
            for k, p in enumerate(shards) if k > 0]
        replaced = [0]

        def replace_shard(k: int):
            """Starts zshard-server --replace=k; returns it once it serves
            (every shard has rolled back by then)."""
            replaced[0] += 1
            base = os.path.join(work, f"replacement{replaced[0]}")
            argv = [args.server, "--listen=127.0.0.1:0",
                    f"--port_file={base}.port", f"--shard_id={k}",
                    f"--num_shards={SHARDS}", f"--replace={k}",
                    "--metrics_listen=127.0.0.1:0",
                    f"--metrics_port_file={base}.metrics"] + shard_flags
            if k == 0:  # learns the cluster from a live shard
                argv.append(f"--peer={endpoints[1]}")
            else:
                argv.append(f"--coordinator={endpoints[0]}")
            p = procs.start(argv, base + ".log")
            endpoints[k] = f"127.0.0.1:{wait_port(base + '.port', p, 120)}"
            metrics[k] = wait_port(base + ".metrics", p, 10)
            return p
        trainer = [args.train, f"--config={config}", f"--steps={args.steps}",
                   "--data=/usr/share/common-licenses", "--threads=1",
                   "--log_every=0", "--connect_timeout_s=120",
                   f"--rpc_timeout_s={args.rpc_timeout_s}",
                   "--rejoin_timeout_s=120"] + MODEL
        started = [0]

        def start_trainer():
            started[0] += 1
            return procs.start(trainer + [f"--coordinator={endpoints[0]}"],
                               os.path.join(work, f"trainer{started[0]}.log"))

        def progress(timeout_s: float = 1) -> int:
            """The highest step any shard that answers has applied (-1:
            none answers)."""
            best = -1
            for port in list(metrics):
                try:
                    best = max(best, steps_total(port, timeout_s))
                except OSError:
                    continue
            return best

        def watch():
            last, since = -1, time.monotonic()
            while not stall["stop"]:
                v = progress()
                if v < 0:
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
        fenced = []  # stopped shards that must exit by themselves
        kills = stops = shard_kills = shard_stops = 0
        faults = 0
        start = time.monotonic()
        while (time.monotonic() - start < args.duration_s and
               progress(5) < 0.8 * args.steps):
            time.sleep(args.every_s)
            faults += 1
            at = f"fault {faults} at {time.monotonic() - start:.0f} s"
            if args.shard_every > 0 and faults % args.shard_every == 0:
                k = rng.randrange(SHARDS)
                kill = rng.random() < 0.5
                print(f"{at}: shard {k}, {'kill -9' if kill else 'SIGSTOP'}",
                      flush=True)
                if kill:
                    shards[k].kill()
                    shards[k].wait(timeout=30)
                    shards[k] = replace_shard(k)
                    shard_kills += 1
                else:
                    old = shards[k]
                    old.send_signal(signal.SIGSTOP)
                    time.sleep(1)
                    shards[k] = replace_shard(k)
                    old.send_signal(signal.SIGCONT)
                    fenced.append(old)
                    shard_stops += 1
                continue
            i = rng.randrange(TRAINERS)
            kill = rng.random() < 0.5
            print(f"{at}: trainer {i}, {'kill -9' if kill else 'SIGSTOP'}",
                  flush=True)
            if kill:
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
        for p in fenced:
            code = p.wait(timeout=60)
            if code != 1:
                print(f"soak_bench: a replaced shard exited with {code} "
                      "instead of being fenced", file=sys.stderr)
                ok = False
        for p in live:
            code = p.wait(timeout=1800)
            if code != 0:
                print(f"soak_bench: a trainer exited with {code} (logs in "
                      f"{work})", file=sys.stderr)
                ok = False
        elapsed = time.monotonic() - start
        stall["stop"] = True
        lo, hi = versions(args.ctl, endpoints[0])
        final_ok = lo == hi == args.steps
        hang_s = 3 * args.trainer_timeout_s + args.rpc_timeout_s + 10
        hangs = 1 if stall["longest"] > hang_s else 0
        print(f"faults {faults} (trainers: kill -9 {kills}, SIGSTOP "
              f"{2 * args.trainer_timeout_s:.0f} s {stops}; shards: kill -9 "
              f"{shard_kills}, SIGSTOP {shard_stops}); run {elapsed:.0f} s "
              f"to step {args.steps}; longest time without a step "
              f"{stall['longest']:.2f} s; final versions {lo}..{hi}")
        print(f"SOAK faults={faults} kills={kills} stops={stops} "
              f"shard_kills={shard_kills} shard_stops={shard_stops} "
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
