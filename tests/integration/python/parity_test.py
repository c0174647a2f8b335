"""Parity: a Hugging Face GPT-2 and a Llama-architecture model trained 10
steps by 2 Python trainers against 4 real shard servers end with the
parameters a single-process reference gets by summing the same per-rank
gradients and applying the servers' AdamW; a second run gives identical
bits; torch.optim.AdamW as the reference agrees within 1e-5."""

import os
import shutil
import sys
import unittest

import torch

import harness
import hf_models
from zshard import linear as zlinear

STEPS = 10
TRAINERS = 2


def reference(kind: str, torch_adamw: bool, steps: int = STEPS,
              accumulation: int = 1, layers: int = 6) -> dict:
    """Trains the same model in this process: per step, each rank's
    gradient on each of its micro-batches (the same linear the engine
    installs), summed in the servers' order (micro-step, then rank),
    averaged, then AdamW."""
    torch.set_num_threads(1)
    model = hf_models.build(kind, layers)
    named = dict(model.named_parameters())
    params = {k: v.detach().clone() for k, v in named.items()}
    if torch_adamw:
        leaves = {k: torch.nn.Parameter(v) for k, v in params.items()}
        opt = torch.optim.AdamW(list(leaves.values()), lr=1e-3,
                                betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    else:
        adamw = hf_models.KernelAdamW(params, 1e-3, (0.9, 0.999), 1e-8, 0.01)
    for step in range(steps):
        current = ({k: v.detach() for k, v in leaves.items()} if torch_adamw
                   else adamw.p)
        total = None
        for micro in range(accumulation):
            for rank in range(TRAINERS):
                for k, p in named.items():
                    p.data = current[k].clone()
                    p.grad = None
                with zlinear.installed():
                    loss = hf_models.loss_of(
                        model, hf_models.batch(rank, step, micro))
                loss.backward()
                grads = {k: p.grad for k, p in named.items()}
                total = grads if total is None else {
                    k: total[k] + grads[k] for k in grads}
        scale = torch.tensor(1.0 / (TRAINERS * accumulation),
                             dtype=torch.float32)
        mean = {k: g * scale for k, g in total.items()}
        if torch_adamw:
            for k, p in leaves.items():
                p.grad = mean[k]
            opt.step()
        else:
            adamw.step(mean)
    if torch_adamw:
        return {k: v.detach() for k, v in leaves.items()}
    return adamw.p


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a)[:5], sorted(b)[:5])
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def largest(a: dict) -> float:
    return max(float(v.abs().max()) for v in a.values())


class ParityTest(unittest.TestCase):
    def run_cluster(self, kind: str, work: str, name: str) -> dict:
        cfg = harness.ds_config(work)
        out = os.path.join(work, name)
        r = harness.launch(cfg, ["--model", kind, "--steps", str(STEPS),
                                 "--out", out])
        self.assertEqual(r.returncode, 0, "the launch failed (output above)")
        return torch.load(out)

    def check(self, kind: str) -> None:
        work = harness.workdir()
        try:
            first = self.run_cluster(kind, work, "first.pt")
            second = self.run_cluster(kind, work, "second.pt")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for k in first:
            self.assertTrue(torch.equal(first[k], second[k]),
                            f"{kind}: {k} differs between two runs")
        ref = reference(kind, torch_adamw=False)
        diff, big = max_diff(first, ref), largest(ref)
        print(f"{kind}: max |zshard - reference| = {diff:.3e}, largest "
              f"parameter {big:.4f}, ratio {diff / big:.3e}")
        self.assertLessEqual(diff, 1e-6 * big)
        torch_ref = reference(kind, torch_adamw=True)
        tdiff = max_diff(first, torch_ref)
        print(f"{kind}: max |zshard - torch.optim.AdamW| = {tdiff:.3e}, "
              f"ratio {tdiff / big:.3e}")
        self.assertLessEqual(tdiff, 1e-5 * big)

    def test_gpt2(self) -> None:
        self.check("gpt2")

    def test_llama(self) -> None:
        self.check("llama")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:], verbosity=2)
