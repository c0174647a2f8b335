"""One trainer rank of the Python tests: trains a small Hugging Face model
through zshard (run by ``zshard launch``) and, on rank 0, saves the final
parameters the servers hold.

    train_hf.py --model gpt2 --steps 10 --out final.pt [--residency FILE]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402
import zshard  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--same_batch", action="store_true",
                    help="every step trains on step 0's batch (the loss must "
                    "fall)")
    ap.add_argument("--trace", default="",
                    help="rank 0 writes losses, learning rates and loss "
                    "scales per step as JSON")
    ap.add_argument("--checkpointing", default="",
                    help="reentrant or non_reentrant: Hugging Face's "
                    "gradient_checkpointing_enable (recompute in backward)")
    ap.add_argument("--residency", default="",
                    help="write the bound bytes seen in every hook as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = hf_models.build(args.model, args.layers)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
            "use_reentrant": args.checkpointing == "reentrant"})
    engine, _, _, _ = zshard.initialize(
        model=model, config=os.environ["ZSHARD_CONFIG"])
    samples = []
    between = []  # bound bytes after each step
    if args.residency:
        def note(*_):
            samples.append(engine.bound_parameter_bytes())
        for name, _ in engine.groups():
            if name == "root":
                continue
            block = model.get_submodule(name)
            block.register_forward_pre_hook(lambda m, a: note())
            block.register_forward_hook(lambda m, a, o: note())
            block.register_full_backward_hook(lambda m, gi, go: note())
    accum = engine.gradient_accumulation_steps
    trace = {"loss": [], "lr": [], "loss_scale": [], "dtype": str(engine.dtype)}
    while engine.global_steps < args.steps:
        step = 0 if args.same_batch else engine.global_steps
        trace["lr"].append(engine.get_lr()[0])
        trace["loss_scale"].append(engine.loss_scale)
        for micro in range(accum):
            loss = hf_models.loss_of(engine,
                                     hf_models.batch(engine.rank, step, micro))
            engine.backward(loss)
            engine.step()
        between.append(engine.bound_parameter_bytes())
        trace["loss"].append(loss.item())
        print(f"step {engine.global_steps} loss {loss.item():.6f} "
              f"lr {engine.get_lr()[0]:.6g}", flush=True)
    if args.residency:
        with open(args.residency + f".{engine.rank}", "w") as f:
            json.dump({"samples": samples, "between": between,
                       "groups": engine.groups(),
                       "stats": engine.stats(),
                       "element_size": torch.tensor(
                           [], dtype=engine.dtype).element_size()}, f)
    if args.trace and engine.rank == 0:
        with open(args.trace, "w") as f:
            json.dump(trace, f)
    if args.out and engine.rank == 0:
        torch.save(engine.full_state_dict(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
