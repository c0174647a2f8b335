"""Groups from a model, without servers: the repeated blocks of GPT-2 and
Llama found automatically with the rest in a root group, the same groups
from wrap_classes given by name or by type, tied parameters once, and a
wrap class that matches nothing refused naming it."""

import sys
import unittest

import hf_models
import zshard


class GroupingTest(unittest.TestCase):
    def test_gpt2_blocks_and_tied_head(self) -> None:
        model = hf_models.build("gpt2", layers=3)
        groups = zshard.make_groups(model)
        self.assertEqual([g.name for g in groups],
                         ["root", "transformer.h.0", "transformer.h.1",
                          "transformer.h.2"])
        names = [n for g in groups for n, _ in g.params]
        self.assertEqual(len(names), len(set(names)))
        self.assertIn("transformer.wte.weight", names)
        self.assertNotIn("lm_head.weight", names)  # tied to wte
        self.assertEqual(sum(p.numel() for g in groups for _, p in g.params),
                         sum(p.numel() for p in model.parameters()))

    def test_llama_by_name_and_by_type(self) -> None:
        model = hf_models.build("llama", layers=2)
        auto = [g.name for g in zshard.make_groups(model)]
        self.assertEqual(auto, ["root", "model.layers.0", "model.layers.1"])
        cls = type(model.model.layers[0])
        for wrap in ([cls.__name__], [cls]):
            got = [g.name for g in zshard.make_groups(model, wrap)]
            self.assertEqual(got, auto, wrap)

    def test_unknown_wrap_class(self) -> None:
        model = hf_models.build("gpt2", layers=2)
        with self.assertRaises(zshard.ZShardError) as ctx:
            zshard.make_groups(model, ["NoSuchBlock"])
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")
        self.assertIn("NoSuchBlock", str(ctx.exception))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
