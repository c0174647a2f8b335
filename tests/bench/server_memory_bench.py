#!/usr/bin/env python3
"""Server memory per owned parameter against trainers and accumulation.

Issue 18's benchmark. For every T in --trainers and A in --accumulation,
interleaved over --rounds, it starts one zshard-server (ucx data plane) and T
zshard-train processes (default GPT shape, micro batch 1, one thread each)
that train --steps steps, and measures:
  peak/param   the server's peak resident bytes (VmHWM) minus its idle
               resident bytes before the model was registered, per owned
               parameter;
  rss/param    the same for its resident bytes (VmRSS) once the trainers
               are done: what training holds;
  store/param  what the store accounts for itself (GetStatus.memory: state,
               published copies, landing pool, accumulators) per parameter,
               when the server reports it (builds before issue 18 do not);
  reduce ns    the server's reduce time per contribution element folded
               (GetStatus.memory, likewise).
The table has the median over rounds; the last line is
  RATIOS server_bytes_per_param_t16a4=X server_bytes_per_param_t2a1=X
         growth_t16a4_vs_t2a1=X reduce_ns_per_elem=X
from rss/param (and the reduce time at T 16, A 4; nan without it).

Usage: server_memory_bench.py --server build/server/zshard-server \\
           --train build/client/zshard-train --ctl build/client/zshardctl
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

from bench_processes import Processes, cleanup_on_sigterm, wait_port


def config_text(trainers: int, accumulation: int) -> str:
    return json.dumps({
        "train_batch_size": trainers * accumulation,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3},
    })


def proc_status(pid: int, field: str) -> int:
    """A /proc/PID/status field in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def shard_status(ctl: str, endpoint: str) -> dict:
    """Shard 0's GetStatus as JSON (empty when zshardctl cannot say it)."""
    r = subprocess.run([ctl, "status", f"--server={endpoint}", "--json"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return {}
    shards = json.loads(r.stdout)
    return shards[0] if shards else {}


def run_once(args, work: str, trainers: int, accumulation: int) -> dict:
    d = tempfile.mkdtemp(dir=work, prefix=f"t{trainers}a{accumulation}-")
    config = os.path.join(d, "ds_config.json")
    with open(config, "w") as f:
        f.write(config_text(trainers, accumulation))
    procs = Processes()
    try:
        server = procs.start(
            [args.server, "--listen=127.0.0.1:0", f"--port_file={d}/port",
             f"--trainers={trainers}", f"--config={config}",
             "--transport=ucx"] + args.server_flag, f"{d}/server.log")
        endpoint = f"127.0.0.1:{wait_port(f'{d}/port', server, 30)}"
        time.sleep(0.5)
        idle = proc_status(server.pid, "VmRSS")
        ps = []
        for r in range(trainers):
            ps.append(procs.start(
                [args.train, f"--coordinator={endpoint}", f"--rank={r}",
                 f"--config={config}", f"--steps={args.steps}", "--threads=1", "--log_every=0",
                 "--micro_batch=1"], f"{d}/trainer{r}.log"))
        for r, p in enumerate(ps):
            code = p.wait(timeout=args.run_timeout_s)
            if code != 0:
                with open(f"{d}/trainer{r}.log") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(f"t{trainers}a{accumulation}: trainer {r} "
                                   f"exited {code}:\n{tail}")
        peak = proc_status(server.pid, "VmHWM")
        end = proc_status(server.pid, "VmRSS")
        status = shard_status(args.ctl, endpoint)
        params = int(status.get("sliceElements", 0)) or args.params
        memory = status.get("memory", {})
        out = {"peak": (peak - idle) / params, "rss": (end - idle) / params,
               "params": params,
               "store": float("nan"), "reduce_ns": float("nan")}
        if memory:
            out["store"] = int(memory.get("totalBytes", 0)) / params
            elems = int(memory.get("reducedElements", 0))
            if elems:
                out["reduce_ns"] = 1e9 * memory.get("reduceSeconds", 0) / elems
        return out
    finally:
        procs.stop()
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    cleanup_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--ctl", required=True, help="zshardctl")
    parser.add_argument("--trainers", default="2,4,8,16")
    parser.add_argument("--accumulation", default="1,4")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--params", type=int, default=0,
                        help="owned parameters, when zshardctl cannot say")
    parser.add_argument("--server_flag", action="append", default=[],
                        help="extra zshard-server flag (repeatable)")
    parser.add_argument("--run_timeout_s", type=float, default=600)
    args = parser.parse_args()
    ts = [int(t) for t in args.trainers.split(",")]
    accs = [int(a) for a in args.accumulation.split(",")]

    work = tempfile.mkdtemp(prefix="zshard-memory-bench.")
    results: dict = {}
    try:
        for rnd in range(args.rounds):
            for a in accs:
                for t in ts:
                    r = run_once(args, work, t, a)
                    results.setdefault((t, a), []).append(r)
                    print(f"round {rnd} T {t:2} A {a}: peak/param "
                          f"{r['peak']:7.2f} B, rss/param {r['rss']:7.2f} B, "
                          f"store/param {r['store']:7.2f} "
                          f"B, reduce {r['reduce_ns']:.3f} ns/elem "
                          f"({r['params']} params)", flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"server_memory_bench: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(t: int, a: int, key: str) -> float:
        return statistics.median(x[key] for x in results[(t, a)])

    print()
    print(f"{args.rounds} rounds, 1 shard, micro batch 1, {args.steps} steps; "
          f"bytes per owned parameter, median over rounds")
    print("| trainers | accumulation | peak/param | rss/param | store/param | "
          "reduce ns/elem |")
    print("|---|---|---|---|---|---|")
    for a in accs:
        for t in ts:
            print(f"| {t} | {a} | {med(t, a, 'peak'):.2f} | "
                  f"{med(t, a, 'rss'):.2f} | "
                  f"{med(t, a, 'store'):.2f} | {med(t, a, 'reduce_ns'):.3f} |")
    if (16, 4) not in results or (2, 1) not in results:
        return 0
    big, small = med(16, 4, "rss"), med(2, 1, "rss")
    print(f"RATIOS server_bytes_per_param_t16a4={big:.2f} "
          f"server_bytes_per_param_t2a1={small:.2f} "
          f"growth_t16a4_vs_t2a1={big / small:.3f} "
          f"reduce_ns_per_elem={med(16, 4, 'reduce_ns'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
