#!/usr/bin/env python3
"""ZeRO stages 2 and 3 across emulated hosts at several link rates (issue 19's
benchmark; tests/cluster/hosts.sh, needs root).

Four hosts: shards 0 and 1 on host 0, shards 2 and 3 on host 1, one trainer
on each of hosts 2 and 3; every host's link is shaped both ways to the rate
with tc tbf, so what crosses between hosts goes over tcp at that rate. Per
model, rate and stage (interleaved by rounds) it runs the model for --steps
steps and reads both trainers' --stats_json; a step's time is its slower
rank's, and the "step ms" is their mean after --warmup steps, over whole
snapshot intervals (the steps after the last whole one are left out):
every snapshot_interval_steps-th step also sends a shard's state to its
buddy's host, so at low rates the steps alternate between two times and a
median falls anywhere between them, while the planner predicts the mean
(it charges each step its share of a snapshot). Beside it, the compute floor: two
`zshard-train --local_world=2` processes on one host, no servers, no
communication, the same model and batches; the communication fraction is
1 - floor / step. Also the bytes each trainer moved per step (fetched +
pushed, counted by the data plane) and its gRPC calls to the shards per step
against groups x shards; the control calls that go over the data plane's
transport instead (leases, landing reservations, Landed, heartbeats: a
message on the connection the bytes use, answered by the shard, at once or
once what it waits for is there) are in their own column and listed by
method below, not counted as RPCs.

Each run also goes with ZeRO++'s quantized weights and gradients
(--quant: zero_quantized_weights and zero_quantized_gradients in that
zshard_quantization format; "none" leaves them out), the "quant" column.

Beside each shaped row, the planner's step time (`zshardctl plan` with the
run's parameters, groups, config, hosts and link rate) twice: with the
measured floor as --compute_ms (computation alone), and with the same
round's unshaped ("off") run of that model, stage and quantization (the
step when the link is not the limit: computation plus what the servers and
the data plane cost the two cores here, quantizing included); the planner
error is |planned - measured| / measured over those rows, from the unshaped
base when --rates has "off", else from the floor (unshaped rows have no
link rate to plan with: n/a). Rates run fastest first.

hpZ: the reference model at stage 3 with two trainers on each trainer host,
without and with zero_hpz_partition_size 2 (at --hpz_rate, default the
lowest rate): the bytes each trainer host fetches across its link per step
(its two trainers' network fetches, counted by the data plane) and what they
read from the host's shared memory instead.

Usage: links_bench.py --server build/server/zshard-server \\
                      --train build/client/zshard-train
       [--rates off,1gbit,200mbit] [--steps 8] [--warmup 2] [--rounds 1]
       [--wide] (adds a model of 50.6M parameters at the rates of at least
       1gbit) [--wide_steps N] (its runs' steps; default --steps)
       [--quant int8|fp8|none] [--ctl build/client/zshardctl]
       [--hpz_rate RATE|none] [--snapshot_interval N] (the runs'
       zshard_fault_tolerance.snapshot_interval_steps; default: the config's)
The last line is exactly
RATIOS quantized_bytes_vs_fp32=X hpz_crosshost_bytes_vs_plain=X
quant_step_vs_plain_at_low_link=X planner_error_max=X
rpcs_per_step_wide_vs_groups_x_shards=X
(the RPC ratio is of the largest model run, unquantized; the quantized
bytes ratio is the largest of quantized over plain MB/step over the rows;
the hpZ ratio the larger trainer host's cross-host fetch bytes with hpZ
over without; the step ratio is stage 3's at the lowest rate; n/a where a
run was left out).
Every process and namespace it makes is removed when it ends, also on
failure or SIGTERM / SIGHUP. Exits 1 when a run fails, 77 when hosts cannot
be made here.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_processes import Processes, cleanup_on_sigterm, wait_port

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = os.path.join(HERE, "..", "cluster", "hosts.sh")
SHARD_HOSTS = [0, 0, 1, 1]
TRAINER_HOSTS = [2, 3]
# The hpZ runs: two trainers on each trainer host (zero_hpz_partition_size 2
# makes ranks 0, 1 and 2, 3 one host's).
HPZ_TRAINER_HOSTS = [2, 2, 3, 3]
MODELS = {
    "reference": ["--d_model=160", "--layers=4", "--heads=4", "--context=64"],
    "wide": ["--d_model=1024", "--layers=4", "--heads=8", "--context=64"],
}
MICRO_BATCH = {"reference": 8, "wide": 2}


def config_text(stage: int, micro_batch: int, quant: str = "none",
                trainers: int = len(TRAINER_HOSTS), hpz: int = 1,
                snapshot_interval: int = -1) -> str:
    config = {
        "train_batch_size": micro_batch * trainers,
        "train_micro_batch_size_per_gpu": micro_batch,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e6,
                              "stage3_prefetch_bucket_size": 5e6,
                              "stage3_param_persistence_threshold": 1e5},
    }
    if quant != "none":
        config["zero_optimization"]["zero_quantized_weights"] = True
        config["zero_optimization"]["zero_quantized_gradients"] = True
        config["zshard_quantization"] = {"format": quant}
    if hpz > 1:
        config["zero_optimization"]["zero_hpz_partition_size"] = hpz
    if snapshot_interval >= 0:
        config["zshard_fault_tolerance"] = {
            "snapshot_interval_steps": snapshot_interval}
    return json.dumps(config)


def hosts(*args: str) -> None:
    subprocess.run([HOSTS, *args], check=True)


def addr(i: int) -> str:
    return f"10.231.0.{i + 1}"


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate; infinite for "off" (unshaped)."""
    if rate == "off":
        return float("inf")
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3),
                        ("bit", 1.0)):
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"--rates: '{rate}' is not a tc rate (200mbit, 1gbit)"
                     " or off")


