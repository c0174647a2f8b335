#!/usr/bin/env python3
"""deploy/k8s without a Kubernetes cluster (none can run here).

1. Every manifest validates against the Kubernetes API schemas
   (kubernetes-validate from PyPI, offline, strict: unknown fields fail),
   and the kustomization lists every manifest in the folder.
2. The pods run as real processes with the manifests' own command lines:
   each shard pod of the StatefulSet and each index of the trainers' Job
   gets the environment a pod would (POD_NAME, POD_IP, JOB_COMPLETION_INDEX,
   HOSTNAME), its hostname in a UTS namespace of its own, and the args with
   Kubernetes' $(VAR) expansion. All pods share one network namespace made
   for the test (pod IPs 10.244.0.x on its loopback) and a mount namespace
   whose /etc/hosts gives the headless Service's names (zshard-K.zshard),
   so the fixed ports and names of the manifests are used as written. Only
   these are mapped: the image's binaries to this build's, volume mount
   paths to temporary folders, and the trainers' --steps (shortened, with
   --threads=1 added for this 2-core machine).
   The readiness probe is zshardctl health against the probe's port.
3. A pod restarted alone rejoins the running cluster: mid-run, shard pod 1
   and then shard pod 0 (the coordinator) are killed (SIGKILL) and run
   again with the same command line, hostname and IP, as the StatefulSet
   would; with --replace=auto each replaces its shard from the buddy's
   snapshot, the trainers roll back with it and both finish.
4. A shard pod whose hostname has no ordinal exits with one line naming it.
Needs root (namespaces); skips (77) otherwise or without the validator.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import kubernetes_validate
    import yaml
except ImportError as e:
    print(f"SKIP: {e} (tests/requirements.txt lists kubernetes-validate)",
          file=sys.stderr)
    sys.exit(77)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
K8S = os.path.join(ROOT, "deploy/k8s")
BUILD = os.environ["ZSHARD_BUILD_DIR"]
BINARIES = {
    "zshard-server": os.path.join(BUILD, "server/zshard-server"),
    "zshard-train": os.path.join(BUILD, "client/zshard-train"),
    "zshardctl": os.path.join(BUILD, "client/zshardctl"),
}
K8S_VERSION = "1.30.0"
TRAIN_STEPS = 80
# Shard pod K is killed and restarted when rank 0 has reported step S.
RESTARTS = ((1, 20), (0, 40))


def load_manifests():
    docs = {}
    for name in sorted(os.listdir(K8S)):
        if name.endswith(".yaml") and name != "kustomization.yaml":
            with open(os.path.join(K8S, name)) as f:
                docs[name] = [d for d in yaml.safe_load_all(f) if d]
    return docs


def validate(docs):
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    listed = set(kustomization["resources"])
    assert listed == set(docs), (
        f"kustomization lists {sorted(listed)}, the folder has {sorted(docs)}")
    print(f"{'file':24} {'kind':24} {'name':16} schema {K8S_VERSION} strict")
    for name, objs in docs.items():
        for obj in objs:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            print(f"{name:24} {obj['apiVersion'] + '/' + obj['kind']:24} "
                  f"{obj['metadata']['name']:16} valid")


def find(docs, kind):
    for objs in docs.values():
        for obj in objs:
            if obj["kind"] == kind:
                return obj
    raise AssertionError(f"no {kind} in deploy/k8s")


def expand(text, env):
    """Kubernetes' $(VAR) expansion in command and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: env.get(m.group(1), m.group(0)), text)


class Namespaces:
    """One network + mount namespace for all pods: a holder process."""

    def __init__(self, hosts_file):
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private",
             "sleep", "3600"])
        deadline = time.time() + 10
        own = os.readlink("/proc/self/ns/net")
        while os.readlink(f"/proc/{self.holder.pid}/ns/net") == own:
            assert time.time() < deadline, "unshare did not make a namespace"
            time.sleep(0.01)
        self.run(["ip", "link", "set", "lo", "up"])
        self.run(["mount", "--bind", hosts_file, "/etc/hosts"])

    def prefix(self):
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--mount"]

    def run(self, argv, **kw):
        return subprocess.run(self.prefix() + argv, check=True, **kw)

    def add_address(self, ip):
        self.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"])

    def close(self):
        self.holder.kill()
        self.holder.wait()


