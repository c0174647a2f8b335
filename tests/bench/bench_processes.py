"""What the benchmark scripts share: the processes a run starts, the port
a zshard-server writes to its --port_file, and a cluster of shards with
shard 0's telemetry port."""
import os
import signal
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


def cleanup_on_sigterm() -> None:
    """Makes SIGTERM and SIGHUP end the script as an exception would, so that
    its finally blocks stop the processes it started and remove what it made
    (network namespaces, work folders) when it is killed from outside."""
    def end(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGHUP, end)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_totals(pid: int) -> dict:
    """A live process's threads by name (the kernel's comm): {name: [CPU
    seconds (schedstat's run time), voluntary context switches (it
    blocked), involuntary ones (it was preempted), threads]}, as
    zshard-train's --stats_json thread_totals; threads that ended are not
    counted. Empty for a process that is gone."""
    totals: dict = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return totals
    for tid in tids:
        d = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{d}/comm") as f:
                name = f.read().rstrip("\n")
            with open(f"{d}/schedstat") as f:
                cpu = int(f.read().split()[0]) * 1e-9
            with open(f"{d}/status") as f:
                status = dict(line.split(":", 1) for line in f
                              if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        t = totals.setdefault(name, [0.0, 0, 0, 0])
        t[0] += cpu
        t[1] += int(status.get("voluntary_ctxt_switches", 0))
        t[2] += int(status.get("nonvoluntary_ctxt_switches", 0))
        t[3] += 1
    return totals


def totals_since(after: dict, before: dict) -> dict:
    """thread_totals `after` less `before`, name by name (never below 0)."""
    out = {}
    for name, a in after.items():
        b = before.get(name, [0.0, 0, 0, 0])
        out[name] = [max(0, a[0] - b[0]), max(0, a[1] - b[1]),
                     max(0, a[2] - b[2]), a[3]]
    return out


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


def start_shards(procs: Processes, server: str, work: str, shards: int,
                 flags: list, metrics_ports: list = None) -> tuple:
    """Starts `shards` zshard-server processes on 127.0.0.1 with `flags`
    (shard 0 also serves /metrics; every shard does when `metrics_ports` is
    given, which gets each one's port); returns (coordinator host:port,
    shard 0's metrics port)."""
    coordinator, metrics_port = "", 0
    for s in range(shards):
        port_file = os.path.join(work, f"port{s}")
        metrics_file = os.path.join(work, f"metrics_port{s}")
        serves_metrics = s == 0 or metrics_ports is not None
        argv = [server, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                f"--shard_id={s}", f"--num_shards={shards}"] + flags
        if serves_metrics:
            argv += ["--metrics_listen=127.0.0.1:0",
                     f"--metrics_port_file={metrics_file}"]
        if s > 0:
            argv.append(f"--coordinator={coordinator}")
        p = procs.start(argv, os.path.join(work, f"server{s}.log"))
        port = wait_port(port_file, p, 30)
        if s == 0:
            coordinator = f"127.0.0.1:{port}"
        if serves_metrics:
            mport = wait_port(metrics_file, p, 30)
            if s == 0:
                metrics_port = mport
            if metrics_ports is not None:
                metrics_ports.append(mport)
    return coordinator, metrics_port
