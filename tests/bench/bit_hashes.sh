#!/usr/bin/env bash
# Final-parameter hashes of the reference runs (issue: "same bits before and
# after a restructuring"): 4 zshard-server + 2 zshard-train processes on
# 127.0.0.1 train the small GPT for 20 steps in each configuration below, and
# the script prints the sha256 of rank 0's --dump_params file, one line per
# run. Compare the output of two builds; every line must match.
#
# Usage: tests/bench/bit_hashes.sh SERVER_BIN TRAIN_BIN [RUN_NAME...]
# Every process it starts is stopped on exit; a run that fails prints FAILED
# and the script exits 1 at the end.
set -euo pipefail

server=${1:?usage: bit_hashes.sh SERVER_BIN TRAIN_BIN [RUN...]}
train=${2:?usage: bit_hashes.sh SERVER_BIN TRAIN_BIN [RUN...]}
shift 2
shards=4
trainers=2
steps=20
work=$(mktemp -d /tmp/zshard-hashes.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap 'cleanup; rm -rf "$work"' EXIT

# config NAME -> the ds_config text of that run.
config() {
  local stage=3 extra="" accum=1 batch=8
  case $1 in
    stage0) stage=0 ;;
    stage1) stage=1 ;;
    stage2) stage=2 ;;
    fp16_skip) extra=', "fp16": {"enabled": true, "initial_scale_power": 8}' ;;
    bf16) extra=', "bf16": {"enabled": true}' ;;
    accumulation) accum=2; batch=16 ;;
    clipping) extra=', "gradient_clipping": 0.05' ;;
    recompute) extra=', "activation_checkpointing": {}' ;;
  esac
  cat <<EOF
{"train_batch_size": $batch, "train_micro_batch_size_per_gpu": 4,
 "gradient_accumulation_steps": $accum,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95],
                                           "eps": 1e-8, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $stage, "stage3_param_persistence_threshold": 5000,
                       "stage3_prefetch_bucket_size": 15000}$extra}
EOF
}

# Waits (at most 30 s) for a server's port file.
wait_port() {
  local file=$1 pid=$2
  for _ in $(seq 300); do
    [ -s "$file" ] && { cat "$file"; return 0; }
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# run NAME: trains one configuration; prints "NAME sha256".
run() {
  local name=$1 dir=$work/$1 transport=ucx trainer_flags=()
  mkdir -p "$dir"
  case $name in
    inline) transport=inline ;;
    fp16_skip) trainer_flags=(--inject_nonfinite_steps=3,11 --inject_nonfinite_rank=1) ;;
  esac
  config "$name" >"$dir/ds_config.json"
  local coordinator=""
  for ((s = 0; s < shards; s++)); do
    local args=(--listen=127.0.0.1:0 --port_file="$dir/port$s" --shard_id="$s"
                --num_shards="$shards" --trainers="$trainers" --config="$dir/ds_config.json"
                --transport="$transport")
    [ "$s" -gt 0 ] && args+=(--coordinator="$coordinator")
    "$server" "${args[@]}" 2>"$dir/server$s.log" &
    pids+=($!)
    local port
    port=$(wait_port "$dir/port$s" "${pids[-1]}") || { echo "$name FAILED (server $s)"; return 1; }
    [ "$s" -eq 0 ] && coordinator=127.0.0.1:$port
  done
  local tp=()
  for ((r = 0; r < trainers; r++)); do
    "$train" --coordinator="$coordinator" --rank="$r" --config="$dir/ds_config.json" \
      --steps="$steps" --data=/usr/share/common-licenses --threads=1 --log_every=0 \
      --context=16 --d_model=32 --layers=4 --heads=2 --seed=1 \
      --dump_params="$dir/params.bin" "${trainer_flags[@]}" 2>"$dir/trainer$r.log" >/dev/null &
    pids+=($!)
    tp+=($!)
  done
  local failed=0
  for pid in "${tp[@]}"; do timeout 300 tail --pid="$pid" -f /dev/null; wait "$pid" || failed=1; done
  cleanup
  if [ "$failed" -ne 0 ] || [ ! -s "$dir/params.bin" ]; then
    echo "$name FAILED"; tail -n 3 "$dir"/trainer*.log >&2; return 1
  fi
  echo "$name $(sha256sum "$dir/params.bin" | cut -d' ' -f1)"
}

runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(ucx inline stage0 stage1 stage2 fp16_skip bf16 accumulation clipping recompute)
status=0
for name in "${runs[@]}"; do run "$name" || status=1; done
exit $status
