#!/usr/bin/env bash
# setup.sh — N Kubo peers in network namespaces behind an emulated wide-area link (root).
#
#   scripts/wan/setup.sh [-n N] [-d DELAY_MS] [-r RATE|none] [-l LOSS_PCT] [-t tcp|quic]
#                        [-c CC] [-K KEY=JSON]... [-p PREFIX] [--no-kubo]
#   defaults: N=3, one-way DELAY_MS=0 (RTT = 2 x DELAY), RATE=100mbit per direction, LOSS=0 %
#   per direction, transport tcp (the swarm listens and peers connect on TCP, or on QUIC-v1),
#   PREFIX=wan (namespaces wanA.., router wanr), RUN_DIR=$WAN_RUN_DIR or $TMPDIR/gradfed-wan-run.
#   CC: TCP congestion control in the peer namespaces, one of the host's
#   net.ipv4.tcp_allowed_congestion_control (default: the host's own, which new namespaces
#   inherit; the host's settings are never changed).
#   -K adds a Kubo config entry on every daemon, e.g.
#      -K Internal.Bitswap.MaxOutstandingBytesPerPeer=4194304
#
# Topology and shaping: see lib.sh. Each daemon: `init --profile=test` plus the project's
# LOOPBACK_CONFIG keys except the addresses (API 127.0.0.1:5001 inside its namespace, swarm on
# its veth address), then a full-mesh swarm/connect. Writes RUN_DIR/state.env for shape.sh,
# teardown.sh and benchmarks/bench_wan.py. Any failure tears down what was built (trap).
# Client in a peer namespace:  ip netns exec wanB python my.py  (Kubo at http://127.0.0.1:5001).

source "$(dirname "$(readlink -f "$0")")/lib.sh"
N=3; DELAY=0; RATE=100mbit; LOSS=0; TRANSPORT=tcp; PREFIX=wan; WITH_KUBO=1; EXTRA=()
CC="$(cat /proc/sys/net/ipv4/tcp_congestion_control)"
KUBO="${GRADFED_KUBO_BIN:-$HOME/.cache/gradfed-ipfs/kubo/v0.43.1/ipfs}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n) N="$2"; shift 2 ;; -d) DELAY="$2"; shift 2 ;; -r) RATE="$2"; shift 2 ;;
        -l) LOSS="$2"; shift 2 ;; -t) TRANSPORT="$2"; shift 2 ;; -p) PREFIX="$2"; shift 2 ;; -c) CC="$2"; shift 2 ;;
        -K) [[ "$2" == *=* ]] || die "-K wants KEY=JSON"; EXTRA+=("$2"); shift 2 ;;
        --no-kubo) WITH_KUBO=0; shift ;;
        -h|--help) usage ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
