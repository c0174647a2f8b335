"""One trainer rank of the LoRA test: GPT-2 with peft LoRA adapters on
its attention (the base frozen), trained through zshard; the servers take
a checkpoint after step 1 (a full base) and after the last step (a delta).
Rank 0 saves the parameters before and after, and the checkpoints' sizes.

    train_lora.py --steps 6 --out result.pt
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
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import peft
    base = hf_models.build("gpt2", layers=4)
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0,
        fan_in_fan_out=True, init_lora_weights=True))
    # LoRA's B starts at zero (the adapted model equals the base); a small
    # random B makes every adapter gradient non-zero from the first step.
    torch.manual_seed(7)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.01)
    engine, _, _, _ = zshard.initialize(
        model=model, config=os.environ["ZSHARD_CONFIG"])
    before = engine.full_state_dict()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    checkpoints = []
    while engine.global_steps < args.steps:
        step = engine.global_steps
        loss = hf_models.loss_of(engine, hf_models.batch(engine.rank, step))
        engine.backward(loss)
        engine.step()
        print(f"step {engine.global_steps} loss {loss.item():.6f}",
              flush=True)
        if engine.global_steps in (1, args.steps):
            checkpoints.append(engine.save_checkpoint())
    if engine.rank == 0:
        torch.save({"before": before, "after": engine.full_state_dict(),
                    "trainable": trainable, "checkpoints": checkpoints,
                    "stats": engine.stats(), "steps": engine.global_steps,
                    "groups": engine.groups()}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