def steps_of(a, model: str) -> int:
    """The steps of one run of `model`: --wide_steps for the wide one when
    given (its steps take seconds), --steps otherwise."""
    return a.wide_steps if model == "wide" and a.wide_steps > 0 else a.steps


def start_trainers(procs: Processes, a, tag: str, work: str, model: str,
                   kind: str, hosts_flags: list) -> list:
    """Starts one zshard-train per (host, flags) of `hosts_flags` with the
    run's common flags and --stats_json; returns (process, stats path)."""
    runs = []
    for r, (h, flags) in enumerate(hosts_flags):
        stats = os.path.join(work, f"{kind}{r}.json")
        argv = [HOSTS, "run", tag, str(h), a.train, f"--rank={r}",
                f"--steps={steps_of(a, model)}",
                "--data=/usr/share/common-licenses",
                "--threads=1", f"--stats_json={stats}"] + flags + MODELS[model]
        runs.append((procs.start(argv, os.path.join(work, f"{kind}{r}.log")),
                     stats))
    return runs


def wait_stats(runs: list, work: str, kind: str) -> list:
    """Waits for every run to exit 0 and returns their --stats_json."""
    out = []
    for p, stats in runs:
        if p.wait(timeout=3600) != 0:
            raise RuntimeError(f"a {kind} run failed (logs in {work})")
        with open(stats) as f:
            out.append(json.load(f))
    return out


def run_cluster(a, tag: str, work: str, model: str, stage: int,
                quant: str, trainer_hosts: list = TRAINER_HOSTS,
                hpz: int = 1) -> list:
    """One run across the hosts, rank r on trainer_hosts[r]; returns every
    trainer's stats."""
    config = os.path.join(work, f"config-{stage}-{quant}-{hpz}.json")
    with open(config, "w") as f:
        f.write(config_text(stage, MICRO_BATCH[model], quant,
                            len(trainer_hosts), hpz, a.snapshot_interval))
    procs = Processes()
    try:
        coordinator = ""
        for s, h in enumerate(SHARD_HOSTS):
            port_file = os.path.join(work, f"port{s}")
            if os.path.exists(port_file):
                os.remove(port_file)
            argv = [HOSTS, "run", tag, str(h), a.server,
                    f"--listen={addr(h)}:0", f"--port_file={port_file}",
                    f"--shard_id={s}", f"--num_shards={len(SHARD_HOSTS)}",
                    f"--trainers={len(trainer_hosts)}", f"--config={config}"]
            if s > 0:
                argv.append(f"--coordinator={coordinator}")
            p = procs.start(argv, os.path.join(work, f"server{s}.log"))
            port = wait_port(port_file, p, 60)
            if s == 0:
                coordinator = f"{addr(h)}:{port}"
        runs = start_trainers(
            procs, a, tag, work, model, "trainer",
            [(h, [f"--coordinator={coordinator}", f"--config={config}",
                  "--log_every=0", "--rpc_timeout_s=600"])
             for h in trainer_hosts])
        return wait_stats(runs, work, "trainer")
    finally:
        procs.stop()