need ip tc iptables iptables-restore gcc curl jq chrt numfmt
[[ "$N" =~ ^[0-9]+$ ]] && ((N >= 1 && N <= 26)) || die "N must be 1..26"
[[ "$DELAY" =~ ^[0-9]+$ ]] || die "DELAY_MS must be whole milliseconds"
[[ "$LOSS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "LOSS_PCT must be a number"
[[ "$TRANSPORT" == tcp || "$TRANSPORT" == quic ]] || die "transport must be tcp or quic"
grep -qw -- "$CC" /proc/sys/net/ipv4/tcp_allowed_congestion_control \
    || die "congestion control $CC is not in the host's allowed list ($(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control))"
((WITH_KUBO)) && { [[ -x "$KUBO" ]] || die "no Kubo binary at $KUBO (GRADFED_KUBO_BIN)"; }
[[ -e "$RUN_DIR/state.env" ]] && die "$RUN_DIR/state.env exists: run teardown.sh first"
ROUTER="${PREFIX}r"; NS=()
for ((i = 1; i <= N; i++)); do NS+=("$PREFIX${LETTERS[i - 1]}"); done
for ns in "$ROUTER" "${NS[@]}"; do
    ip netns list | awk '{print $1}' | grep -qx "$ns" && die "namespace $ns exists already"
done
mkdir -p "$RUN_DIR"
build_nfq

declare -A PID PEER
NFQ_PID=""; NFQ_Q=""; DONE=0
undo() {
    ((DONE)) && return 0
    echo "wan: setup failed; tearing down" >&2
    for ns in "${NS[@]}"; do stop_pid "${PID[$ns]:-}" "$KUBO"; done
    stop_pid "$NFQ_PID" "$NFQ_BIN"
    for ns in "${NS[@]}" "$ROUTER"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap undo EXIT

ip netns add "$ROUTER"
ip -n "$ROUTER" link set lo up
nsx "$ROUTER" sysctl -qw net.ipv4.ip_forward=1
for ((i = 1; i <= N; i++)); do
    ns="${NS[i - 1]}"; l="${LETTERS[i - 1]}"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ROUTER" link add "r$l" gso_max_segs 1 type veth peer name "v$l" netns "$ns" gso_max_segs 1
    ip -n "$ROUTER" addr add "$(router_ip "$i")/30" dev "r$l"
    ip -n "$ns" addr add "$(peer_ip "$i")/30" dev "v$l"
    ip -n "$ROUTER" link set "r$l" up
    ip -n "$ns" link set "v$l" up
    ip -n "$ns" route add "$SUBNET.0/24" via "$(router_ip "$i")" dev "v$l"
    nsx "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$CC"
    shape_rate "$ns" "$l" "$ROUTER" "$RATE" "$DELAY"
done
if ((DELAY > 0)); then NFQ_Q=0; NFQ_PID=$(start_delay "$ROUTER" "$DELAY" 0); fi
set_chain "$ROUTER" "$LOSS" "$NFQ_Q"

swarm_addr() {  # swarm_addr I -> the multiaddr peer I listens on
    if [[ "$TRANSPORT" == quic ]]; then echo "/ip4/$(peer_ip "$1")/udp/4001/quic-v1"
    else echo "/ip4/$(peer_ip "$1")/tcp/4001"; fi
}
rpc() { nsx "$1" curl -sS --max-time 30 -X POST "http://127.0.0.1:5001/api/v0/$2${3:+?$3}"; }
if ((WITH_KUBO)); then
    for ((i = 1; i <= N; i++)); do
        ns="${NS[i - 1]}"; repo="$RUN_DIR/$ns/repo"
        rm -rf "${RUN_DIR:?}/$ns"; mkdir -p "$RUN_DIR/$ns"
        kenv=(env IPFS_PATH="$repo" IPFS_TELEMETRY=off GOLOG_LOG_LEVEL=error)
        nsx "$ns" "${kenv[@]}" "$KUBO" init --profile=test </dev/null >/dev/null
        cfg=("Addresses.API=\"/ip4/127.0.0.1/tcp/5001\"" "Addresses.Gateway=\"/ip4/127.0.0.1/tcp/8080\""
            "Addresses.Swarm=[\"$(swarm_addr "$i")\"]" "Addresses.Announce=[]" "Bootstrap=[]"
            "Routing.Type=\"none\"" "AutoConf.Enabled=false" "Discovery.MDNS.Enabled=false"
            "Pubsub.Enabled=true" "Swarm.DisableNatPortMap=true" "${EXTRA[@]+"${EXTRA[@]}"}")
        for kv in "${cfg[@]}"; do
            nsx "$ns" "${kenv[@]}" "$KUBO" config --json "${kv%%=*}" "${kv#*=}" </dev/null
        done
        # setsid -> ip -> env -> ipfs all exec: $! is the daemon's PID (checked below)
        setsid ip netns exec "$ns" "${kenv[@]}" "$KUBO" daemon --migrate=false \
            </dev/null >"$RUN_DIR/$ns/daemon.log" 2>&1 &
        PID[$ns]=$!
    done
    for ns in "${NS[@]}"; do
        for _ in $(seq 600); do
            body=$(rpc "$ns" id 2>/dev/null) && [[ "$(jq '.Addresses | length' <<<"$body")" -gt 0 ]] && break
            [[ -e /proc/${PID[$ns]} ]] || { tail "$RUN_DIR/$ns/daemon.log" >&2; die "daemon in $ns exited"; }
            sleep 0.1
        done
        PEER[$ns]=$(jq -r .ID <<<"$body")
        [[ "${PEER[$ns]}" == 12D3* ]] || die "daemon in $ns not ready after 60 s"
        [[ "$(readlink -f /proc/"${PID[$ns]}"/exe)" == "$(readlink -f "$KUBO")" ]] \
            || die "pid ${PID[$ns]} in $ns is not Kubo"
    done
    for ((i = 1; i <= N; i++)); do
        for ((j = i + 1; j <= N; j++)); do
            rpc "${NS[i - 1]}" swarm/connect "arg=$(swarm_addr "$j")/p2p/${PEER[${NS[j - 1]}]}" >/dev/null
        done
    done
fi

{
    echo "PREFIX=$PREFIX"; echo "ROUTER=$ROUTER"; echo "NAMESPACES=\"${NS[*]}\""; echo "N=$N"
    echo "DELAY_MS=$DELAY"; echo "RATE=$RATE"; echo "LOSS_PCT=$LOSS"; echo "TRANSPORT=$TRANSPORT"; echo "CC=$CC"
    echo "NFQ_PID=$NFQ_PID"; echo "NFQ_Q=$NFQ_Q"; echo "NFQ_BIN=$NFQ_BIN"; echo "KUBO=$KUBO"
    echo "KUBO_CONFIG=\"${EXTRA[*]+"${EXTRA[*]//\"/\'}"}\""
    for ((i = 1; i <= N; i++)); do
        ns="${NS[i - 1]}"
        echo "PID_$ns=${PID[$ns]:-}"; echo "PEER_$ns=${PEER[$ns]:-}"; echo "IP_$ns=$(peer_ip "$i")"
    done
} >"$RUN_DIR/state.env"
DONE=1; trap - EXIT
echo "wan: $N peers (${NS[*]}), RTT $((2 * DELAY)) ms, $RATE, loss $LOSS %, $TRANSPORT, $CC" \
    "${EXTRA[*]+kubo ${EXTRA[*]}}; state in $RUN_DIR/state.env"
