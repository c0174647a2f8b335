#!/usr/bin/env python3
"""The same Hugging Face GPT-2 (about 14M parameters) and batches trained
for --steps steps by zshard (4 servers, 2 Python trainers), by PyTorch
FSDP2 (fully_shard per block, gloo, 2 ranks) and by DeepSpeed ZeRO-3 (CPU
accelerator, 2 ranks) when it is installed; the systems take turns, round
after round, in one run. Prints a table (step time median / mean over the
steps after the warm-up, peak RSS per trainer) and last the line

    RATIOS zshard_vs_fsdp2=X zshard_vs_deepspeed=X zshard_resident_vs_fsdp2=X

(mean step time ratios and the peak trainer RSS ratio; NA where a system
did not run). Run it with the test virtual environment's Python:

    build/pyenv/bin/python tests/bench/python_bench.py \\
        --server_bin build/server/zshard-server --pythonpath build/python
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

LR = 1e-3
WD = 0.01


def ds_config(micro: int) -> Dict:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {
            "lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
            "weight_decay": WD}},
        # A prefetch window of about two blocks (DeepSpeed's default, 5e7
        # elements, would hold this whole model).
        "zero_optimization": {"stage": 3,
                              "stage3_prefetch_bucket_size": 4000000},
    }


# ------------------------------------------------------------------ worker
def build_model(args: argparse.Namespace):
    import torch
    import transformers
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(
        vocab_size=args.vocab, n_positions=args.context, n_embd=args.width,
        n_layer=args.layers, n_head=6, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(cfg)


def batch(args: argparse.Namespace, rank: int, step: int):
    import torch
    g = torch.Generator().manual_seed(1000003 * rank + step)
    return torch.randint(0, args.vocab, (args.micro_batch, args.context),
                         generator=g)


def run_zshard(args: argparse.Namespace) -> Dict:
    import zshard
    model = build_model(args)
    engine, _, _, _ = zshard.initialize(model=model,
                                        config=os.environ["ZSHARD_CONFIG"])
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tokens = batch(args, engine.rank, step)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    return {"rank": engine.rank, "times": times, "loss": loss.item(),
            "params": sum(n for _, n in engine.groups())}


def run_fsdp2(args: argparse.Namespace) -> Dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tokens = batch(args, rank, step)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return {"rank": rank, "times": times, "loss": loss.item(),
            "params": params}


def run_deepspeed(args: argparse.Namespace) -> Dict:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    import torch
    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    cfg = ds_config(args.micro_batch)
    cfg["zero_force_ds_cpu_optimizer"] = False
    cfg["optimizer"]["type"] = "AdamW"
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg,
                                           model_parameters=model.parameters())
    rank = engine.global_rank
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tokens = batch(args, rank, step)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    del torch
    return {"rank": rank, "times": times, "loss": loss.item(),
            "params": params}


def worker(args: argparse.Namespace) -> int:
    import torch
    torch.set_num_threads(1)
    fn = {"zshard": run_zshard, "fsdp2": run_fsdp2,
          "deepspeed": run_deepspeed}[args.worker]
    result = fn(args)
    result["peak_rss_bytes"] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(f"{args.out}.{result['rank']}", "w") as f:
        json.dump(result, f)
    return 0


# ------------------------------------------------------------ orchestrator
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def worker_args(args: argparse.Namespace, system: str, out: str) -> List[str]:
    return [os.path.abspath(__file__), "--worker", system, "--out", out,
            "--steps", str(args.steps), "--micro_batch", str(args.micro_batch),
            "--context", str(args.context), "--width", str(args.width),
            "--layers", str(args.layers), "--vocab", str(args.vocab)]


def run_system(args: argparse.Namespace, system: str,
               work: str) -> Optional[List[Dict]]:
    out = os.path.join(work, f"{system}.json")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + \
            env.get("PYTHONPATH", "")
    py = sys.executable
    if system == "zshard":
        cfg = os.path.join(work, "ds_config.json")
        with open(cfg, "w") as f:
            json.dump(ds_config(args.micro_batch), f)
        cmd = [py, "-m", "zshard", "launch", f"--shards={args.shards}",
               "--trainers=2", f"--config={cfg}"]
        if args.server_bin:
            cmd.append(f"--server_bin={args.server_bin}")
        cmd += ["--", py] + worker_args(args, system, out)
    else:
        cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node=2",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
        cmd += worker_args(args, system, out)
        env["DS_ACCELERATOR"] = "cpu"
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True,
                       timeout=args.timeout_s)
    if r.returncode != 0:
        print(f"python_bench: {system} failed (status {r.returncode}):\n"
              + "\n".join(r.stdout.splitlines()[-25:]), file=sys.stderr)
        return None
    results = []
    for rank in range(2):
        with open(f"{out}.{rank}") as f:
            results.append(json.load(f))
        os.remove(f"{out}.{rank}")
    return results


def have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:  # a broken install counts as absent
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3,
                    help="first steps left out of the step times")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--systems", default="zshard,fsdp2,deepspeed")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--micro_batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--server_bin", default="")
    ap.add_argument("--pythonpath", default="",
                    help="where the zshard package is (e.g. build/python)")
    ap.add_argument("--timeout_s", type=float, default=1200)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    systems = [s for s in args.systems.split(",") if s]
    if "deepspeed" in systems and not have("deepspeed"):
        print("python_bench: deepspeed is not installed; its column is NA")
        systems.remove("deepspeed")
    runs: Dict[str, List[List[Dict]]] = {s: [] for s in systems}
    work = tempfile.mkdtemp(prefix="zshard-pybench-")
    for rnd in range(args.rounds):
        order = systems if rnd % 2 == 0 else list(reversed(systems))
        for system in order:
            got = run_system(args, system, work)
            if got is not None:
                runs[system].append(got)

    print(f"\n{args.steps} steps (first {args.warmup} left out), 2 trainers, "
          f"micro batch {args.micro_batch} x {args.context} tokens, "
          f"{args.rounds} round(s) interleaved")
    print(f"{'system':<10} {'params':>10} {'median ms':>10} {'mean ms':>9} "
          f"{'peak RSS MB/trainer':>20} {'final loss':>11}")
    means: Dict[str, float] = {}
    rss: Dict[str, float] = {}
    for system, rounds in runs.items():
        if not rounds:
            continue
        steps = [t for r in rounds for rank in r
                 for t in rank["times"][args.warmup:]]
        means[system] = statistics.mean(steps)
        rss[system] = max(rank["peak_rss_bytes"] for r in rounds for rank in r)
        print(f"{system:<10} {rounds[0][0]['params']:>10} "
              f"{statistics.median(steps) * 1e3:>10.1f} "
              f"{means[system] * 1e3:>9.1f} {rss[system] / 2**20:>20.1f} "
              f"{rounds[-1][0]['loss']:>11.4f}")

    def ratio(a: Dict[str, float], x: str, y: str) -> str:
        return f"{a[x] / a[y]:.3f}" if x in a and y in a else "NA"

    print(f"RATIOS zshard_vs_fsdp2={ratio(means, 'zshard', 'fsdp2')} "
          f"zshard_vs_deepspeed={ratio(means, 'zshard', 'deepspeed')} "
          f"zshard_resident_vs_fsdp2={ratio(rss, 'zshard', 'fsdp2')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
