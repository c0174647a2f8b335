"""The ds_config keys the servers act on behave for Python trainers as for
zshard-train: ZeRO stages 1-3 give the same bits; gradient accumulation
matches the reference bit for bit; bf16 and fp16 (dynamic loss scaling,
clipping) train; a WarmupLR schedule is what get_lr() reports. Activation
recompute (Hugging Face's gradient checkpointing, reentrant or not) gives
the same bits as keeping activations."""

import json
import os
import shutil
import sys
import unittest

import torch

import harness
import parity_test

LAYERS = "4"


class ConfigTest(unittest.TestCase):
    def setUp(self) -> None:
        self.work = harness.workdir()

    def tearDown(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def train(self, name: str, steps: int, extra_args=(), **cfg) -> tuple:
        d = os.path.join(self.work, name)
        os.makedirs(d)
        config = harness.ds_config(d, **cfg)
        out, trace = os.path.join(d, "final.pt"), os.path.join(d, "trace")
        r = harness.launch(config, ["--model", "gpt2", "--layers", LAYERS,
                                    "--steps", str(steps), "--out", out,
                                    "--trace", trace] + list(extra_args))
        self.assertEqual(r.returncode, 0, name)
        with open(trace) as f:
            return torch.load(out), json.load(f)

    def test_stages_give_the_same_bits(self) -> None:
        finals = {s: self.train(f"stage{s}", 3,
                                zero_optimization={"stage": s})[0]
                  for s in (1, 2, 3)}
        for s in (1, 2):
            for k, v in finals[3].items():
                self.assertTrue(torch.equal(finals[s][k], v),
                                f"stage {s} differs from stage 3 at {k}")

    def test_activation_recompute_gives_the_same_bits(self) -> None:
        kept, _ = self.train("kept", 3)
        for mode in ("reentrant", "non_reentrant"):
            got, _ = self.train(mode, 3, ["--checkpointing", mode])
            self.assertEqual(parity_test.max_diff(got, kept), 0.0, mode)

    def test_accumulation_matches_the_reference(self) -> None:
        got, _ = self.train("accum", 3, gradient_accumulation_steps=2)
        want = parity_test.reference("gpt2", False, steps=3, accumulation=2,
                                     layers=int(LAYERS))
        self.assertEqual(parity_test.max_diff(got, want), 0.0)

    def test_bf16_trains(self) -> None:
        got, trace = self.train("bf16", 6, ["--same_batch"],
                                bf16={"enabled": True})
        self.assertEqual(trace["dtype"], "torch.bfloat16")
        self.assertTrue(all(v.dtype == torch.bfloat16 for v in got.values()))
        print("bf16 losses", [round(x, 4) for x in trace["loss"]])
        self.assertLess(trace["loss"][-1], trace["loss"][0] - 0.05)

    def test_fp16_loss_scaling_and_clipping(self) -> None:
        _, trace = self.train(
            "fp16", 6, ["--same_batch"], gradient_clipping=1.0,
            fp16={"enabled": True, "initial_scale_power": 12})
        print("fp16 losses", [round(x, 4) for x in trace["loss"]],
              "scales", trace["loss_scale"])
        self.assertEqual(trace["loss_scale"][0], 4096.0)
        self.assertLess(trace["loss"][-1], trace["loss"][0] - 0.05)

    def test_warmup_schedule(self) -> None:
        _, trace = self.train("sched", 6, scheduler={
            "type": "WarmupLR", "params": {
                "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                "warmup_num_steps": 4, "warmup_type": "linear"}})
        lrs = trace["lr"]
        print("learning rates", lrs)
        self.assertTrue(all(a < b for a, b in zip(lrs[:4], lrs[1:5])), lrs)
        self.assertAlmostEqual(lrs[-1], 1e-3, places=9)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
