#!/usr/bin/env bash
# scripts/cluster.sh: a cluster of N hosts on this machine, for multi-node tests and benches.
#
#   scripts/cluster.sh up 2                      # hosts h0, h1 (network namespaces), a bridge
#   scripts/cluster.sh mpirun -np 4 --map-by ppr:2:node build/train_gpt --config gpt.ini
#   scripts/cluster.sh run h1 hostname           # any command inside one host
#   scripts/cluster.sh rate h1 100mbit           # a rate limit on h1's link (tc tbf), "none" to lift
#   scripts/cluster.sh cut h1; scripts/cluster.sh heal h1
#   scripts/cluster.sh down                      # ends every process in the hosts, removes them
#
# Each host is a network namespace with its own host name (a UTS namespace per command: Open
# MPI decides what is local by host name, and two hosts sharing one crash its shared-memory
# transport), an address in 198.18.0.0/24 (a range reserved for benchmarking) on a veth
# link to a bridge that lives in a namespace of its own. Nothing is added to this machine's
# own network. Open MPI runs inside host 0 and starts its daemons on the other hosts through
# an rsh agent that enters their namespaces (no ssh); ranks talk TCP between hosts and shared
# memory inside one.
#
# NDT_CLUSTER (default ndt; at most 6 letters and digits) prefixes every name, so that
# several clusters can exist at once (one per test). NDT_CLUSTER_OWNER (default: the caller's
# pid) is the process the cluster belongs to: `cluster.sh sweep` removes every cluster whose
# owner is gone (a test that was killed before its teardown). Needs root, ip (iproute2),
# unshare (util-linux) and tc. Exit code 3 when namespaces cannot be made here (not root, no
# netns support): tests skip on it.
set -euo pipefail

NAME="${NDT_CLUSTER:-ndt}"
[[ "$NAME" =~ ^[a-z0-9]{1,6}$ ]] || { echo "cluster.sh: NDT_CLUSTER must be 1-6 letters or digits, got '$NAME'" >&2; exit 2; }
[[ "${NDT_CLUSTER_TCP_RETRIES:-3}" =~ ^[0-9]{1,2}$ ]] || { echo "cluster.sh: NDT_CLUSTER_TCP_RETRIES must be 0-99, got '$NDT_CLUSTER_TCP_RETRIES'" >&2; exit 2; }
ROOT_STATE=/run/ndt-cluster
STATE="$ROOT_STATE/$NAME"  # the host count and the owner's pid
AGENT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster_agent.sh"

die() { echo "cluster.sh: $*" >&2; exit 1; }
ns() { echo "${NAME}_$1"; }  # the namespace of host $1 (h0, h1, ...)
hosts() { cat "$STATE/count" 2>/dev/null || echo 0; }
addr() { echo "198.18.0.$((10 + ${1#h}))"; }

need_tools() {
  for t in ip unshare tc; do command -v "$t" >/dev/null || { echo "cluster.sh: needs $t" >&2; exit 3; }; done
  [[ $(id -u) -eq 0 ]] || { echo "cluster.sh: needs root (network namespaces)" >&2; exit 3; }
}

up() {
  local n="${1:?usage: cluster.sh up N}"
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "up: N must be 1..99, got '$n'"
  need_tools
  [[ -e "$STATE/count" ]] && die "cluster '$NAME' exists; run 'cluster.sh down' first (or set NDT_CLUSTER)"
  if ! ip netns add "$(ns br)" 2>/dev/null; then
    echo "cluster.sh: cannot create network namespaces here (ip netns add failed)" >&2
    exit 3
  fi
  mkdir -p "$STATE"
  echo "$n" >"$STATE/count"
  echo "${NDT_CLUSTER_OWNER:-$PPID}" >"$STATE/owner"
  ip -n "$(ns br)" link add br0 type bridge
  ip -n "$(ns br)" link set br0 up
  local hostsfile="127.0.0.1 localhost"$'\n'
  for ((i = 0; i < n; i++)); do hostsfile+="$(addr h$i) h$i"$'\n'; done
  for ((i = 0; i < n; i++)); do
    local h="h$i" nsh
    nsh="$(ns "$h")"
    ip netns add "$nsh"
    # ip netns exec bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: every host resolves the others
    mkdir -p "/etc/netns/$nsh"
    printf '%s' "$hostsfile" >"/etc/netns/$nsh/hosts"
    echo "$h" >"/etc/netns/$nsh/hostname"
    # a veth pair: "eth0" in the host, its peer on the bridge
    ip link add "${NAME}$i" type veth peer name "${NAME}b$i"
    ip link set "${NAME}$i" netns "$nsh"
    ip link set "${NAME}b$i" netns "$(ns br)"
    ip -n "$nsh" link set "${NAME}$i" name eth0
    ip -n "$nsh" addr add "$(addr "$h")/24" dev eth0
    ip -n "$nsh" link set eth0 up
    ip -n "$nsh" link set lo up
    # A host whose link is cut must be noticed in seconds, not in the 15 minutes of Linux's
    # default 15 TCP retransmissions: mpirun learns that a daemon is gone only when its TCP
    # connection fails (or its keepalive does), and until then holds the job (and the
    # allocation). 3 retries give up after about 3 s. NDT_CLUSTER_TCP_RETRIES=15 keeps
    # Linux's default, as on nodes nobody tuned (docs/parallel/multi-node.md).
    ip netns exec "$nsh" sysctl -q -w net.ipv4.tcp_retries2="${NDT_CLUSTER_TCP_RETRIES:-3}"
    ip -n "$(ns br)" link set "${NAME}b$i" master br0
    ip -n "$(ns br)" link set "${NAME}b$i" up
  done
  echo "cluster '$NAME': $n hosts h0..h$((n - 1)) at $(addr h0)..$(addr "h$((n - 1))")"
}

