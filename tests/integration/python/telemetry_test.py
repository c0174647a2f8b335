"""The servers' HTTP telemetry port during a real run (2 shard servers with
--metrics_listen, 2 zshard-train trainers): /metrics parses with the
Prometheus text-format parser from PyPI (prometheus_client), its counters
move as the run proceeds, and shard 0's status page, loaded in headless
Chromium (Debian's chromium) while the trainers train, renders the trainer
count, the current step and a plotted loss series; its screenshot is saved in
the build folder (status_page.png). Skips, naming why, without
prometheus_client or chromium."""

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request
from typing import Dict, List, Optional

import harness

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover - the skip says so
    text_string_to_metric_families = None

BUILD = os.environ.get("ZSHARD_BUILD_DIR", "")
TRAIN_BIN = os.path.join(BUILD, "client", "zshard-train")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def wait_for_file(path: str, proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path) and read(path):
            return read(path)
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited {proc.returncode}")
        time.sleep(0.05)
    raise AssertionError(f"{path} not written within {timeout_s} s")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def samples(text: str) -> Dict[str, float]:
    """name{sorted labels} -> value, parsed by prometheus_client."""
    out: Dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k != "shard")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


class Dom(html.parser.HTMLParser):
    """The rendered DOM's elements by id: text and attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: Dict[str, Dict[str, Optional[str]]] = {}
        self.text: Dict[str, str] = {}
        self._open: List[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        ident = a.get("id")
        if ident:
            self.attrs[ident] = a
            self.text.setdefault(ident, "")
        self._open.append(ident or "")

    def handle_endtag(self, tag) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data) -> None:
        for ident in self._open:
            if ident:
                self.text[ident] += data


@unittest.skipIf(text_string_to_metric_families is None,
                 "prometheus_client is not installed (tests/requirements.txt)")
class TelemetryTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = harness.workdir()
        self.procs: List[subprocess.Popen] = []
        self.config = harness.ds_config(self.dir)

    def tearDown(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, argv: List[str], name: str) -> subprocess.Popen:
        with open(os.path.join(self.dir, name + ".log"), "w") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def server(self, shard: int, coordinator: str = "") -> str:
        d = self.dir
        argv = [os.environ["ZSHARD_SERVER_BIN"], "--listen=127.0.0.1:0",
                f"--port_file={d}/port{shard}", f"--shard_id={shard}",
                "--num_shards=2", "--trainers=2", f"--config={self.config}",
                "--metrics_listen=127.0.0.1:0",
                f"--metrics_port_file={d}/metrics{shard}"]
        if coordinator:
            argv.append(f"--coordinator={coordinator}")
        p = self.start(argv, f"server{shard}")
        port = wait_for_file(f"{d}/port{shard}", p, 30)
        wait_for_file(f"{d}/metrics{shard}", p, 30)
        return f"127.0.0.1:{port}"

    def chromium(self, url: str, *args: str) -> str:
        r = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run",
             f"--user-data-dir={self.dir}/chromium",
             "--virtual-time-budget=6000", *args, url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return r.stdout

    def test_metrics_move_and_status_page_renders_during_a_run(self) -> None:
        coordinator = self.server(0)
        self.server(1, coordinator)
        m0 = read(f"{self.dir}/metrics0")
        m1 = read(f"{self.dir}/metrics1")
        before = samples(get(f"http://127.0.0.1:{m0}/metrics"))
        self.assertEqual(before["zshard_registered{}"], 0)
        self.assertEqual(before["zshard_trainers{}"], 0)
        trainers = [self.start(
            [TRAIN_BIN, f"--coordinator={coordinator}", f"--rank={r}",
             f"--config={self.config}", "--steps=2000", "--d_model=64",
             "--layers=2", "--context=32", "--threads=1", "--log_every=0"],
            f"trainer{r}") for r in range(2)]

        # During the run: the steps counter and the step reports move.
        deadline = time.monotonic() + 120
        during = before
        while time.monotonic() < deadline:
            during = samples(get(f"http://127.0.0.1:{m0}/metrics"))
            if during.get("zshard_reported_step{}", 0) >= 5:
                break
            self.assertIsNone(trainers[0].poll(), "trainer ended early")
            time.sleep(0.2)
        self.assertGreaterEqual(during["zshard_reported_step{}"], 5)
        self.assertEqual(during["zshard_trainers{}"], 2)

        # The status page while the trainers train.
        url = f"http://127.0.0.1:{m0}/"
        dom = Dom()
        dom.feed(self.chromium(url, "--dump-dom"))
        running = all(t.poll() is None for t in trainers)
        shot = os.path.join(BUILD or self.dir, "status_page.png")
        self.chromium(url, f"--screenshot={shot}", "--window-size=1200,1000")
        print(f"status page screenshot: {shot} (taken while training: "
              f"{running})")
        self.assertTrue(running, "the trainers finished before the page was "
                        "loaded; train for longer")
        self.assertEqual(dom.text.get("trainer-count"), "2", dom.text)
        self.assertEqual(dom.text.get("shard-count"), "2", dom.text)
        self.assertGreaterEqual(int(dom.text["current-step"]), 1)
        series = dom.attrs["loss-series"]
        self.assertGreaterEqual(int(series.get("data-count") or 0), 2, series)
        self.assertGreaterEqual(len((series.get("points") or "").split()), 2)
        self.assertEqual(dom.text.get("error"), "")
        self.assertTrue(os.path.getsize(shot) > 10000)

        for t in trainers:
            self.assertEqual(t.wait(timeout=300), 0)
        after = samples(get(f"http://127.0.0.1:{m0}/metrics"))
        shard1 = samples(get(f"http://127.0.0.1:{m1}/metrics"))
        for name in ["zshard_steps_total{}", "zshard_fetched_bytes_total{}",
                     "zshard_pushed_bytes_total{}",
                     "zshard_step_reports_total{}",
                     "zshard_optimizer_updates_total{}",
                     "zshard_trainer_pushed_bytes_total{rank=1}",
                     "zshard_step_seconds_count{}"]:
            self.assertGreater(after[name], during.get(name, 0), name)
        self.assertEqual(after["zshard_steps_total{}"], 2000)
        self.assertEqual(shard1["zshard_steps_total{}"], 2000)
        # Every report was accepted, or dropped by the trainer and counted
        # (shard 0 8 reports behind on a busy machine).
        accepted = dropped = 0
        for r in range(2):
            with open(os.path.join(self.dir, f"trainer{r}.log")) as f:
                m = re.search(r"step reports: (\d+) accepted, (\d+) refused "
                              r"or timed out, (\d+) dropped", f.read())
            self.assertIsNotNone(m, f"trainer {r} printed no report counts")
            accepted += int(m.group(1))
            dropped += int(m.group(3))
            self.assertEqual(int(m.group(2)), 0)
        self.assertEqual(after["zshard_step_reports_total{}"], accepted)
        self.assertEqual(accepted + dropped, 4000)
        self.assertLessEqual(dropped, 40)
        self.assertGreater(after["process_resident_memory_bytes{}"], 0)
        history = json.loads(get(f"http://127.0.0.1:{m0}/status.json"))[
            "history"]
        self.assertEqual(history[-1][0], 2000)
        self.assertLess(history[-1][2], history[0][2])  # the loss fell
        self.assertAlmostEqual(after["zshard_loss{}"], history[-1][2], places=6)
        # The busiest trainer's calls to the shards in the newest step.
        self.assertGreater(after["zshard_reported_step_rpcs{}"], 0)
        self.assertEqual(after["zshard_reported_step_rpcs{}"], history[-1][6])
        # Shards other than 0 serve /metrics only.
        with self.assertRaises(urllib.error.HTTPError):
            get(f"http://127.0.0.1:{m1}/status.json")
        print("\n".join(get(f"http://127.0.0.1:{m0}/metrics")
                        .splitlines()[:30]))


if __name__ == "__main__":
    if not CHROMIUM:
        print("SKIP: chromium is not installed (deploy/install-deps.sh)",
              file=sys.stderr)
        sys.exit(77)
    unittest.main()
