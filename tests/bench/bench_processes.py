"""What the benchmark scripts share: the processes a run starts, and the
port a zshard-server writes to its --port_file."""
import os
import subprocess
import time


class Processes:
    """Every process a run starts; stop() kills what is still running."""

    def __init__(self) -> None:
        self.procs: list = []

    def start(self, argv: list, log: str) -> subprocess.Popen:
        with open(log, "w") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(timeout=30)
        self.procs = []


def wait_port(path: str, proc: subprocess.Popen, deadline_s: float) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return int(f.read().strip())
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"no port in {path} within {deadline_s} s")
