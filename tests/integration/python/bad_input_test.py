"""Bad input from a Python trainer: each is a ZShardError whose code and
message name the cause, raised within its deadline, and the servers'
state does not change (a correct step afterwards still works, from the
same step)."""

import shutil
import socket
import sys
import time
import unittest

import torch
from torch import nn

import harness
import zshard


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    def __init__(self, d: int = 16, layers: int = 3,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.inp = nn.Linear(4, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.out = nn.Linear(d, 1)
        self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).square().mean()


def batch() -> torch.Tensor:
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(5))


class BadInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.work = harness.workdir()
        cls.config = harness.ds_config(cls.work)
        cls.one = harness.Servers(cls.config, shards=2, trainers=1)
        cls.two = harness.Servers(cls.config, shards=1, trainers=2)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.one.stop()
        cls.two.stop()
        shutil.rmtree(cls.work, ignore_errors=True)

    def engine(self, model: nn.Module, servers: "harness.Servers",
               **kw) -> zshard.ZShardEngine:
        engine, _, _, _ = zshard.initialize(
            model=model, config=self.config,
            coordinator=servers.coordinator, connect_timeout_s=20, **kw)
        return engine

    def assertCode(self, ctx, code: str, *words: str) -> None:
        e = ctx.exception
        self.assertIsInstance(e, zshard.ZShardError)
        self.assertEqual(e.code, code, str(e))
        for w in words:
            self.assertIn(w, str(e))

    def test_01_misuse_of_a_step(self) -> None:
        engine = self.engine(Net(), self.one)
        start = engine.global_steps
        with self.assertRaises(zshard.ZShardError) as ctx:
            engine.step()
        self.assertCode(ctx, "FAILED_PRECONDITION", "step() called without "
                        "backward()")
        engine.backward(engine(batch()))
        with self.assertRaises(zshard.ZShardError) as ctx:
            engine.backward(engine(batch()))
        self.assertCode(ctx, "FAILED_PRECONDITION", "backward() called twice")
        self.assertEqual(engine.global_steps, start)
        engine.step()  # the step still completes
        self.assertEqual(engine.global_steps, start + 1)

        # A parameter whose shape changed after initialize.
        engine.module.blocks[1].fc.weight = nn.Parameter(torch.zeros(3, 16))
        with self.assertRaises(zshard.ZShardError) as ctx:
            engine(batch())
        self.assertCode(ctx, "FAILED_PRECONDITION", "blocks.1.fc.weight",
                        "(3, 16)", "(16, 16)")
        self.assertEqual(engine.global_steps, start + 1)

    def test_02_different_models(self) -> None:
        first = self.engine(Net(), self.two, rank=0)
        self.assertEqual(first.rank, 0)
        other = Net()
        other.blocks[2].fc = nn.Linear(16, 16, bias=False)
        with self.assertRaises(zshard.ZShardError) as ctx:
            self.engine(other, self.two, rank=1)
        self.assertCode(ctx, "FAILED_PRECONDITION", "blocks.2")

    def test_03_unsupported_dtype(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(zshard.ZShardError) as ctx:
            self.engine(Net(dtype=torch.float64), self.one)
        self.assertCode(ctx, "INVALID_ARGUMENT", "inp.weight", "float64")
        self.assertLess(time.monotonic() - t0, 5)

    def test_04_coordinator_that_does_not_answer(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        t0 = time.monotonic()
        with self.assertRaises(zshard.ZShardError) as ctx:
            zshard.initialize(model=Net(), config=self.config,
                              coordinator=f"127.0.0.1:{port}",
                              connect_timeout_s=2)
        elapsed = time.monotonic() - t0
        self.assertCode(ctx, "UNAVAILABLE", str(port))
        print(f"unreachable coordinator: {elapsed:.2f} s for a 2 s deadline")
        self.assertLess(elapsed, 8)

    def test_05_bad_config_and_model(self) -> None:
        with self.assertRaises(zshard.ZShardError) as ctx:
            zshard.initialize(model=Net(), config={"zero_optimization": 3},
                              coordinator=self.one.coordinator)
        self.assertCode(ctx, "INVALID_ARGUMENT", "zero_optimization")
        with self.assertRaises(zshard.ZShardError) as ctx:
            zshard.initialize(model="not a model",
                              coordinator=self.one.coordinator)
        self.assertCode(ctx, "INVALID_ARGUMENT", "torch.nn.Module")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
