"""A small model trained through zshard on batches that are a function of
the step and the rank, so a run that rolls back and redoes steps gives the
bits of one that never failed. Catches zshard.RolledBack and redoes the
steps from there.

    train_steps.py STEPS OUT [--die_at N --marker PATH]

prints "rank R step S loss L" every 10 steps and "rank R rolled back to
step S" on each rollback; rank 0 writes every parameter (fp32, in the
model's order) to OUT. With --die_at, rank 1 exits 3 at that step the
first time (PATH marks that it did), for a launcher to restart it.
"""

import argparse
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

import zshard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) + x


class Model(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batch(step: int, rank: int) -> tuple:
    g = torch.Generator().manual_seed(1000003 * step + rank)
    x = torch.randn(8, 32, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("out")
    p.add_argument("--die_at", type=int, default=-1)
    p.add_argument("--marker", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    engine, _, _, _ = zshard.initialize(model=Model(),
                                        config=os.environ["ZSHARD_CONFIG"])
    rank = engine.rank
    step = engine.global_steps
    print(f"rank {rank} starts at step {step}", flush=True)
    while step < a.steps:
        if (a.die_at >= 0 and rank == 1 and step == a.die_at and
                not os.path.exists(a.marker)):
            open(a.marker, "w").close()
            print(f"rank {rank} dies at step {step}", flush=True)
            os._exit(3)
        x, y = batch(step, rank)
        try:
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        except zshard.RolledBack as e:
            print(f"rank {rank} rolled back to step {e.step}", flush=True)
            step = e.step
            continue
        step += 1
        if step % 10 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.5f}",
                  flush=True)
    if rank == 0:
        state = engine.full_state_dict()
        with open(a.out, "wb") as f:
            for t in state.values():
                f.write(t.detach().to(torch.float32).contiguous().numpy()
                        .tobytes())
    print(f"rank {rank} done at step {engine.global_steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
