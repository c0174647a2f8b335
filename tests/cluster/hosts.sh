#!/bin/bash
# Emulated hosts on one machine (issue 19): each "host" is a network, IPC,
# UTS, PID and mount namespace of its own, joined to the others by a veth
# pair to one bridge, with its own address (10.231.0.<i+1>/24) and hostname,
# and optionally a link shaped with tc tbf (netem is absent here). Processes
# of one host share memory as on a real host (UCX picks shared memory among
# them); between hosts UCX finds neither shared memory (other IPC namespace)
# nor CMA (other PID namespace) and goes over tcp, through the shaped links.
#
#   hosts.sh up TAG N [RATE]   make hosts 0..N-1 (RATE: tc rate such as
#                              1gbit, or "off"; default off)
#   hosts.sh run TAG I CMD...  run CMD on host I (it dies with this process)
#   hosts.sh addr TAG I        print host I's address
#   hosts.sh shape TAG I RATE  shape host I's link both ways (or "off")
#   hosts.sh cut TAG I         take host I's link down (packets are lost,
#                              nothing is reset: peers see silence)
#   hosts.sh heal TAG I        bring it back
#   hosts.sh down TAG          kill every process of every host and remove
#                              the namespaces, links and bridge (idempotent)
#
# TAG: up to 6 letters or digits, unique among the sets that exist at once.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN). `up` undoes what it made when a
# step fails, and exits 77 when namespaces cannot be made at all here.
set -euo pipefail

STATE_ROOT=${ZSHARD_HOSTS_STATE:-/run/zshard-hosts}

die() {
  echo "hosts.sh: $*" >&2
  exit 1
}

check_tag() {
  [[ "$1" =~ ^[a-z0-9]{1,6}$ ]] ||
    die "TAG '$1' must be 1 to 6 lowercase letters or digits"
}

check_host() {
  local tag=$1 i=$2
  [[ "$i" =~ ^[0-9]+$ ]] || die "host index '$i' is not a number"
  [ -f "$STATE_ROOT/$tag/init-$i" ] ||
    die "host $i of set '$tag' does not exist (hosts.sh up $tag N first)"
}

netns() { echo "zs$1h$2"; }
root_veth() { echo "zs$1v$2"; }
bridge() { echo "zs$1br"; }
addr() { echo "10.231.0.$(($2 + 1))"; }
init_pid() { cat "$STATE_ROOT/$1/init-$2"; }

# tc tbf on one device: RATE, with a burst of 1 ms of it, at least 256 KiB
# (veth hands over 64 KiB GSO packets). A real link sends nothing faster
# than its rate after a pause; a burst of 10 ms (what this was) let the
# first 1.25 MB of each transfer at 1gbit through at once: 5 MB after an
# idle 100 ms took 32 ms instead of 40.
shape_dev() {
  local ns=$1 dev=$2 rate=$3
  local run=()
  [ -n "$ns" ] && run=(ip netns exec "$ns")
  "${run[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
  [ "$rate" = off ] && return 0
  local bits
  bits=$(rate_bits "$rate") || die "RATE '$rate' is not a tc rate (e.g. 100mbit, 2gbit) or off"
  local burst=$((bits / 8 / 1000))
  [ "$burst" -lt 262144 ] && burst=262144
  "${run[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" \
    latency 100ms
}

rate_bits() {
  local r=$1 n unit
  [[ "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || return 1
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in
  bit) echo "$n" ;;
  kbit) echo $((n * 1000)) ;;
  mbit) echo $((n * 1000000)) ;;
  gbit) echo $((n * 1000000000)) ;;
  esac
}

cmd_down() {
  local tag=$1
  check_tag "$tag"
  local dir=$STATE_ROOT/$tag
  if [ -d "$dir" ]; then
    for f in "$dir"/init-*; do
      [ -f "$f" ] || continue
      # The host's PID 1: when it dies the kernel kills every process in
      # the host's PID namespace.
      kill -KILL "$(cat "$f")" 2>/dev/null || true
    done
  fi
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^zs${tag}h[0-9]+$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$(bridge "$tag")" 2>/dev/null || true
  for dev in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^zs${tag}v[0-9]+$" || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  rm -rf "$dir"
}

