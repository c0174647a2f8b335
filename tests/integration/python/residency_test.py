"""Residency: during a step, the parameters that hold storage on a trainer
are at most the live groups (the root group, held through the step, and
the block computing), asserted from the tensors' storages at every block's
forward and backward; the client's own buffers stay within the prefetch
window + the live groups + the persistent ones; between steps nothing is
bound. A GPT-2 of 8 blocks (9 groups), 2 trainers, 4 shards."""

import json
import os
import shutil
import sys
import unittest

import harness

WINDOW_ELEMENTS = 100000  # stage3_prefetch_bucket_size: 2 blocks


class ResidencyTest(unittest.TestCase):
    def test_live_groups_only(self) -> None:
        work = harness.workdir()
        try:
            cfg = harness.ds_config(work, zero_optimization={
                "stage": 3, "stage3_prefetch_bucket_size": WINDOW_ELEMENTS,
                "stage3_param_persistence_threshold": 1000})
            prefix = os.path.join(work, "residency")
            r = harness.launch(cfg, ["--model", "gpt2", "--layers", "8",
                                     "--steps", "4", "--residency", prefix])
            self.assertEqual(r.returncode, 0)
            for rank in range(2):
                with open(f"{prefix}.{rank}") as f:
                    d = json.load(f)
                self.check(rank, d)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def check(self, rank: int, d: dict) -> None:
        elem = d["element_size"]
        sizes = dict((name, n * elem) for name, n in d["groups"])
        self.assertGreaterEqual(len(sizes), 6)
        root = sizes.pop("root")
        block = max(sizes.values())
        total = root + sum(sizes.values())
        window = WINDOW_ELEMENTS * 4
        samples = d["samples"]
        self.assertGreaterEqual(len(samples), 8 * 3 * 4)
        print(f"rank {rank}: model {total} B in {len(sizes) + 1} groups; "
              f"bound at most {max(samples)} B (root {root} + block "
              f"{block}); client buffers peak "
              f"{d['stats']['peak_param_bytes']} B (window {window}); "
              f"prefetch hits {d['stats']['prefetch_hits']} of "
              f"{d['stats']['group_fetches']} fetches")
        self.assertLessEqual(max(samples), root + block)
        self.assertEqual(d["between"], [0] * len(d["between"]))
        self.assertLessEqual(d["stats"]["peak_param_bytes"],
                             window + root + block)
        self.assertLess(d["stats"]["peak_param_bytes"], total / 2)
        # The window holds the next blocks: most acquisitions find them
        # fetched or in flight (the first step has no plan yet).
        self.assertGreaterEqual(3 * d["stats"]["prefetch_hits"],
                                d["stats"]["group_fetches"])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
