"""LoRA over a frozen base (peft from PyPI): only the adapters change on
the servers, the frozen parameters keep their bytes, only the adapters'
gradients are pushed, and the differential checkpoint after training is a
small fraction of the full one."""

import os
import shutil
import sys
import unittest

import torch

import harness


class LoraTest(unittest.TestCase):
    def test_only_adapters_train(self) -> None:
        try:
            import peft  # noqa: F401
        except ImportError as e:
            self.skipTest(f"peft is not installed: {e}")
        work = harness.workdir()
        try:
            cfg = harness.ds_config(work)
            out = os.path.join(work, "lora.pt")
            r = harness.launch(
                cfg, ["--steps", "6", "--out", out], script="train_lora.py",
                launch_args=[f"--checkpoint_dir={work}/ckpt"])
            self.assertEqual(r.returncode, 0)
            d = torch.load(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        before, after, trainable = d["before"], d["after"], set(d["trainable"])
        self.assertTrue(trainable)
        self.assertTrue(all("lora_" in n for n in trainable), trainable)
        changed = {n for n in before if not torch.equal(before[n], after[n])}
        self.assertEqual(changed, trainable)
        frozen = [n for n in before if n not in trainable]
        self.assertGreater(len(frozen), len(trainable))
        base, delta = d["checkpoints"]
        self.assertTrue(base["base"])
        self.assertFalse(delta["base"])
        ratio = delta["bytes_written"] / base["bytes_written"]
        adapter = sum(before[n].numel() for n in trainable)
        total = sum(v.numel() for v in before.values())
        print(f"LoRA: {adapter} of {total} parameters train "
              f"({adapter / total:.4f}); full checkpoint "
              f"{base['bytes_written']} B at step {base['step']}, delta "
              f"{delta['bytes_written']} B at step {delta['step']}: ratio "
              f"{ratio:.4f}")
        self.assertLess(ratio, 0.25)
        # Only the adapters' gradients travel: one fp32 copy of each per step.
        pushed = d["stats"]["bytes_pushed"]
        print(f"LoRA: pushed {pushed} B in {d['steps']} steps (adapters "
              f"{adapter * 4} B per step)")
        self.assertEqual(pushed, d["steps"] * adapter * 4)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
