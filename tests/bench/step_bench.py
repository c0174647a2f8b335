#!/usr/bin/env python3
"""Step time of zshard against its compute floor (issue 13's benchmark).

In each round, interleaved, for the default shape (d 160, 4 layers) and a
large one (d 512, 8 layers), with activations kept and with activation
checkpointing, it runs:
  floor   two `zshard-train --local_world=2` processes: the same model,
          batches, thread count and activation policy, no servers, no
          communication;
  ucx     4 zshard-server + 2 zshard-train on 127.0.0.1, ZeRO stage 3, ucx;
  inline  the same over the inline (gRPC) data plane.
A step's time is its slowest rank's; the first --warmup steps of a run are
left out. Slow steps are those above 1.8 x the run's median. The table has
one row per (shape, policy, plane) with the median over rounds of each
run's median and mean, the ratios to the floor of the same round, and
where the CPU goes: the trainers' CPU per step (every thread of both
ranks), split into their training-loop threads' (the model's computation,
and its ratio to the floor's: how much slower the same computation runs
beside the servers and the data plane) and the others' (transfers, RPCs),
and the servers' (every thread of the 4 shards); and where the training
loops' time goes besides their CPU: runnable but waiting for a CPU
(preempted by other threads) and asleep (waiting for parameters,
acknowledgements, the other rank). On a machine whose cores
the servers share with the trainers, a step cannot be shorter than the
two together divided by the cores.

Usage: step_bench.py --server build/server/zshard-server \\
                     --train build/client/zshard-train [--rounds 3] ...
(--help lists the flags: shapes, policies, steps, micro batch, threads, and
--floor_train to measure another build's servers and trainers against this
build's floor).
Every process it starts is stopped when it ends, also on failure or
SIGTERM / SIGHUP. Exits 1
when a run fails.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_processes import (Processes, cleanup_on_sigterm, cpu_seconds,
                             thread_totals, totals_since, wait_port)

SHARDS = 4
TRAINERS = 2
SHAPES = {
    "default": ["--d_model=160", "--layers=4", "--heads=4", "--context=64"],
    "large": ["--d_model=512", "--layers=8", "--heads=8", "--context=64"],
}
PLANES = ["floor", "ucx", "inline"]
# (OpenBLAS core, the core --blas_core replaced) of every trainer run.
BLAS_CORES: set = set()
POLICIES = ["kept", "recompute"]


def config_text(micro_batch: int, policy: str, snapshot_interval: int) -> str:
    config = {
        "train_batch_size": micro_batch * TRAINERS,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3},
    }
    if policy == "recompute":
        config["activation_checkpointing"] = {}
    if snapshot_interval >= 0:
        config["zshard_fault_tolerance"] = {
            "snapshot_interval_steps": snapshot_interval}
    return json.dumps(config)


def run_once(args, work: str, shape: str, policy: str, plane: str,
             steps: int) -> tuple:
    """One run; returns the slowest rank's time of each step (seconds), the
    trainers' CPU seconds per step (all their threads, summed over ranks,
    median over the measured steps), the same for the trainers' training
    loop threads alone (the computation), the seconds per step those threads
    were runnable but waited for a CPU and the seconds they slept (both
    summed over ranks, median over the measured steps; NaN from a build or
    kernel that does not record them) and the servers' CPU seconds per step
    (summed over shards, from their start to the trainers' end, over every
    step: start-up and warmup included), and per step of the training loop
    (warmup included) each thread name's [CPU seconds, voluntary and
    involuntary context switches, threads] keyed by ("trainers" or
    "servers", name)."""
    d = tempfile.mkdtemp(dir=work, prefix=f"{shape}-{policy}-{plane}-")
    config = os.path.join(d, "ds_config.json")
    with open(config, "w") as f:
        f.write(config_text(args.micro_batch, policy, args.snapshot_interval))
    procs = Processes()
    try:
        common = [f"--config={config}", f"--steps={steps}",
                  f"--threads={args.threads}", "--log_every=0",
                  f"--micro_batch={args.micro_batch}"] + SHAPES[shape]
        if args.blas_core != "auto":  # an older --floor_train lacks the flag
            common.append(f"--blas_core={args.blas_core}")
        trainers = []
        servers = []
        if plane == "floor":
            for r in range(TRAINERS):
                trainers.append(procs.start(
                    [args.floor_train or args.train,
                     f"--local_world={TRAINERS}", f"--rank={r}",
                     f"--stats_json={d}/stats{r}.json"] + common,
                    f"{d}/trainer{r}.log"))
        else:
            coordinator = ""
            for s in range(SHARDS):
                argv = [args.server, "--listen=127.0.0.1:0",
                        f"--port_file={d}/port{s}", f"--shard_id={s}",
                        f"--num_shards={SHARDS}", f"--trainers={TRAINERS}",
                        f"--config={config}", f"--transport={plane}"]
                if s > 0:
                    argv.append(f"--coordinator={coordinator}")
                p = procs.start(argv, f"{d}/server{s}.log")
                servers.append(p)
                port = wait_port(f"{d}/port{s}", p, 30)
                if s == 0:
                    coordinator = f"127.0.0.1:{port}"
            for r in range(TRAINERS):
                trainers.append(procs.start(
                    [args.train, f"--coordinator={coordinator}",
                     f"--rank={r}", f"--stats_json={d}/stats{r}.json"] +
                    common, f"{d}/trainer{r}.log"))
        # The servers' threads from the trainers' first training step on.
        servers_at_start = servers_at_loop_start(d, trainers, servers,
                                                 args.run_timeout_s)
        server_cpu = 0.0
        for r, p in enumerate(trainers):
            code = p.wait(timeout=args.run_timeout_s)
            if code != 0:
                with open(f"{d}/trainer{r}.log") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(
                    f"{shape}/{policy}/{plane}: trainer {r} exited {code}:\n"
                    f"{tail}")
        server_cpu = sum(cpu_seconds(p.pid) for p in servers)
        threads: dict = {}
        for p, was in zip(servers, servers_at_start):
            add_threads(threads, "servers",
                        totals_since(thread_totals(p.pid), was))
        times, cpus, mains, queued = [], [], [], []
        for r in range(TRAINERS):
            with open(f"{d}/stats{r}.json") as f:
                stats = json.load(f)
            times.append(stats["step_times"])
            BLAS_CORES.add((stats.get("blas_core", "?"),
                            stats.get("blas_core_replaced", "")))
            # An older --floor_train build does not record them.
            cpus.append(stats.get("step_cpu_times") or
                        [float("nan")] * len(stats["step_times"]))
            mains.append(stats.get("step_main_cpu_times") or
                         [float("nan")] * len(stats["step_times"]))
            queued.append(stats.get("step_main_runqueue_times") or
                          [float("nan")] * len(stats["step_times"]))
            add_threads(threads, "trainers", {
                name: [t["cpu_seconds"], t["voluntary_switches"],
                       t["involuntary_switches"], t["threads"]]
                for name, t in stats.get("thread_totals", {}).items()})
        steps_done = min(len(t) for t in times)
        measured = range(args.warmup, steps_done)
        return ([max(t[i] for t in times) for i in measured],
                statistics.median(sum(c[i] for c in cpus) for i in measured),
                statistics.median(sum(c[i] for c in mains) for i in measured),
                statistics.median(sum(q[i] for q in queued)
                                  for i in measured),
                statistics.median(
                    sum(t[i] - c[i] - q[i]
                        for t, c, q in zip(times, mains, queued))
                    for i in measured),
                server_cpu / max(steps_done, 1),
                {k: [v[0] / max(steps_done, 1), v[1] / max(steps_done, 1),
                     v[2] / max(steps_done, 1), v[3]]
                 for k, v in threads.items()})
    finally:
        procs.stop()
        shutil.rmtree(d, ignore_errors=True)


def servers_at_loop_start(d: str, trainers: list, servers: list,
                          timeout_s: float) -> list:
    """Each server's thread_totals once every trainer has created its
    <stats_json>.started (its training loop began), or when one has exited
    or timeout_s passed (then from that moment)."""
    end = time.monotonic() + timeout_s
    while (time.monotonic() < end and servers and
           all(p.poll() is None for p in trainers) and
           not all(os.path.exists(f"{d}/stats{r}.json.started")
                   for r in range(len(trainers)))):
        time.sleep(0.02)
    return [thread_totals(p.pid) for p in servers]


def add_threads(into: dict, side: str, totals: dict) -> None:
    """Adds one process's thread_totals to `into`[(side, name)]."""
    for name, t in totals.items():
        acc = into.setdefault((side, name), [0.0, 0, 0, 0])
        for i in range(4):
            acc[i] += t[i]