# Runs a command inside host $1, with that host's name.
run() {
  local h="${1:?usage: cluster.sh run HOST CMD...}"
  shift
  [[ -e "/run/netns/$(ns "$h")" ]] || die "no host $h in cluster '$NAME'"
  exec ip netns exec "$(ns "$h")" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$h" "$@"
}

# mpirun inside host 0, every host in the hostfile, its daemons started through the agent.
mpi() {
  local n
  n="$(hosts)"
  [[ "$n" -gt 0 ]] || die "no cluster '$NAME'; run 'cluster.sh up N' first"
  local hostlist=""
  for ((i = 0; i < n; i++)); do hostlist+="${hostlist:+,}h$i:64"; done
  NDT_CLUSTER="$NAME" run h0 mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --host "$hostlist" \
    --mca plm_rsh_agent "$AGENT" --mca plm_rsh_args "" \
    --mca btl tcp,vader,self --mca btl_vader_single_copy_mechanism none \
    --mca btl_tcp_if_include 198.18.0.0/24 --mca oob_tcp_if_include 198.18.0.0/24 \
    -x NDT_CLUSTER "$@"
}

rate() {
  local h="${1:?usage: cluster.sh rate HOST RATE|none}" r="${2:?usage: cluster.sh rate HOST RATE|none}"
  local i="${h#h}"
  tc -n "$(ns br)" qdisc del dev "${NAME}b$i" root 2>/dev/null || true
  ip netns exec "$(ns "$h")" tc qdisc del dev eth0 root 2>/dev/null || true
  [[ "$r" == none ]] && return 0
  # both directions of the host's link: its egress (eth0) and its ingress (the bridge port)
  ip netns exec "$(ns "$h")" tc qdisc add dev eth0 root tbf rate "$r" burst 64kb latency 50ms
  tc -n "$(ns br)" qdisc add dev "${NAME}b$i" root tbf rate "$r" burst 64kb latency 50ms
}

cut() { ip -n "$(ns br)" link set "${NAME}b${1#h}" down; }
heal() { ip -n "$(ns br)" link set "${NAME}b${1#h}" up; }

down() {
  local n
  n="$(hosts)"
  for ((i = 0; i < n; i++)); do
    local nsh
    nsh="$(ns "h$i")"
    if [[ -e "/run/netns/$nsh" ]]; then
      # every process started inside the host (ranks, daemons, shells), then the namespace
      for _ in 1 2 3; do
        pids="$(ip netns pids "$nsh" 2>/dev/null || true)"
        [[ -z "$pids" ]] && break
        kill -9 $pids 2>/dev/null || true
        sleep 0.2
      done
      ip netns del "$nsh" 2>/dev/null || true
    fi
    rm -rf "/etc/netns/$nsh"
  done
  ip netns del "$(ns br)" 2>/dev/null || true
  rm -rf "$STATE"
}

# Removes the clusters whose owner process is gone.
sweep() {
  for d in "$ROOT_STATE"/*/; do
    [[ -d "$d" ]] || continue
    local owner
    owner="$(cat "$d/owner" 2>/dev/null || echo 0)"
    if [[ "$owner" -gt 0 ]] && kill -0 "$owner" 2>/dev/null; then continue; fi
    NDT_CLUSTER="$(basename "$d")" "${BASH_SOURCE[0]}" down
  done
}

cmd="${1:-}"
shift || true
case "$cmd" in
  up) up "$@" ;;
  run) run "$@" ;;
  mpirun) mpi "$@" ;;
  rate) rate "$@" ;;
  cut) cut "$@" ;;
  heal) heal "$@" ;;
  down) down ;;
  sweep) sweep ;;
  *) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
