#!/usr/bin/env bash
# deploy/slurm/zshard.sbatch against a real single-node Slurm (Debian's
# slurm-wlm and munge), started here in a temporary folder on free ports and
# torn down at the end, also on failure:
#   1. a job trains 16 steps on 2 shards x 2 trainers: COMPLETED, each
#      rank's loss fell, the servers checkpointed at step 10;
#   2. a second job is requeued after a checkpoint (every 10 steps) and
#      resumes from the newest (--restore=latest), then is scancelled mid-run: CANCELLED,
#      and no zshard process is left running;
#   3. a step whose task count disagrees with --num_shards is refused.
# Skips (77) when Slurm or munge is not installed or not root (slurmd).
# Environment: ZSHARD_SERVER_BIN, ZSHARD_TRAIN_BIN, ZSHARDCTL_BIN.
set -euo pipefail

for tool in slurmctld slurmd sbatch munged runuser; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (deploy/install-deps.sh installs slurm-wlm and munge)" >&2; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: slurmd needs root" >&2; exit 77; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

work=$(mktemp -d /tmp/zs-slurm.XXXXXX)
chmod 755 "$work"
# The job script finds the binaries in one folder.
ZSHARD_BIN_DIR=$work/bin
mkdir -p "$ZSHARD_BIN_DIR"
ln -s "${ZSHARD_SERVER_BIN:?}" "$ZSHARD_BIN_DIR/zshard-server"
ln -s "${ZSHARD_TRAIN_BIN:?}" "$ZSHARD_BIN_DIR/zshard-train"
ln -s "${ZSHARDCTL_BIN:?}" "$ZSHARD_BIN_DIR/zshardctl"
daemons=()
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log "$work"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; } >&2; done
  grep -hE "zshard.sbatch|resuming|serving on|rror" "$work"/*.out >&2 || true
  exit 1
}
# Processes started under this test's Slurm (their environment names its
# slurm.conf), optionally only those of job $1: srun, its tasks, the batch
# shell. The daemons are not among them.
ours() {
  local pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$pid" = $$ ] && continue
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$work/slurm.conf" || continue
    [ -z "${1:-}" ] || tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" || continue
    echo "$pid"
  done
}
teardown() {
  local rc=$?
  trap - EXIT
  scancel --full -u root >/dev/null 2>&1 || true
  for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  for pid in "${daemons[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  pkill -KILL -f "$work/" 2>/dev/null || true
  for pid in $(ours); do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$work"
  exit "$rc"
}
trap teardown EXIT

# Free TCP ports for slurmctld and slurmd (Slurm cannot take port 0).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port) slurmd_port=$(free_port)

# munged as the munge user, with a key and socket of its own.
mkdir -p "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$work/munge"
chmod 700 "$work/munge"
chmod 400 "$work/munge/munge.key"
runuser -u munge -- munged --foreground --socket="$work/munge/munge.socket" \
  --key-file="$work/munge/munge.key" --pid-file="$work/munge/munged.pid" \
  --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
  >"$work/munged.log" 2>&1 &
daemons+=($!)
chmod 755 "$work/munge"
for _ in $(seq 100); do [ -S "$work/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$work/munge/munge.socket" ] || fail "munged did not start"

mkdir -p "$work/state" "$work/spool"
cat >"$work/slurm.conf" <<CONF
ClusterName=zstest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ReturnToService=2
MpiDefault=none
KillWait=10
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$work/slurmctld.out.log" 2>&1 &
daemons+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >"$work/slurmd.out.log" 2>&1 &
daemons+=($!)
for _ in $(seq 300); do
  sinfo -h -o '%t' 2>/dev/null | grep -qx 'idle' && break
  sleep 0.2
done
sinfo -h -o '%t' | grep -qx 'idle' || fail "the Slurm node did not become idle: $(sinfo 2>&1)"
echo "slurm up: slurmctld :$ctld_port, slurmd :$slurmd_port"

cat >"$work/ds_config.json" <<'CONF'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
 "zero_optimization": {"stage": 3},
 "zshard_checkpoint": {"interval_steps": 10}}
CONF
export ZSHARD_BIN_DIR ZSHARD_CONFIG=$work/ds_config.json ZSHARD_SHARDS=2 \
  ZSHARD_TRAINERS=2 ZSHARD_LISTEN_HOST=127.0.0.1 \
  ZSHARD_CHECKPOINT_DIR=$work/ckpt ZSHARD_RUN_DIR=$work/run \
  ZSHARD_TRAIN_ARGS="--data=/usr/share/common-licenses --threads=1 --log_every=1 --context=16 --d_model=32 --layers=2 --heads=2"
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

# 1. A job that runs to the end.
job=$(cd "$work" && ZSHARD_STEPS=16 sbatch --parsable --ntasks=2 --output="$work/job1.out" \
  --wait "$root/deploy/slurm/zshard.sbatch") || fail "job 1 did not complete: state $(job_state "${job:-?}")"
state=$(job_state "$job")
echo "job $job: $state"
[ "$state" = COMPLETED ] || fail "job $job ended $state"
for r in 0 1; do
  line=$(grep "^rank $r done:" "$work/job1.out") || fail "rank $r printed no summary"
  first=$(sed -n 's/.*loss \([0-9.]*\) -> \([0-9.]*\),.*/\1/p' <<<"$line")
  last=$(sed -n 's/.*loss \([0-9.]*\) -> \([0-9.]*\),.*/\2/p' <<<"$line")
  python3 -c "import sys; sys.exit(0 if $last < $first else 1)" || fail "rank $r: loss $first -> $last did not fall"
  echo "rank $r: loss $first -> $last"