cmd_up() {
  local tag=$1 n=$2 rate=${3:-off}
  check_tag "$tag"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
    die "N '$n' must be 1 to 200"
  [ "$rate" = off ] || rate_bits "$rate" >/dev/null ||
    die "RATE '$rate' is not a tc rate (e.g. 100mbit, 2gbit) or off"
  [ "$(id -u)" = 0 ] || {
    echo "hosts.sh: emulated hosts need root" >&2
    exit 77
  }
  [ -e "$STATE_ROOT/$tag" ] && die "set '$tag' exists already (hosts.sh down $tag)"
  if ! unshare --net --ipc --pid --uts --mount --fork true 2>/dev/null; then
    echo "hosts.sh: this machine cannot make namespaces (unshare failed)" >&2
    exit 77
  fi
  mkdir -p "$STATE_ROOT/$tag"
  # Whatever stops `up` early (a failed step, die) undoes what it made.
  trap 'cmd_down "$tag"' EXIT
  ip link add "$(bridge "$tag")" type bridge
  ip link set "$(bridge "$tag")" up
  for ((i = 0; i < n; i++)); do
    local ns rv
    ns=$(netns "$tag" "$i")
    rv=$(root_veth "$tag" "$i")
    ip netns add "$ns"
    ip link add "$rv" type veth peer name eth0 netns "$ns"
    ip link set "$rv" master "$(bridge "$tag")" up
    ip -n "$ns" addr add "$(addr "$tag" "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    shape_dev "" "$rv" "$rate"
    shape_dev "$ns" eth0 "$rate"
    # The host's PID 1 (and its IPC, UTS and mount namespaces), in the
    # network namespace; it holds them for `run`.
    local ready=$STATE_ROOT/$tag/ready-$i
    setsid ip netns exec "$ns" unshare --ipc --uts --pid --mount --fork \
      --mount-proc sh -c "hostname $ns && echo \$\$ > '$ready.tmp' &&
        mv '$ready.tmp' '$ready' && exec sleep infinity" \
      </dev/null >/dev/null 2>&1 &
    local launcher=$!
    local waited=0
    until [ -f "$ready" ]; do
      sleep 0.05
      waited=$((waited + 1))
      [ "$waited" -lt 200 ] || die "host $i did not start within 10 s"
    done
    # unshare's child is the host's PID 1 (seen from here by its own PID).
    local pid
    pid=$(pgrep -P "$launcher") || die "host $i's init process was not found"
    echo "$pid" >"$STATE_ROOT/$tag/init-$i"
  done
  trap - EXIT
}

cmd_run() {
  local tag=$1 i=$2
  shift 2
  check_tag "$tag"
  check_host "$tag" "$i"
  [ "$#" -ge 1 ] || die "run needs a command"
  # nsenter forks into the PID namespace; the command gets SIGKILL when
  # nsenter dies (a test that kills what it started kills the command).
  exec nsenter --target "$(init_pid "$tag" "$i")" --net --ipc --uts --pid \
    --mount --wd="$PWD" -- setpriv --pdeathsig KILL -- "$@"
}

cmd_link() {
  local tag=$1 i=$2 state=$3
  check_tag "$tag"
  check_host "$tag" "$i"
  ip link set "$(root_veth "$tag" "$i")" "$state"
}

main() {
  [ "$#" -ge 2 ] || die "usage: hosts.sh up|run|addr|shape|cut|heal|down TAG ..."
  local cmd=$1
  shift
  case $cmd in
  up)
    [ "$#" -ge 2 ] || die "usage: hosts.sh up TAG N [RATE]"
    cmd_up "$@"
    ;;
  down) cmd_down "$1" ;;
  run) cmd_run "$@" ;;
  addr)
    check_tag "$1"
    check_host "$1" "${2:-}"
    addr "$1" "$2"
    ;;
  shape)
    [ "$#" -eq 3 ] || die "usage: hosts.sh shape TAG I RATE"
    check_tag "$1"
    check_host "$1" "$2"
    shape_dev "" "$(root_veth "$1" "$2")" "$3"
    shape_dev "$(netns "$1" "$2")" eth0 "$3"
    ;;
  cut) cmd_link "$1" "${2:-}" down ;;
  heal) cmd_link "$1" "${2:-}" up ;;
  *) die "unknown command '$cmd' (up, run, addr, shape, cut, heal, down)" ;;
  esac
}

main "$@"
