"""zshard launch: every rank gets its rank, world size and coordinator and
its output prefixed; a failing rank stops everything and its status is the
launcher's; Ctrl-C (SIGINT) stops everything too. "Stopped" is checked by
the coordinator's port no longer answering."""

import os
import signal
import socket
import subprocess
import sys
import time
import unittest

import harness

# A trainer: prints what it was given, then behaves as argv[1] says.
TRAINER = r"""
import os, signal, sys, time
print("env", os.environ["ZSHARD_RANK"], os.environ["RANK"],
      os.environ["WORLD_SIZE"], os.environ["ZSHARD_COORDINATOR"], flush=True)
mode = sys.argv[1]
# In "fail" mode rank 1 fails only once rank 0's line is out (rank 0 opens
# the FIFO the test made after printing; rank 1's open returns then), so the
# launcher never stops rank 0 before it has printed. SIGALRM bounds the wait.
started = os.path.join(os.path.dirname(os.path.abspath(__file__)), "started")
if mode == "fail" and os.environ["RANK"] == "0":
    with open(started, "w") as fifo:
        fifo.write("0")
if mode == "fail" and os.environ["RANK"] == "1":
    signal.alarm(30)
    with open(started) as fifo:
        fifo.read()
    sys.exit(3)
if mode == "fail":
    time.sleep(60)  # stopped by the launcher when rank 1 fails
if mode == "wait":
    print("ready", flush=True)
    time.sleep(60)
"""


def port_open(hostport: str) -> bool:
    host, port = hostport.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


class LaunchTest(unittest.TestCase):
    def start(self, mode: str) -> subprocess.Popen:
        work = harness.workdir()
        self.script = os.path.join(work, "trainer.py")
        with open(self.script, "w") as f:
            f.write(TRAINER)
        if mode == "fail":
            os.mkfifo(os.path.join(work, "started"))
        cfg = harness.ds_config(work)
        return subprocess.Popen(
            [sys.executable, "-m", "zshard", "launch", "--shards=2",
             "--trainers=2", f"--config={cfg}",
             f"--server_bin={os.environ['ZSHARD_SERVER_BIN']}", "--",
             sys.executable, self.script, mode],
            env=harness.env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)

    def test_failing_rank_stops_everything(self) -> None:
        t0 = time.monotonic()
        p = self.start("fail")
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 3, out)
        self.assertLess(time.monotonic() - t0, 40, "rank 0 was not stopped")
        lines = [l for l in out.splitlines() if " env " in f" {l}"]
        self.assertEqual(len(lines), 2, out)
        coordinator = None
        for rank in ("0", "1"):
            line = next(l for l in lines if l.startswith(f"[rank {rank}] env"))
            zrank, r, world, coordinator = line.split()[3:7]
            self.assertEqual((zrank, r, world), (rank, rank, "2"))
        self.assertIn("rank 1 exited with status 3", out)
        self.assertFalse(port_open(coordinator), "a server is still up")

    def test_ctrl_c_stops_everything(self) -> None:
        p = self.start("wait")
        ready = 0
        coordinator = None
        deadline = time.monotonic() + 60
        while ready < 2 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            if "] env " in line:
                coordinator = line.split()[-1]
            ready += "ready" in line
        self.assertEqual(ready, 2)
        self.assertTrue(port_open(coordinator))
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130)
        self.assertLess(time.monotonic() - t0, 15)
        self.assertFalse(port_open(coordinator), "a server is still up")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