done
grep -q "checkpoint at step 10 complete" "$work/job1.out" || fail "no checkpoint at step 10"
grep -q "Killed" "$work/job1.out" && fail "job 1's servers were killed, not stopped with SIGTERM"
pgrep -f "$ZSHARD_BIN_DIR/zshard-" >/dev/null && fail "zshard processes left after job 1: $(pgrep -af "$ZSHARD_BIN_DIR/zshard-")"

# 2. A job that is requeued after its checkpoint at step 10 resumes from
#    it, and is then scancelled while it trains.
wait_for() {  # PATTERN JOB: until the job's output has PATTERN (60 s)
  for _ in $(seq 300); do
    grep -q "$1" "$work/job2.out" 2>/dev/null && return 0
    case "$(job_state "$2")" in COMPLETED|FAILED|CANCELLED|TIMEOUT) break ;; esac
    sleep 0.2
  done
  fail "job $2 printed no '$1' ($(scontrol show job "$2" | grep -oE '(JobState|Reason|BeginTime|Restarts)=[^ ]*' | tr '\n' ' '))"
}
job2=$(cd "$work" && ZSHARD_STEPS=100000 ZSHARD_CHECKPOINT_DIR=$work/ckpt2 sbatch --parsable \
  --ntasks=2 --output="$work/job2.out" "$root/deploy/slurm/zshard.sbatch")
wait_for "checkpoint at step 10 complete" "$job2"
scontrol requeue "$job2"
# Slurm holds a requeued job back (Reason=BeginTime, about two minutes):
# let it start now, once the old attempt has stopped (its servers first
# finish the checkpoint they are writing: up to --stop_timeout_s).
for _ in $(seq 300); do
  [ "$(job_state "$job2")" = PENDING ] && break
  sleep 0.2
done
# slurmd revoked the old attempt's credential when it killed it, and refuses
# a credential made within the same second ("Job credential revoked": the
# new attempt fails at once): start it two seconds later.
sleep 2
scontrol update JobId="$job2" StartTime=now
wait_for "requeued (attempt 1): resuming" "$job2"
wait_for "resuming at step [1-9][0-9]* from a checkpoint" "$job2"
resumed=$(grep -m1 -o "resuming at step [0-9]* from a checkpoint" "$work/job2.out" | awk '{print $4}')
[ $((resumed % 10)) -eq 0 ] || fail "resumed at step $resumed, not at a checkpoint (every 10)"
wait_for "^rank [01] step $((resumed + 3)) " "$job2"
echo "job $job2: requeued, attempt 1 resumed from its checkpoint at step $resumed and trains on"
scancel "$job2"
for _ in $(seq 300); do
  case "$(job_state "$job2")" in CANCELLED|COMPLETED|FAILED) break ;; esac
  sleep 0.2
done
state2=$(job_state "$job2")
echo "job $job2 after scancel: $state2"
[ "$state2" = CANCELLED ] || fail "job $job2 is $state2 after scancel"
for _ in $(seq 150); do pgrep -f "$ZSHARD_BIN_DIR/zshard-" >/dev/null || break; sleep 0.2; done
if pgrep -f "$ZSHARD_BIN_DIR/zshard-" >/dev/null; then
  fail "processes left after scancel: $(pgrep -af "$ZSHARD_BIN_DIR/zshard-")"
fi
for _ in $(seq 150); do [ -z "$(ours "$job2")" ] && break; sleep 0.2; done
left=$(ours "$job2")
[ -z "$left" ] || fail "job $job2's processes left after scancel: $(ps -o pid,args -p "$(tr '\n' ',' <<<"$left" | sed 's/,$//')")"

# 3. A step whose task count disagrees with --num_shards: one line, exit 2.
set +e
srun --ntasks=1 --error="$work/task-count.err" "$ZSHARD_BIN_DIR/zshard-server" \
  --num_shards=2 2>/dev/null
rc=$?
set -e
out=$(cat "$work/task-count.err")  # the server's stderr alone, not srun's
lines=$(grep -c . <<<"$out")
echo "srun --ntasks=1 zshard-server --num_shards=2: exit $rc: $out"
[ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && grep -q "SLURM_STEP_NUM_TASKS=1" <<<"$out" ||
  fail "a disagreeing task count was not refused in one line (exit $rc): $out"
echo "PASS: job $job $state, job $job2 $state2, nothing left running"