def slow(times: list) -> int:
    median = statistics.median(times)
    return sum(1 for t in times if t > 1.8 * median)


def print_threads(threads: dict, shapes: list, policies: list) -> None:
    """Where the CPU outside the floor goes: per run, each thread name of
    the trainers (both ranks) and of the servers (all shards) that used at
    least 0.05 ms per step, medians over rounds."""
    print()
    print("Threads by name, over every step of the training loop (servers: "
          "from the trainers' first step to their exit); ms of CPU and "
          "context switches per step, both ranks or all shards together, "
          "median over rounds; blocked: it waited (voluntary), preempted: "
          "another thread took its CPU (involuntary)")
    print("| shape | activations | plane | side | thread | threads | CPU | "
          "blocked | preempted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for policy in policies:
            for plane in PLANES:
                rounds = threads[(shape, policy, plane)]
                names = sorted({k for r in rounds for k in r})

                def med(k, i):
                    return statistics.median(
                        r.get(k, [0.0, 0, 0, 0])[i] for r in rounds)

                names.sort(key=lambda k: (k[0] != "trainers", -med(k, 0)))
                for k in names:
                    if 1e3 * med(k, 0) < 0.05:
                        continue
                    print(f"| {shape} | {policy} | {plane} | {k[0]} | {k[1]} "
                          f"| {med(k, 3):.0f} | {1e3 * med(k, 0):.2f} | "
                          f"{med(k, 1):.1f} | {med(k, 2):.1f} |")


def main() -> int:
    cleanup_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--floor_train", default="",
                        help="zshard-train for the floor runs (default: "
                             "--train); lets an older build, without "
                             "--local_world, be measured against the floor")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60,
                        help="steps per run at the default shape")
    parser.add_argument("--large_steps", type=int, default=14,
                        help="steps per run at the large shape")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--micro_batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--blas_core", default="auto",
                        help="zshard-train's --blas_core for every run "
                             "(auto, keep or an OpenBLAS core name)")
    parser.add_argument("--shapes", default="default,large")
    parser.add_argument("--policies", default="kept,recompute")
    parser.add_argument("--run_timeout_s", type=float, default=600)
    parser.add_argument("--snapshot_interval", type=int, default=-1,
                        help="zshard_fault_tolerance.snapshot_interval_steps "
                             "for the servers (0: no in-memory snapshots); "
                             "default: the config's default")
    args = parser.parse_args()
    if args.snapshot_interval < -1:
        parser.error("--snapshot_interval: must be >= 0 (or -1, the "
                     "default)")
    shapes = args.shapes.split(",")
    policies = args.policies.split(",")
    for s in shapes:
        if s not in SHAPES:
            parser.error(f"--shapes: unknown shape '{s}'")
    for p in policies:
        if p not in POLICIES:
            parser.error(f"--policies: unknown policy '{p}'")

    work = tempfile.mkdtemp(prefix="zshard-step-bench.")
    # results[(shape, policy, plane)] = one entry per round: (median, mean,
    # slow steps, trainers' CPU, servers' CPU, loops' CPU, loops' run-queue
    # wait, loops' sleep), seconds.
    results: dict = {}
    # threads[(shape, policy, plane)] = one entry per round: {(side, thread
    # name): [CPU seconds, voluntary and involuntary switches per step,
    # threads]}.
    threads: dict = {}
    try:
        for rnd in range(args.rounds):
            for shape in shapes:
                steps = args.steps if shape == "default" else args.large_steps
                steps += args.warmup
                for policy in policies:
                    for plane in PLANES:
                        t, tcpu, mcpu, mq, ms, scpu, thr = run_once(
                            args, work, shape, policy, plane, steps)
                        results.setdefault((shape, policy, plane), []).append(
                            (statistics.median(t), statistics.mean(t),
                             slow(t), tcpu, scpu, mcpu, mq, ms))
                        threads.setdefault((shape, policy, plane),
                                           []).append(thr)
                        print(f"round {rnd} {shape:7} {policy:9} {plane:6} "
                              f"median {1e3 * statistics.median(t):7.1f} ms "
                              f"mean {1e3 * statistics.mean(t):7.1f} ms "
                              f"slow {slow(t)} cpu: trainers "
                              f"{1e3 * tcpu:6.1f} (loops {1e3 * mcpu:6.1f}, "
                              f"queued {1e3 * mq:5.1f}, slept {1e3 * ms:5.1f})"
                              f" servers {1e3 * scpu:6.1f} ms/step",
                              flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"step_bench: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def ratio(shape: str, policy: str, plane: str, which: int) -> float:
        """Median over rounds of plane / floor of the same round."""
        z = results[(shape, policy, plane)]
        f = results[(shape, policy, "floor")]
        return statistics.median(a[which] / b[which] for a, b in zip(z, f))

    print()
    print(f"{args.rounds} rounds, {TRAINERS} trainers x {args.threads} "
          f"thread, micro batch {args.micro_batch}, {SHARDS} shards, "
          f"stage 3, snapshot interval "
          f"{'default' if args.snapshot_interval < 0 else args.snapshot_interval}"
          f"; ms, slowest rank, median over rounds; CPU: ms per "
          f"step, all ranks' or all shards' threads together; loops: the "
          f"trainers' training-loop threads alone (the computation), "
          f"others: the rest of the trainers' threads; loops queued / "
          f"slept: ms per step the loops were runnable but waited for a "
          f"CPU / slept (waiting for parameters, acknowledgements, the "
          f"other rank), summed over ranks")
    cores = ", ".join(sorted(
        (c or "none") + (f" (in place of {r})" if r else "")
        for c, r in BLAS_CORES))  # "?": a build that does not say
    print(f"OpenBLAS core of the trainers: {cores} "
          f"(--blas_core={args.blas_core})")
    print(f"| shape | activations | plane | median | mean | "
          f"median/floor | mean/floor | slow steps | trainers CPU | "
          f"loops CPU | loops/floor | loops queued | loops slept | "
          f"others CPU | servers CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for policy in policies:
            for plane in PLANES:
                r = results[(shape, policy, plane)]
                med = statistics.median(x[0] for x in r)
                mean = statistics.median(x[1] for x in r)
                nslow = sum(x[2] for x in r)
                rm = "" if plane == "floor" else \
                    f"{ratio(shape, policy, plane, 0):.3f}"
                rn = "" if plane == "floor" else \
                    f"{ratio(shape, policy, plane, 1):.3f}"
                tcpu = statistics.median(x[3] for x in r)
                scpu = statistics.median(x[4] for x in r)
                mcpu = statistics.median(x[5] for x in r)
                mq = statistics.median(x[6] for x in r)
                ms = statistics.median(x[7] for x in r)
                # Two clocks read one after the other: never below 0.
                ocpu = max(0.0, statistics.median(x[3] - x[5] for x in r))
                rl = "" if plane == "floor" else \
                    f"{ratio(shape, policy, plane, 5):.3f}"
                print(f"| {shape} | {policy} | {plane} | {1e3 * med:.1f} | "
                      f"{1e3 * mean:.1f} | {rm} | {rn} | {nslow} | "
                      f"{1e3 * tcpu:.1f} | {1e3 * mcpu:.1f} | {rl} | "
                      f"{1e3 * mq:.1f} | {1e3 * ms:.1f} | "
                      f"{1e3 * ocpu:.1f} | {1e3 * scpu:.1f} |")
    print_threads(threads, shapes, policies)
    if "default" not in shapes or "kept" not in policies:
        return 0
    slow_steps = sum(x[2] for plane in ("ucx", "inline")
                     for x in results[("default", "kept", plane)])
    large = (f"{ratio('large', 'kept', 'ucx', 1):.3f}"
             if "large" in shapes else "nan")
    print(f"RATIOS ucx_mean_vs_floor={ratio('default', 'kept', 'ucx', 1):.3f} "
          f"ucx_median_vs_floor={ratio('default', 'kept', 'ucx', 0):.3f} "
          f"inline_mean_vs_floor={ratio('default', 'kept', 'inline', 1):.3f} "
          f"large_ucx_mean_vs_floor={large} slow_steps={slow_steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