class Pod:
    """A pod's container as a process: its hostname, env and args."""

    def __init__(self, ns, container, hostname, env, mounts, log):
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOSTNAME": hostname}
        for e in container.get("env", []):
            if "value" in e:
                full_env[e["name"]] = e["value"]
        full_env.update(env)
        argv = [expand(a, full_env) for a in container["command"] +
                container.get("args", [])]
        argv[0] = BINARIES[argv[0]]
        for path, local in mounts.items():
            argv = [a.replace(path, local) for a in argv]
        self.argv = argv
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                ns.prefix() + ["unshare", "--uts", "sh", "-c",
                               'hostname "$0" && exec "$@"', hostname] + argv,
                env=full_env, stdout=out, stderr=subprocess.STDOUT)

    def output(self):
        with open(self.log) as f:
            return f.read()

    def wait_for(self, text, timeout):
        """Whether the pod prints `text` within `timeout` s (False once it
        exited without)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.output():
                return True
            if self.proc.poll() is not None:
                return text in self.output()
            time.sleep(0.1)
        return False

    def wait_for_step(self, rank, step, timeout):
        """Whether the pod prints a progress line of `rank` at `step` or
        later within `timeout` s. After a rollback the lines go on from the
        step resumed at (22, 32, ...), so an exact step may never appear."""
        pattern = re.compile(rf"^rank {rank} step (\d+) ", re.M)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(int(m) >= step for m in pattern.findall(self.output())):
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        return any(int(m) >= step for m in pattern.findall(self.output()))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def volume_mounts(container, work):
    mounts = {}
    for m in container.get("volumeMounts", []):
        local = os.path.join(work, m["name"])
        os.makedirs(local, exist_ok=True)
        mounts[m["mountPath"]] = local
    return mounts


def probe_ready(ns, ip, probe, deadline):
    port = probe["grpc"]["port"]
    while time.time() < deadline:
        r = subprocess.run(
            ns.prefix() + [BINARIES["zshardctl"], "health",
                           f"--server={ip}:{port}", "--timeout_s=2"],
            capture_output=True, text=True)
        if r.returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"{ip}:{port} not ready: {r.stdout}{r.stderr}")


def run_pods(docs, work):
    config = find(docs, "ConfigMap")
    service = find(docs, "Service")
    sts = find(docs, "StatefulSet")
    job = find(docs, "Job")
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    replicas = sts["spec"]["replicas"]
    server = sts["spec"]["template"]["spec"]["containers"][0]
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    assert job["spec"]["completionMode"] == "Indexed"
    trainers = job["spec"]["completions"]
    assert f"--trainers={trainers}" in server["args"], (
        "the Job's completions must equal the servers' --trainers")
    assert f"--num_shards={replicas}" in server["args"], (
        "the StatefulSet's replicas must equal --num_shards")

    # The ConfigMap's files, where its volume is mounted.
    server_mounts = volume_mounts(server, os.path.join(work, "server"))
    config_dir = next(local for path, local in server_mounts.items()
                      if path == "/etc/zshard")
    for key, text in config["data"].items():
        with open(os.path.join(config_dir, key), "w") as f:
            f.write(text)
    trainer_mounts = {"/etc/zshard": config_dir}

    name = sts["metadata"]["name"]
    svc = service["metadata"]["name"]
    ips = {i: f"10.244.0.{10 + i}" for i in range(replicas)}
    hosts = os.path.join(work, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for i, ip in ips.items():
            f.write(f"{ip} {name}-{i}.{svc} {name}-{i}\n")
    ns = Namespaces(hosts)
    pods = []
    try:
        for ip in ips.values():
            ns.add_address(ip)
        for i in range(replicas):
            pods.append(Pod(ns, server, f"{name}-{i}",
                            {"POD_NAME": f"{name}-{i}", "POD_IP": ips[i]},
                            server_mounts, os.path.join(work, f"shard-{i}.log")))
        print("shard pod command line:", " ".join(pods[0].argv[1:]))
        deadline = time.time() + 60
        for i in range(replicas):
            probe_ready(ns, ips[i], server["readinessProbe"], deadline)
        print(f"{replicas} shard pods ready (grpc probe on :"
              f"{server['readinessProbe']['grpc']['port']})")

        steps_arg = [a for a in trainer["args"] if a.startswith("--steps=")]
        assert steps_arg, "the trainers' args have no --steps"
        short = dict(trainer, args=[f"--steps={TRAIN_STEPS}" if a in steps_arg
                                    else a for a in trainer["args"]] +
                     ["--threads=1"])
        trainer_pods = []
        for r in range(trainers):
            trainer_pods.append(Pod(
                ns, short, f"{job['metadata']['name']}-{r}-x7k2p",
                {"JOB_COMPLETION_INDEX": str(r),
                 "POD_IP": f"10.244.1.{10 + r}"},
                trainer_mounts, os.path.join(work, f"trainer-{r}.log")))
        print("trainer pod command line:", " ".join(trainer_pods[0].argv[1:]))
        pods += trainer_pods
        for k, at in RESTARTS:
            assert trainer_pods[0].wait_for_step(0, at, 120), (
                f"rank 0 did not reach step {at}")
            pods[k].proc.kill()
            pods[k].proc.wait()
            pods[k] = Pod(ns, server, f"{name}-{k}",
                          {"POD_NAME": f"{name}-{k}", "POD_IP": ips[k]},
                          server_mounts,
                          os.path.join(work, f"shard-{k}-restarted.log"))
            probe_ready(ns, ips[k], server["readinessProbe"],
                        time.time() + 60)
            out = pods[k].output()
            assert "--replace=auto" in out and "replacing this shard" in out, out
            took = re.search(r"took the state of step (\d+)", out)
            assert took, out
            print(f"shard pod {k} killed at rank 0's step {at} and restarted: "
                  f"it replaced shard {k} from the state of step "
                  f"{took.group(1)}")
        for r, p in enumerate(trainer_pods):
            p.proc.wait(timeout=300)
            out = p.output()
            assert p.proc.returncode == 0, f"trainer {r}:\n{out}"
            m = re.search(rf"rank {r} done: steps 0\.\.{TRAIN_STEPS}, loss "
                          r"([0-9.]+) -> ([0-9.]+)", out)
            assert m, f"trainer {r} (rank from JOB_COMPLETION_INDEX):\n{out}"
            first, last = float(m.group(1)), float(m.group(2))
            assert last < first, f"rank {r}: loss {first} -> {last}"
            assert "the cluster rolled back to step" in out, out
            print(f"trainer pod {r}: rank {r}, loss {first} -> {last}, "
                  f"rolled back {out.count('the cluster rolled back')} times")

        # A shard pod whose hostname has no ordinal.
        bad = Pod(ns, server, "zshard",
                  {"POD_NAME": "zshard", "POD_IP": ips[0]}, server_mounts,
                  os.path.join(work, "bad.log"))
        bad.proc.wait(timeout=30)
        lines = bad.output().strip().splitlines()
        assert bad.proc.returncode != 0 and len(lines) == 1 and \
            "--shard_id_from_hostname" in lines[0] and "'zshard'" in lines[0], \
            bad.output()
        print("hostname without an ordinal:", lines[0])
    except Exception:
        for p in pods:
            print(f"--- {p.log}\n{p.output()[-3000:]}", file=sys.stderr)
        raise
    finally:
        for p in pods:
            p.stop()
        ns.close()


def main():
    docs = load_manifests()
    validate(docs)
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("SKIP: running the pods needs root and unshare (namespaces)",
              file=sys.stderr)
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="zs-k8s.")
    try:
        run_pods(docs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
