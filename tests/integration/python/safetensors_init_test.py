"""A Hugging Face model's weights go from a safetensors file into the
servers without any trainer holding them all: the trainers build the model
with no parameter storage, rank 0 reads the file one tensor at a time, and
every rank then trains on exactly the file's values."""

import math
import os
import shutil
import sys
import unittest

import torch

import harness
import hf_models


class SafetensorsInitTest(unittest.TestCase):
    def test_values_come_from_the_file(self) -> None:
        from safetensors.torch import load_file
        work = harness.workdir()
        try:
            model = hf_models.build("llama", layers=4, seed=5)
            model.save_pretrained(os.path.join(work, "hf"))
            path = os.path.join(work, "hf", "model.safetensors")
            want = load_file(path)
            cfg = harness.ds_config(work)
            r = harness.launch(cfg, ["--file", path, "--out", work],
                               shards=2, script="train_from_file.py")
            self.assertEqual(r.returncode, 0)
            ranks = [torch.load(os.path.join(work, f"rank{i}.pt"))
                     for i in range(2)]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        total = sum(v.numel() * 4 for v in want.values())
        for d in ranks:
            self.assertTrue(d["meta"], "the model was built with storage")
            got = d["registered"]
            for name, value in got.items():
                self.assertIn(name, want)
                self.assertTrue(torch.equal(value, want[name]), name)
            self.assertTrue(all(math.isfinite(x) for x in d["losses"]))
            largest = max(n for _, n in d["groups"]) * 4
            root = dict(d["groups"]).get("root", 0) * 4
            print(f"model {total} B; a trainer bound at most "
                  f"{d['peak_bound']} B (root {root} + largest group "
                  f"{largest})")
            self.assertLessEqual(d["peak_bound"], root + largest)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
