"""Recovery from the Python side (issue 16), with real processes under
``zshard launch --max_restarts``:
- shard 1, then shard 0 (the coordinator), killed with SIGKILL mid-run:
  the launcher replaces each with ``zshard-server --replace``, the engines
  raise ``zshard.RolledBack``, the script redoes the steps from there, and
  the final parameters equal an undisturbed run's bit for bit;
- a rank that exits is run again: it takes its rank back once the dead
  process is dropped, resumes at the cluster's step, and the run ends."""

import os
import signal
import subprocess
import threading
import time
import unittest
from typing import List, Optional

import harness

STEPS = 150
TIMEOUT = ["--server_arg=--trainer_timeout_s=2"]


def children_of(pid: int) -> List[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def shard_pid(launcher: int, shard: int) -> Optional[int]:
    """The launcher's live zshard-server process serving `shard`."""
    for pid in children_of(launcher):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if (argv and argv[0].endswith(b"zshard-server") and
                f"--shard_id={shard}".encode() in argv):
            return pid
    return None


class Run:
    """One `zshard launch` of train_steps.py; its output is collected."""

    def __init__(self, work: str, tag: str, launch_args: List[str],
                 script_args: List[str], shards: int = 3) -> None:
        config = harness.ds_config(
            work, zshard_fault_tolerance={"snapshot_interval_steps": 1})
        self.out = os.path.join(work, f"params-{tag}.bin")
        cmd = [harness.PYTHON, "-m", "zshard", "launch", f"--shards={shards}",
               "--trainers=2", f"--config={config}",
               f"--server_bin={os.environ['ZSHARD_SERVER_BIN']}"]
        cmd += launch_args + ["--", harness.PYTHON,
                              os.path.join(harness.HERE, "train_steps.py"),
                              str(STEPS), self.out] + script_args
        self.proc = subprocess.Popen(cmd, env=harness.env(),
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.started = time.monotonic()
        self.lines: List[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            # Seconds since the launch: a failure's log shows the gaps.
            at = time.monotonic() - self.started
            with self.cond:
                self.lines.append(f"{at:7.2f} {line.rstrip()}")
                self.cond.notify_all()

    def wait_for(self, text: str, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(text in l for l in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return any(text in l for l in self.lines)
                self.cond.wait(min(left, 0.5))
            return True

    def finish(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1

    def first_at(self, text: str) -> Optional[float]:
        """Seconds since the launch of the first line holding `text`."""
        with self.cond:
            for line in self.lines:
                if text in line:
                    return float(line.split(maxsplit=1)[0])
        return None

    def text(self) -> str:
        with self.cond:
            return "\n".join(self.lines)

    def params(self) -> bytes:
        with open(self.out, "rb") as f:
            return f.read()


class RecoveryTest(unittest.TestCase):
    def test_killed_shards_are_replaced_and_the_bits_stay(self) -> None:
        work = harness.workdir()
        ref = Run(work, "ref", TIMEOUT, [])
        self.assertEqual(ref.finish(), 0, ref.text())
        run = Run(work, "killed", TIMEOUT + ["--max_restarts=2"], [])
        for shard, at in ((1, 40), (0, 90)):
            self.assertTrue(run.wait_for(f"rank 0 step {at} "), run.text())
            pid = shard_pid(run.proc.pid, shard)
            self.assertIsNotNone(pid, run.text())
            os.kill(pid, signal.SIGKILL)
            self.assertTrue(run.wait_for(f"shard {shard} exited"), run.text())
        self.assertEqual(run.finish(), 0, run.text())
        out = run.text()
        self.assertIn("restarting it (restart 2 of 2)", out)
        # Blocked on the dead shard 1, each rank learns of the rollback
        # from its next heartbeat, not at its calls' 30 s deadline.
        replaced = run.first_at("shard 1 replaced by")
        self.assertIsNotNone(replaced, out)
        for rank in (0, 1):
            back = run.first_at(f"rank {rank} rolled back to step")
            self.assertIsNotNone(back, out)
            self.assertLess(back - replaced, 15.0, out)
        self.assertTrue(run.params() == ref.params(),
                        "the parameters differ from the undisturbed run's:\n" +
                        run.text())

    def test_a_rank_that_exits_is_run_again(self) -> None:
        work = harness.workdir()
        marker = os.path.join(work, "died")
        run = Run(work, "rank", TIMEOUT + ["--max_restarts=1"],
                  ["--die_at=30", f"--marker={marker}"], shards=2)
        self.assertEqual(run.finish(), 0, run.text())
        out = run.text()
        self.assertIn("rank 1 dies at step 30", out)
        self.assertIn("rank 1 exited with status 3; restarting it", out)
        # The restarted process resumes where the cluster is, past step 0.
        restarted = [l for l in out.splitlines()
                     if "rank 1 starts at step" in l]
        self.assertEqual(len(restarted), 2, out)
        self.assertNotEqual(restarted[1].split()[-1], "0", out)
        self.assertIn(f"rank 0 done at step {STEPS}", out)
        self.assertIn(f"rank 1 done at step {STEPS}", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
