"""One trainer rank of the safetensors test: the model is built with
``zshard.empty_parameters()`` (no parameter storage at all) and rank 0
registers the values of a safetensors file group by group; every rank
saves what the servers then hold and trains 2 steps.

    train_from_file.py --file model.safetensors --out DIR
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402
import zshard  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with zshard.empty_parameters():
        model = hf_models.build("llama", layers=4, seed=99)
    meta = all(p.is_meta for p in model.parameters())
    engine, _, _, _ = zshard.initialize(
        model=model, config=os.environ["ZSHARD_CONFIG"],
        init_from=args.file)
    registered = engine.full_state_dict()
    losses = []
    while engine.global_steps < 2:
        loss = hf_models.loss_of(
            engine, hf_models.batch(engine.rank, engine.global_steps))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    torch.save({"meta": meta, "registered": registered, "losses": losses,
                "peak_bound": engine.stats()["peak_bound_param_bytes"],
                "groups": engine.groups()},
               os.path.join(args.out, f"rank{engine.rank}.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