def run_floor(a, tag: str, work: str, model: str) -> list:
    """The compute floor on host 2: two --local_world=2 processes."""
    config = os.path.join(work, "config-floor.json")
    with open(config, "w") as f:
        f.write(config_text(3, MICRO_BATCH[model]))
    procs = Processes()
    try:
        runs = start_trainers(
            procs, a, tag, work, model, "floor",
            [(TRAINER_HOSTS[0], [f"--local_world={len(TRAINER_HOSTS)}",
                                 f"--config={config}"])
             for _ in TRAINER_HOSTS])
        return wait_stats(runs, work, "floor")
    finally:
        procs.stop()


def planned_step(a, work: str, model: str, stage: int, quant: str,
                 rate: str, floor: float, stats: list) -> float:
    """The planner's step seconds for a run (nan for an unshaped link)."""
    if rate == "off":
        return float("nan")
    config = os.path.join(work, f"plan-{stage}-{quant}.json")
    with open(config, "w") as f:
        f.write(config_text(stage, MICRO_BATCH[model], quant,
                            snapshot_interval=a.snapshot_interval))
    out = subprocess.run(
        [a.ctl, "plan", f"--config={config}",
         f"--params={stats[0]['model_param_bytes'] // 4}",
         f"--groups={stats[0]['groups']}", f"--trainers={len(TRAINER_HOSTS)}",
         f"--shards={len(SHARD_HOSTS)}", "--trainers_per_host=1",
         f"--shards_per_host={SHARD_HOSTS.count(0)}",
         f"--link_gbps={rate_bits(rate) / 1e9}",
         f"--compute_ms={1e3 * floor}", "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)[stage]["step_seconds"]


def step_series(stats: list, warmup: int) -> list:
    """The slower rank's time of each step after `warmup`."""
    per_rank = [s["step_times"][warmup:] for s in stats]
    n = min(len(t) for t in per_rank)
    return [max(t[i] for t in per_rank) for i in range(n)]


# zshard_fault_tolerance.snapshot_interval_steps when the config has none.
DEFAULT_SNAPSHOT_INTERVAL = 2


def step_time(stats: list, warmup: int, interval: int) -> float:
    """Mean of the slower rank's time over the steps after `warmup`, over
    whole snapshot intervals of `interval` steps (0: no snapshots)."""
    steps = step_series(stats, warmup)
    if interval > 1 and len(steps) >= interval:
        steps = steps[:len(steps) - len(steps) % interval]
    return statistics.fmean(steps)


def host_fetch_mb(stats: list) -> list:
    """MB fetched over the network per step by each trainer host (its
    trainers' sum; ranks are on HPZ_TRAINER_HOSTS), and from host memory."""
    out = {}
    for r, s in enumerate(stats):
        net, local = out.get(HPZ_TRAINER_HOSTS[r], (0.0, 0.0))
        out[HPZ_TRAINER_HOSTS[r]] = (
            net + s["bytes_fetched"] / s["steps"] / 1e6,
            local + s["bytes_from_host"] / s["steps"] / 1e6)
    return [out[h] for h in sorted(out)]


def print_hpz(hpz_rows: dict, rate: str, warmup: int, interval: int) -> str:
    """The hpZ table; returns the ratio of cross-host fetch bytes (the
    larger over the trainer hosts, medians over rounds) or n/a."""
    if not hpz_rows:
        return "n/a"
    print(f"\nhpZ: reference model, stage 3, 2 trainers on each of 2 trainer "
          f"hosts, links at {rate}")
    print(f"{'hpz':>4} {'step ms':>9} {'host':>5} {'fetched across MB/step':>23} "
          f"{'from host memory MB/step':>25}")
    per_host = {}
    for hpz, runs in sorted(hpz_rows.items()):
        step = statistics.median(step_time(st, warmup, interval)
                                 for st in runs)
        hosts_mb = [host_fetch_mb(st) for st in runs]
        per_host[hpz] = []
        for i in range(len(hosts_mb[0])):
            net = statistics.median(h[i][0] for h in hosts_mb)
            local = statistics.median(h[i][1] for h in hosts_mb)
            per_host[hpz].append(net)
            print(f"{hpz:>4} {1e3 * step:>9.1f} {i + 2:>5} {net:>23.2f} "
                  f"{local:>25.2f}")
    ratio = max(w / p for w, p in zip(per_host[2], per_host[1]))
    print(f"hpZ cross-host fetch bytes / without (larger host) = {ratio:.3f}")
    return f"{ratio:.3f}"


def main() -> int:
    cleanup_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--rates", default="off,1gbit,200mbit")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--wide_steps", type=int, default=-1,
                   help="steps of the wide model's runs (default: --steps)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--wide", action="store_true")
    p.add_argument("--quant", default="int8", choices=["int8", "fp8", "none"])
    p.add_argument("--ctl", default="",
                   help="zshardctl (default: beside --train)")
    p.add_argument("--snapshot_interval", type=int, default=-1,
                   help="zshard_fault_tolerance.snapshot_interval_steps of "
                        "the runs (default: the config's default)")
    p.add_argument("--hpz_rate", default="",
                   help="rate of the hpZ runs (default: the lowest of "
                        "--rates); none: no hpZ runs")
    a = p.parse_args()
    if not a.ctl:
        a.ctl = os.path.join(os.path.dirname(a.train), "zshardctl")
    if a.steps <= a.warmup:
        p.error("--steps must be above --warmup")
    if 0 <= a.wide_steps <= a.warmup:
        p.error("--wide_steps must be above --warmup")
    interval = (a.snapshot_interval if a.snapshot_interval >= 0 else
                DEFAULT_SNAPSHOT_INTERVAL)
    rates = a.rates.split(",")
    for rate in rates:
        try:
            rate_bits(rate)
        except ValueError as e:
            p.error(str(e))
    # Fastest first: the unshaped runs of a round are the planner's base
    # for its shaped ones.
    rates.sort(key=rate_bits, reverse=True)
    models = ["reference"] + (["wide"] if a.wide else [])
    hpz_rate = a.hpz_rate or min(rates, key=rate_bits)
    if hpz_rate != "none":
        try:
            rate_bits(hpz_rate)
        except ValueError as e:
            p.error(str(e))
    quants = ["none"] + ([a.quant] if a.quant != "none" else [])
    tag = f"lb{os.getpid() % 10000}"
    code = subprocess.run([HOSTS, "up", tag, "4", "off"]).returncode
    if code == 77:
        print("links_bench: emulated hosts cannot be made here (see above)")
        return 77
    if code != 0:
        return 1
    work = tempfile.mkdtemp(prefix="zslinks.")
    rows, hpz_rows = {}, {}
    try:
        for _ in range(a.rounds):
            if hpz_rate != "none":
                for h in range(4):
                    hosts("shape", tag, str(h), hpz_rate)
                for hpz in (1, 2):
                    st = run_cluster(a, tag, work, "reference", 3, "none",
                                     HPZ_TRAINER_HOSTS, hpz)
                    hpz_rows.setdefault(hpz, []).append(st)
                    print(f"  hpZ {hpz} at {hpz_rate}: "
                          f"{1e3 * step_time(st, a.warmup, interval):.1f} ms",
                          file=sys.stderr, flush=True)
            for model in models:
                floor = step_time(run_floor(a, tag, work, model), a.warmup, 0)
                unshaped = {}  # (stage, quant): this round's step at "off"
                for rate in rates:
                    if model == "wide" and rate_bits(rate) < 1e9:
                        continue  # minutes per step below 1 Gbit/s
                    for h in range(4):
                        hosts("shape", tag, str(h), rate)
                    for stage in (2, 3):
                        for quant in quants:
                            st = run_cluster(a, tag, work, model, stage, quant)
                            if rate == "off":
                                unshaped[(stage, quant)] = step_time(
                                    st, a.warmup, interval)
                            base = unshaped.get((stage, quant))
                            plan = (
                                planned_step(a, work, model, stage, quant,
                                             rate, floor, st),
                                planned_step(a, work, model, stage, quant,
                                             rate, base, st)
                                if base else float("nan"))
                            rows.setdefault((model, rate, stage, quant),
                                            []).append((floor, st, plan))
                            steps = " ".join(
                                f"{1e3 * t:.0f}"
                                for t in step_series(st, a.warmup))
                            print(f"  {model} {rate} stage {stage} {quant}: "
                                  f"{1e3 * step_time(st, a.warmup, interval):.1f}"
                                  f" ms "
                                  f"(steps: {steps})",
                                  file=sys.stderr, flush=True)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"links_bench: {e}", file=sys.stderr)
        return 1
    finally:
        subprocess.run([HOSTS, "down", tag])
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'model':<10} {'link':>8} {'stage':>5} {'quant':>5} {'step ms':>9} "
          f"{'floor ms':>9} {'comm frac':>9} {'MB/step':>9} {'RPCs/step':>9} "
          f"{'xport/step':>10} {'groups x shards':>15} {'RPCs/(g x s)':>12} "
          f"{'plan(floor)':>11} {'plan(off)':>10}")
    rpc_ratio = {}
    step_of, mbs, errors, floor_errors = {}, {}, [], []
    for (model, rate, stage, quant), runs in rows.items():
        step = statistics.median(
            step_time(st, a.warmup, interval) for _, st, _ in runs)
        floor = statistics.median(f for f, _, _ in runs)
        plan = statistics.median(p[0] for _, _, p in runs)
        plan_off = statistics.median(p[1] for _, _, p in runs)
        if plan == plan:  # not nan
            floor_errors.append(abs(plan - step) / step)
        if plan_off == plan_off:
            errors.append(abs(plan_off - step) / step)
        st = runs[-1][1]
        mb = max(s["bytes_per_step"] for s in st) / 1e6
        rpcs = max(statistics.median(s["step_rpcs"][a.warmup:]) for s in st)
        gs = st[0]["groups"] * st[0]["shards"]
        xport = max(
            sum(s.get("transport_calls", {}).values()) /
            max(len(s["step_rpcs"]), 1) for s in st)
        if quant == "none":
            rpc_ratio[model] = rpcs / gs
        step_of[(model, rate, stage, quant)] = step
        mbs[(model, rate, stage, quant)] = mb
        print(f"{model:<10} {rate:>8} {stage:>5} {quant:>5} {1e3 * step:>9.1f} "
              f"{1e3 * floor:>9.1f} {1 - floor / step:>9.3f} {mb:>9.2f} "
              f"{rpcs:>9.1f} {xport:>10.1f} {gs:>15d} {rpcs / gs:>12.3f} "
              f"{'n/a' if plan != plan else f'{1e3 * plan:.1f}':>11} "
              f"{'n/a' if plan_off != plan_off else f'{1e3 * plan_off:.1f}':>10}")
    print("control RPCs per step by method (busiest rank, every step):")
    for (model, rate, stage, quant), runs in rows.items():
        st = runs[-1][1]
        busiest = max(st, key=lambda s: sum(s["rpcs"].values()))
        steps = max(len(busiest["step_rpcs"]), 1)
        parts = ", ".join(f"{m} {n / steps:.1f}"
                          for m, n in sorted(busiest["rpcs"].items()))
        calls = ", ".join(
            f"{m} {n / steps:.1f}"
            for m, n in sorted(busiest.get("transport_calls", {}).items()))
        print(f"  {model} {rate} stage {stage} {quant}: {parts}"
              f" (over the transport, not counted: {calls or 'none'})")
    for model in models:
        for rate in rates:
            for quant in quants:
                t2 = step_of.get((model, rate, 2, quant))
                t3 = step_of.get((model, rate, 3, quant))
                if t2 and t3:
                    print(f"{model} at {rate}, {quant}: stage 3 / stage 2 "
                          f"step time = {t3 / t2:.3f}")
    last = models[-1]
    q = quants[-1]
    bytes_ratio = step_ratio = "n/a"
    if q != "none":
        bytes_ratio = "%.3f" % max(
            mbs[k] / mbs[k[:3] + ("none",)] for k in mbs if k[3] == q)
        low = min((k for k in step_of if k[2] == 3 and k[3] == q),
                  key=lambda k: rate_bits(k[1]))
        step_ratio = "%.3f" % (step_of[low] / step_of[low[:3] + ("none",)])
        print(f"quantized ({q}) / plain step time at the lowest rate "
              f"({low[0]}, {low[1]}, stage 3) = {step_ratio}")
    hpz_ratio = print_hpz(hpz_rows, hpz_rate, a.warmup, interval)
    worst = {name: f"{max(e):.3f}" if e else "n/a"
             for name, e in (("off", errors), ("floor", floor_errors))}
    print(f"planner error, largest over the shaped rows: {worst['off']} with "
          f"the unshaped run's step as --compute_ms, {worst['floor']} with "
          f"the floor's")
    planner = worst["off"] if errors else worst["floor"]
    print(f"RATIOS quantized_bytes_vs_fp32={bytes_ratio} "
          f"hpz_crosshost_bytes_vs_plain={hpz_ratio} "
          f"quant_step_vs_plain_at_low_link={step_ratio} "
          f"planner_error_max={planner} "
          f"rpcs_per_step_wide_vs_groups_x_shards={rpc_ratio[last]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
