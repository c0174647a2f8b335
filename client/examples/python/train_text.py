"""Train a Hugging Face GPT-2 or Llama-architecture model (built from a
small config: nothing is downloaded) on the text in
/usr/share/common-licenses, through zshard's shard servers. Bytes are the
tokens (vocabulary 256). Run it with the launcher:

    zshard launch --shards 4 --trainers 2 --config deploy/local/ds_config.json \\
        --checkpoint_dir /tmp/zshard-ckpt \\
        -- python client/examples/python/train_text.py --model llama

Rank 0 prints one line per step (loss, tokens/s, learning rate, bytes in
and out); the change from a DeepSpeed script is the zshard.initialize line.
"""

import argparse
import os
import sys
import time
from typing import List

import torch

import zshard


def read_text(paths: List[str]) -> torch.Tensor:
    data = bytearray()
    for root in paths:
        files = ([os.path.join(d, f) for d, _, fs in os.walk(root)
                  for f in sorted(fs)] if os.path.isdir(root) else [root])
        for f in sorted(files):
            with open(f, "rb") as fh:
                data += fh.read()
    if len(data) < 1024:
        raise SystemExit(f"train_text: not enough text in {paths}")
    return torch.frombuffer(data, dtype=torch.uint8).long()


def build(kind: str, layers: int, width: int, context: int) -> torch.nn.Module:
    import transformers
    common = dict(vocab_size=256, bos_token_id=0, eos_token_id=0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_positions=context, n_embd=width,
                                      n_layer=layers, n_head=4, **common)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(
        hidden_size=width, intermediate_size=4 * width,
        num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=context, **common)
    return transformers.LlamaForCausalLM(cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--data", default="/usr/share/common-licenses")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = read_text(args.data.split(","))
    model = build(args.model, args.layers, args.width, args.context)

    engine, _, _, _ = zshard.initialize(
        model=model, config=os.environ.get("ZSHARD_CONFIG"))

    micro = engine.config.micro_batch
    gen = torch.Generator().manual_seed(args.seed * 1000 + engine.rank)
    t0 = time.monotonic()
    while engine.global_steps < args.steps:
        start = time.monotonic()
        for _ in range(engine.gradient_accumulation_steps):
            at = torch.randint(0, len(text) - args.context - 1, (micro,),
                               generator=gen)
            batch = torch.stack([text[i:i + args.context] for i in at])
            loss = engine(input_ids=batch, labels=batch).loss
            engine.backward(loss)
            engine.step()
        if engine.rank == 0:
            secs = time.monotonic() - start
            tokens = micro * args.context * engine.world_size * \
                engine.gradient_accumulation_steps
            s = engine.stats()
            print(f"step {engine.global_steps:4d}  loss {loss.item():.4f}  "
                  f"{tokens / secs:8.0f} tok/s  lr {engine.get_lr()[0]:.2e}  "
                  f"fetched {s['bytes_fetched'] / 1e6:.1f} MB  pushed "
                  f"{s['bytes_pushed'] / 1e6:.1f} MB", flush=True)
    if engine.rank == 0:
        print(f"{args.steps} steps in {time.monotonic() - t0:.1f} s; "
              f"{sum(n for _, n in engine.groups())} parameters in "
              f"{len(engine.groups())} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
