"""Frozen parameters (requires_grad=False) at ZeRO stages 0 and 3: they
keep their bytes through training (no update, no weight decay), the
trainable ones change, and only trainable gradients are pushed."""

import shutil
import sys
import unittest

import torch

import harness
import zshard
from bad_input_test import Net, batch


class FrozenTest(unittest.TestCase):
    def check(self, stage: int) -> None:
        work = harness.workdir()
        servers = None
        try:
            config = harness.ds_config(work, zero_optimization={"stage": stage})
            servers = harness.Servers(config, shards=2, trainers=1)
            model = Net()
            for p in model.blocks[0].parameters():
                p.requires_grad = False
            model.inp.bias.requires_grad = False
            frozen = {n for n, p in model.named_parameters()
                      if not p.requires_grad}
            trainable = sum(p.numel() for p in model.parameters()
                            if p.requires_grad)
            engine, _, _, _ = zshard.initialize(
                model=model, config=config, coordinator=servers.coordinator)
            before = engine.full_state_dict()
            for _ in range(3):
                engine.backward(engine(batch()))
                engine.step()
            after = engine.full_state_dict()
            pushed = engine.stats()["bytes_pushed"]
        finally:
            if servers:
                servers.stop()
            shutil.rmtree(work, ignore_errors=True)
        for name in before:
            same = torch.equal(before[name], after[name])
            self.assertEqual(same, name in frozen, f"stage {stage}: {name}")
        self.assertEqual(pushed, 3 * trainable * 4)

    def test_stage3(self) -> None:
        self.check(3)

    def test_stage0(self) -> None:
        self.check(0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
