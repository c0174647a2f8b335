#!/usr/bin/env bash
# docker/Dockerfile built and run for real with Debian's podman (no image
# registry is reachable here):
#   1. a Debian 12 base image from Debian's packages (debootstrap
#      --variant=minbase bookworm, podman import), kept as
#      localhost/zshard-base:bookworm for the next run;
#   2. our image built on it (multi-stage, with this machine's ccache
#      mounted into the build stage; podman keeps the layers);
#   3. 2 server containers and 1 trainer container with host networking
#      train 10 steps; the loss must fall; the image's HEALTHCHECK passes;
#   4. a trainer container without a coordinator, and a command that is not
#      one of our binaries, exit non-zero with one line naming the problem.
# Containers and the test's image tag are removed at the end, also on
# failure. Prints the image size and the build time.
# A cold first run (no base image, layers or ccache) took 7.5 min here.
# Skips (77) with ZSHARD_TEST_CONTAINERS=0, and without root, podman or
# debootstrap. Environment: ZSHARD_SOURCE_DIR (the checkout to
# build).
set -euo pipefail

if [ "${ZSHARD_TEST_CONTAINERS:-1}" = 0 ]; then
  echo "SKIP: ZSHARD_TEST_CONTAINERS=0" >&2
  exit 77
fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (apt-get install podman debootstrap runc)" >&2; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (podman storage, debootstrap)" >&2; exit 77; }
src=${ZSHARD_SOURCE_DIR:?}

# What podman needs on these machines (seen here: the defaults fail with
# setrlimit and cgroup errors).
pm() { podman --runtime runc --cgroup-manager=cgroupfs "$@"; }
limits=(--ulimit nofile=1024:20000 --ulimit nproc=1024:1024)
base=localhost/zshard-base:bookworm
tag=localhost/zshard-test:$$
work=$(mktemp -d /tmp/zs-container.XXXXXX)
chmod 777 "$work"
names=()
fail() { echo "FAIL: $*" >&2; for n in "${names[@]}"; do echo "--- $n" >&2; pm logs "$n" 2>&1 | tail -n 20 >&2; done; exit 1; }
teardown() {
  local rc=$?
  trap - EXIT
  for n in "${names[@]}"; do pm rm -f -t 5 "$n" >/dev/null 2>&1 || true; done
  pm rmi "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap teardown EXIT

# 1. The base image, once per machine.
if ! pm image exists "$base"; then
  start=$SECONDS
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian \
    >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; fail "debootstrap failed"; }
  tar -C "$work/rootfs" -c . | pm import - "$base" >/dev/null
  rm -rf "$work/rootfs"
  echo "base image $base made in $((SECONDS - start)) s"
fi

# 2. Our image.
ccache_dir=$(ccache -k cache_dir 2>/dev/null || echo "$HOME/.cache/ccache")
mkdir -p "$ccache_dir"
start=$SECONDS
pm build --format docker --network host "${limits[@]}" --build-arg BASE="$base" \
  -v "$ccache_dir:/ccache" -f "$src/docker/Dockerfile" -t "$tag" "$src" \
  >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; fail "podman build failed"; }
build_s=$((SECONDS - start))
size=$(pm image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1000000)) MB, built in $build_s s"

# 3. 2 servers + 1 trainer, host networking, on free ports of 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat >"$work/ds_config.json" <<'CONF'
{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
 "zero_optimization": {"stage": 3}}
CONF
run() {  # NAME ARGS...: a detached container of the image
  local name=zs-$1-$$
  shift
  names+=("$name")
  # (podman's complaint that it cannot make systemd timers for the
  # HEALTHCHECK goes to a log: the test runs the check itself.)
  pm run -d --name "$name" --network host "${limits[@]}" -v "$work:/work" "$@" \
    >/dev/null 2>>"$work/podman-run.log"
}
p0=$(free_port) p1=$(free_port)
run s0 -e ZSHARD_HEALTH_SERVER=127.0.0.1:$p0 "$tag" zshard-server --listen=127.0.0.1:$p0 \
  --num_shards=2 --trainers=1 --config=/work/ds_config.json
run s1 -e ZSHARD_HEALTH_SERVER=127.0.0.1:$p1 "$tag" zshard-server --listen=127.0.0.1:$p1 \
  --shard_id=1 --num_shards=2 --trainers=1 --config=/work/ds_config.json \
  --coordinator=127.0.0.1:$p0
for n in s0 s1; do
  ok=0
  for _ in $(seq 100); do
    pm healthcheck run "zs-$n-$$" >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.3
  done
  [ "$ok" = 1 ] || fail "zs-$n-$$ never healthy (HEALTHCHECK: zshardctl health)"
done
echo "servers healthy (the image's HEALTHCHECK)"
run t0 "$tag" zshard-train --coordinator=127.0.0.1:$p0 --config=/work/ds_config.json \
  --steps=10 --data=/usr/share/common-licenses --threads=1 --log_every=0 \
  --context=16 --d_model=32 --layers=2 --heads=2
code=$(timeout 300 podman --runtime runc --cgroup-manager=cgroupfs wait "zs-t0-$$") || fail "the trainer did not finish"
out=$(pm logs "zs-t0-$$" 2>&1)
[ "$code" = 0 ] || fail "the trainer exited $code"
line=$(grep "^rank 0 done:" <<<"$out") || fail "no summary from the trainer"
first=$(sed -n 's/.*loss \([0-9.]*\) -> \([0-9.]*\),.*/\1/p' <<<"$line")
last=$(sed -n 's/.*loss \([0-9.]*\) -> \([0-9.]*\),.*/\2/p' <<<"$line")
python3 -c "import sys; sys.exit(0 if $last < $first else 1)" || fail "loss $first -> $last did not fall"
echo "trainer container: loss $first -> $last in 10 steps"

# 4. Bad input: one line naming the problem, exit non-zero.
refused() {  # WHAT ARGS...
  local what=$1
  shift
  set +e
  out=$(pm run --rm --no-healthcheck --network host "${limits[@]}" "$tag" "$@" 2>&1)
  local rc=$?
  set -e
  [ "$rc" -ne 0 ] && [ "$(grep -c . <<<"$out")" -eq 1 ] && grep -q -- "$what" <<<"$out" ||
    fail "'$*' was not refused in one line naming $what (exit $rc): $out"
  echo "refused (exit $rc): $out"
}
refused --coordinator zshard-train --steps=1
refused "is not one of" bash -c true
echo "PASS"
