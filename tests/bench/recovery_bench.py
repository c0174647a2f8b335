#!/usr/bin/env python3
"""Recovery from faults (issue 16's benchmark; figures, not a timed test).

For each --trainer_timeout_s value it starts 2 zshard-server shards and 2
zshard-train trainers on 127.0.0.1 and, --rounds times, at a random point
of a step kills one trainer with SIGKILL and measures, from shard 0's
/metrics (zshard_steps_total: the lowest group version), the time from the
kill to the second completed step after it: the first one may have needed
nothing more from the dead trainer, the second is trained without it. It
then starts a replacement and waits until the coordinator has admitted it
before the next kill. The table has one row per kill; the last line is
  RATIOS trainer_loss_recovery_s=X shard_replace_recovery_s=X snapshot_vs_step=X
with the slowest recovery at the first timeout (target: <= 2 x that
timeout).

Shard replacement: 3 shards and 2 trainers; --rounds times it kills a shard
(1, 2, 0, 1, ...: shard 0, the coordinator, too) with SIGKILL and starts
zshard-server --replace=K (shard 0's with --peer), measuring from the replacement's start to the first step
completed after the rollback (target: <= 10 s), and the steps lost (the
step reached before the kill minus the snapshot rolled back to).

Snapshot cost: the mean step time of the reference model (d 160, 4 layers)
with zshard_fault_tolerance.snapshot_interval_steps at its default (the key
left out), at 1, and at 0 (off), interleaved, --rounds rounds;
snapshot_vs_step is the median over the rounds of (default - off) / off,
each round's runs compared with each other (target: <= 0.1); the ratio of
the medians is printed too, and the CPU time the three servers used per
step with and without (less sensitive than wall time to a noisy machine).
--cost_only measures just this.

Usage: recovery_bench.py --server build/server/zshard-server \\
         --train build/client/zshard-train --ctl build/client/zshardctl
         [--timeouts 2,5] [--rounds 5]
Every process it starts is stopped when it ends, also on failure or
SIGTERM / SIGHUP.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench_processes import (Processes, cleanup_on_sigterm, cpu_seconds,
                             start_shards, wait_port)

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 3},
}
MODEL = ["--d_model=64", "--layers=2", "--heads=2", "--context=32"]
STEPS_RE = re.compile(r'^zshard_steps_total\{shard="\d+"\} (\d+)', re.M)


def steps_total(metrics_port: int, timeout_s: float = 5) -> int:
    """The steps a shard has applied (its /metrics on `metrics_port`)."""
    with urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics",
            timeout=timeout_s) as r:
        m = STEPS_RE.search(r.read().decode())
    return int(m.group(1)) if m else 0


def admitted(ctl: str, coordinator: str) -> int:
    out = subprocess.run(
        [ctl, "status", f"--server={coordinator}", "--json"],
        capture_output=True, text=True, timeout=30).stdout
    events = json.loads(out)[0].get("membershipEvents", [])
    return sum(1 for e in events if e.get("kind") == "ADMITTED")


def wait_for(cond, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise RuntimeError(f"{what} did not happen within {deadline_s} s")


def run_timeout(args, work: str, timeout_s: float, rng) -> list:
    procs = Processes()
    try:
        config = os.path.join(work, "ds.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        coordinator, metrics_port = start_shards(
            procs, args.server, work, 2,
            ["--trainers=2", f"--config={config}",
             f"--trainer_timeout_s={timeout_s}", "--wait_timeout_s=120"])
        trainer = [args.train, f"--coordinator={coordinator}",
                   f"--config={config}", "--steps=100000000",
                   "--data=/usr/share/common-licenses", "--threads=1",
                   "--log_every=0"] + MODEL
        started = 0

        def start_trainer():
            nonlocal started
            started += 1
            return procs.start(trainer,
                               os.path.join(work, f"trainer{started}.log"))

        live = [start_trainer(), start_trainer()]
        wait_for(lambda: steps_total(metrics_port) > 50, 120, "warm-up")
        rows = []
        for k in range(args.rounds):
            wait_for(lambda: admitted(args.ctl, coordinator) >= 2 + k, 120,
                     "the replacement's admission")
            time.sleep(rng.uniform(0.3, 1.0))
            victim = rng.randrange(2)
            at_kill = steps_total(metrics_port)
            t0 = time.monotonic()
            live[victim].kill()
            live[victim].wait(timeout=30)
            wait_for(lambda: steps_total(metrics_port) >= at_kill + 2,
                     10 * timeout_s + 30, "training after the kill")
            rows.append((timeout_s, k, time.monotonic() - t0))
            live[victim] = start_trainer()
        return rows
    finally:
        procs.stop()


def replacement_config(work: str, interval) -> str:
    """A config with snapshots every `interval` steps (None: the default)."""
    config = os.path.join(work, f"ds{interval}.json")
    with open(config, "w") as f:
        extra = {} if interval is None else {"zshard_fault_tolerance": {
            "snapshot_interval_steps": interval}}
        json.dump(dict(CONFIG, **extra), f)
    return config


def run_shard_replace(args, work: str, rng) -> list:
    procs = Processes()
    try:
        config = replacement_config(work, None)
        flags = ["--trainers=2", f"--config={config}", "--trainer_timeout_s=5",
                 "--wait_timeout_s=60"]
        metrics = []
        coordinator, _ = start_shards(procs, args.server, work, 3, flags,
                                      metrics)
        servers = list(procs.procs)
        endpoints = [coordinator] + [
            f"127.0.0.1:{wait_port(os.path.join(work, f'port{s}'), p, 5)}"
            for s, p in enumerate(servers) if s > 0]
        trainer = [args.train, f"--coordinator={coordinator}",
                   f"--config={config}", "--steps=100000000",
                   "--data=/usr/share/common-licenses", "--threads=1",
                   "--log_every=0", "--rpc_timeout_s=10"] + MODEL
        for r in range(2):
            procs.start(trainer + [f"--rank={r}"],
                        os.path.join(work, f"trainer{r}.log"))
        wait_for(lambda: steps_total(metrics[0]) > 50, 120, "warm-up")
        rows = []
        for k in range(args.rounds):
            shard = (1, 2, 0)[k % 3]
            watch = metrics[(shard + 1) % 3]  # a shard that stays
            time.sleep(rng.uniform(1.0, 2.0))
            at_kill = steps_total(watch)
            servers[shard].kill()
            servers[shard].wait(timeout=30)
            port_file = os.path.join(work, f"replacement{k}.port")
            metrics_file = os.path.join(work, f"replacement{k}.metrics")
            log = os.path.join(work, f"replacement{k}.log")
            argv = [args.server, "--listen=127.0.0.1:0",
                    f"--port_file={port_file}", f"--shard_id={shard}",
                    "--num_shards=3", f"--replace={shard}",
                    "--metrics_listen=127.0.0.1:0",
                    f"--metrics_port_file={metrics_file}"] + flags
            # Shard 0's replacement learns the cluster from a live shard.
            argv.append(f"--peer={endpoints[1]}" if shard == 0 else
                        f"--coordinator={endpoints[0]}")
            t0 = time.monotonic()
            servers[shard] = procs.start(argv, log)
            port = wait_port(port_file, servers[shard], 60)  # rolled back
            endpoints[shard] = f"127.0.0.1:{port}"
            metrics[shard] = wait_port(metrics_file, servers[shard], 10)
            with open(log) as f:
                m = re.search(r"took the state of step (\d+)", f.read())
            step = int(m.group(1))
            wait_for(lambda: steps_total(watch) >= step + 1, 60,
                     "a step after the replacement")
            rows.append((shard, time.monotonic() - t0, at_kill - step))
        return rows
    finally:
        procs.stop()


def step_seconds(args, work: str, interval: int, run: int) -> tuple:
    """(the slowest rank's mean step, the servers' CPU seconds per step)."""
    procs = Processes()
    try:
        config = replacement_config(work, interval)
        d = os.path.join(work, f"cost{run}_{interval}")  # None: default
        os.makedirs(d)
        coordinator, _ = start_shards(procs, args.server, d, 3,
                                      ["--trainers=2", f"--config={config}"])
        servers = list(procs.procs)
        trainers = [procs.start(
            [args.train, f"--coordinator={coordinator}", f"--config={config}",
             f"--steps={args.cost_steps}", "--data=/usr/share/common-licenses",
             "--threads=1", "--log_every=0", f"--rank={r}",
             f"--stats_json={d}/stats{r}.json"],
            os.path.join(d, f"trainer{r}.log")) for r in range(2)]
        for t in trainers:
            if t.wait(timeout=600) != 0:
                raise RuntimeError(f"a trainer failed (logs in {d})")
        cpu = sum(cpu_seconds(p.pid) for p in servers) / args.cost_steps
        return max(json.load(open(f"{d}/stats{r}.json"))["step_seconds"]
                   for r in range(2)), cpu
    finally:
        procs.stop()


def main() -> int:
    cleanup_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--timeouts", default="2,5",
                    help="comma-separated --trainer_timeout_s values")
    ap.add_argument("--rounds", type=int, default=5, help="kills per timeout")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--cost_steps", type=int, default=150,
                    help="steps of each snapshot-cost run")
    ap.add_argument("--cost_only", action="store_true",
                    help="measure only the snapshot cost (no faults)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    timeouts = [float(t) for t in args.timeouts.split(",")]
    rows = []
    for t in ([] if args.cost_only else timeouts):
        work = tempfile.mkdtemp(prefix="zs_recovery.")
        try:
            rows += run_timeout(args, work, t, rng)
        except Exception as e:  # noqa: BLE001 - report and fail the bench
            print(f"recovery_bench: timeout {t}: {e} (logs in {work})",
                  file=sys.stderr)
            return 1
        shutil.rmtree(work, ignore_errors=True)
    work = tempfile.mkdtemp(prefix="zs_replace.")
    try:
        replaced = [] if args.cost_only else run_shard_replace(args, work, rng)
        cost = {None: [], 1: [], 0: []}
        cpu = {None: [], 1: [], 0: []}
        for run in range(args.rounds):
            for interval in (None, 1, 0):
                secs, per_step = step_seconds(args, work, interval, run)
                cost[interval].append(secs)
                cpu[interval].append(per_step)
    except Exception as e:  # noqa: BLE001 - report and fail the bench
        print(f"recovery_bench: shard replacement: {e} (logs in {work})",
              file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'timeout_s':>10} {'kill':>5} {'kill->2nd step s':>17} "
          f"{'vs timeout':>11}")
    for t, k, secs in rows:
        print(f"{t:>10.1f} {k:>5} {secs:>17.2f} {secs / t:>11.2f}")
    for t in ([] if args.cost_only else timeouts):
        mine = [s for tt, _, s in rows if tt == t]
        print(f"timeout {t:.1f} s: median {statistics.median(mine):.2f} s, "
              f"max {max(mine):.2f} s")
    print(f"{'replaced shard':>15} {'start->step s':>14} {'steps lost':>11}")
    for shard, secs, lost in replaced:
        print(f"{shard:>15} {secs:>14.2f} {lost:>11}")
    print(f"{'round':>6} {'step ms, default interval':>26} "
          f"{'every step':>11} {'none':>8} {'default vs none':>16} "
          f"{'server CPU ms/step: default':>28} {'none':>6}")
    paired = []  # the same round's runs: (with - without) / without
    for run in range(args.rounds):
        paired.append((cost[None][run] - cost[0][run]) / cost[0][run])
        print(f"{run:>6} {1e3 * cost[None][run]:>26.2f} "
              f"{1e3 * cost[1][run]:>11.2f} {1e3 * cost[0][run]:>8.2f} "
              f"{paired[-1]:>16.3f} {1e3 * cpu[None][run]:>28.2f} "
              f"{1e3 * cpu[0][run]:>6.2f}")
    with_s, without = statistics.median(cost[None]), statistics.median(cost[0])
    every = statistics.median(cost[1])
    print(f"snapshot cost (medians of the rounds): default interval "
          f"{(with_s - without) / without:.3f}, every step "
          f"{(every - without) / without:.3f} of the step; median of the "
          f"rounds' own ratios {statistics.median(paired):.3f}")
    if cost[0]:
        extra = statistics.median(cpu[None]) - statistics.median(cpu[0])
        print(f"snapshot CPU (the servers', medians): {1e3 * extra:.2f} ms "
              f"per step more with the default interval, "
              f"{extra / without:.3f} of the step without snapshots")
    worst = max((s for tt, _, s in rows if tt == timeouts[0]),
                default=float("nan"))
    slowest = max((s for _, s, _ in replaced), default=float("nan"))
    print(f"RATIOS trainer_loss_recovery_s={worst:.2f} "
          f"shard_replace_recovery_s={slowest:.2f} "
          f"snapshot_vs_step={statistics.median(paired):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
