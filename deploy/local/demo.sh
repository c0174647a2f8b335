#!/usr/bin/env bash
# One-machine demo: builds zshard (Release), starts 4 shard servers and 2
# trainers on 127.0.0.1 (free ports), trains the reference GPT on the text in
# /usr/share/common-licenses, prints per-step loss, tokens/s and traffic, then
# `zshardctl status`. Every process it starts is stopped on exit, Ctrl-C or
# failure.
#
# Environment: ZSHARD_DEMO_STEPS (default 150, 1..1000000), ZSHARD_DEMO_SHARDS
# (4, 1..64), ZSHARD_DEMO_TRAINERS (2, 1..16; the global batch is 8 per
# trainer), ZSHARD_BUILD_DIR (build-release; an existing build folder keeps
# its build type).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
steps=${ZSHARD_DEMO_STEPS:-150}
shards=${ZSHARD_DEMO_SHARDS:-4}
trainers=${ZSHARD_DEMO_TRAINERS:-2}
build=${ZSHARD_BUILD_DIR:-$root/build-release}
config=$root/deploy/local/ds_config.json
interval=$(sed -n 's/.*"interval_steps": *\([0-9]*\).*/\1/p' "$config")

# Each knob is checked before anything starts; a bad one is named.
knob() {
  local name=$1 value=$2 max=$3
  if ! [[ "$value" =~ ^[0-9]+$ ]] || [ "$value" -lt 1 ] || [ "$value" -gt "$max" ]; then
    echo "demo: $name=$value: must be a whole number from 1 to $max" >&2
    exit 2
  fi
}
knob ZSHARD_DEMO_STEPS "$steps" 1000000
knob ZSHARD_DEMO_SHARDS "$shards" 64
knob ZSHARD_DEMO_TRAINERS "$trainers" 16

"$root/deploy/install-deps.sh"
# A build folder that exists keeps its own build type (a Debug or
# RelWithDebInfo tree is not rebuilt as Release).
build_type=(-DCMAKE_BUILD_TYPE=Release)
[ -f "$build/CMakeCache.txt" ] && build_type=()
echo "== building (${build_type[*]:-existing build type}) in $build"
cmake -S "$root" -B "$build" -G Ninja "${build_type[@]}" >/dev/null
cmake --build "$build" --target zshard-server zshard-train zshardctl | grep -v '^\[' || true
bin=$build
[ -x "$bin/server/zshard-server" ] || { echo "demo: build failed" >&2; exit 1; }

work=$(mktemp -d /tmp/zshard-demo.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits (at most 30 s) for a server to write its port file.
wait_port() {
  local file=$1 pid=$2
  for _ in $(seq 300); do
    [ -s "$file" ] && { cat "$file"; return 0; }
    kill -0 "$pid" 2>/dev/null || { echo "demo: a server exited early" >&2; return 1; }
    sleep 0.1
  done
  echo "demo: no port from a server within 30 s" >&2
  return 1
}

echo "== starting $shards shard servers"
"$bin/server/zshard-server" --listen=127.0.0.1:0 --port_file="$work/port0" \
  --shard_id=0 --num_shards="$shards" --trainers="$trainers" --config="$config" \
  --checkpoint_dir="$work/ckpt" 2>"$work/server0.log" &
pids+=($!)
port0=$(wait_port "$work/port0" "${pids[0]}")
coordinator=127.0.0.1:$port0
for ((s = 1; s < shards; s++)); do
  "$bin/server/zshard-server" --listen=127.0.0.1:0 --port_file="$work/port$s" \
    --shard_id="$s" --num_shards="$shards" --trainers="$trainers" \
    --config="$config" --coordinator="$coordinator" --checkpoint_dir="$work/ckpt" \
    2>"$work/server$s.log" &
  pids+=($!)
  wait_port "$work/port$s" "${pids[-1]}" >/dev/null
done
echo "   coordinator (shard 0) at $coordinator"

echo "== training: $trainers trainers, $steps steps"
trainer_pids=()
for ((r = 0; r < trainers; r++)); do
  "$bin/client/zshard-train" --coordinator="$coordinator" --rank="$r" \
    --config="$config" --steps="$steps" &
  pids+=($!)
  trainer_pids+=($!)
done
failed=0
for pid in "${trainer_pids[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" -ne 0 ]; then
  echo "demo: a trainer failed; server logs:" >&2
  tail -n 5 "$work"/server*.log >&2
  exit 1
fi

echo "== zshardctl status"
"$bin/client/zshardctl" status --server="$coordinator"
echo "== checkpoints (every $interval steps, a base every 2; written in the background)"
if ! grep -h "checkpoint at step" "$work/server0.log" | sed 's/^zshard-server: /   /'; then
  echo "   none fell due in $steps steps (the first is at step $interval); taking one on demand"
fi
"$bin/client/zshardctl" checkpoint --server="$coordinator" --timeout_s=120
newest=$(ls -d "$work"/ckpt/step-* | tail -n 1)
echo "   $newest:"
ls -l "$newest" | tail -n +2 | awk '{printf "     %10s  %s\n", $5, $9}'
"$bin/client/zshardctl" export --checkpoint_dir="$work/ckpt" \
  --out="$work/model.safetensors" --format=safetensors
echo "== demo finished"
