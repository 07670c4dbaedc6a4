# lib.sh — shared by setup.sh, shape.sh and teardown.sh (sourced, not run).
#
# Topology: peer namespaces ${PREFIX}A.. and a router namespace ${PREFIX}r. Peer i (1-based)
# owns the /30 10.201.0.(4i): router side .4i+1 (dev r<L>), peer side .4i+2 (dev v<L>); a peer's
# only route is 10.201.0.0/24 via its router address. Nothing outside these namespaces is
# addressed. Shaping: RATE per direction by tbf on both ends of each veth; one-way DELAY between
# peers by the NFQUEUE delay line (nfq_delay.c) in the router's FORWARD chain; LOSS % per
# direction by an iptables `statistic` DROP there. The delay sits in the router so the sender's
# own qdisc never holds it (TCP Small Queues would throttle the sender).
set -euo pipefail

SUBNET=10.201.0
LETTERS=(A B C D E F G H I J K L M N O P Q R S T U V W X Y Z)
HERE="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/gradfed-ipfs/wan"
NFQ_BIN="$CACHE/nfq_delay"
RUN_DIR="${WAN_RUN_DIR:-${TMPDIR:-/tmp}/gradfed-wan-run}"

die() { echo "wan: $*" >&2; exit 1; }
usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
peer_ip() { echo "$SUBNET.$((4 * $1 + 2))"; }
router_ip() { echo "$SUBNET.$((4 * $1 + 1))"; }
nsx() { local ns="$1"; shift; ip netns exec "$ns" "$@"; }

need() {
    [[ $EUID -eq 0 ]] || die "must run as root (network namespaces)"
    local tool
    for tool in "$@"; do command -v "$tool" >/dev/null || die "$tool not found"; done
}

build_nfq() {  # compile the delay line into the cache (never committed as a binary)
    if [[ ! -x "$NFQ_BIN" || "$HERE/nfq_delay.c" -nt "$NFQ_BIN" ]]; then
        mkdir -p "$CACHE"
        gcc -O2 -Wall -o "$NFQ_BIN.tmp" "$HERE/nfq_delay.c" && mv "$NFQ_BIN.tmp" "$NFQ_BIN"
    fi
}

# shape_rate NS L ROUTER RATE DELAY_MS : tbf both ways, buffer max(100 packets, one BDP)
shape_rate() {
    local ns="$1" l="$2" router="$3" rate="$4" delay="$5" bps limit
    if [[ "$rate" == none ]]; then
        nsx "$ns" tc qdisc del dev "v$l" root 2>/dev/null || true
        nsx "$router" tc qdisc del dev "r$l" root 2>/dev/null || true
        return 0
    fi
    [[ "${rate,,}" =~ ^[0-9.]+[kmg]?bit$ ]] || die "bad rate $rate (e.g. 100mbit)"
    bps=$(numfmt --from=si "$(tr '[:lower:]' '[:upper:]' <<<"${rate%bit}")")
    limit=$((bps / 8 * 2 * delay / 1000))
    ((limit < 100 * 1514)) && limit=$((100 * 1514))
    nsx "$ns" tc qdisc replace dev "v$l" root tbf rate "$rate" burst 32kb limit "$limit"
    nsx "$router" tc qdisc replace dev "r$l" root tbf rate "$rate" burst 32kb limit "$limit"
}

# start_delay ROUTER DELAY_MS QNUM -> PID of a delay line bound to QNUM (ready when it says so)
start_delay() {
    local router="$1" delay="$2" q="$3" log="$RUN_DIR/nfq_delay.$3.log" pid
    : >"$log"
    setsid ip netns exec "$router" chrt -f 50 "$NFQ_BIN" -q "$q" -d "$((delay * 1000))" \
        </dev/null >>"$log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do
        grep -q "queue $q," "$log" && { echo "$pid"; return 0; }
        [[ -e /proc/$pid ]] || break
        sleep 0.1
    done
    cat "$log" >&2
    die "delay line did not start"
}

# set_chain ROUTER LOSS_PCT QNUM|"" : atomically replace the router's WAN chain
set_chain() {
    local router="$1" loss="$2" q="$3" rules=$'*filter\n:WAN - [0:0]\n'
    nsx "$router" iptables -N WAN 2>/dev/null || true
    nsx "$router" iptables -C FORWARD -j WAN 2>/dev/null || nsx "$router" iptables -A FORWARD -j WAN
    if awk -v l="$loss" 'BEGIN { exit !(l > 0) }'; then
        rules+="-A WAN -m statistic --mode random --probability $(awk -v l="$loss" 'BEGIN { printf "%.6f", l / 100 }') -j DROP"$'\n'
    fi
    [[ -n "$q" ]] && rules+="-A WAN -j NFQUEUE --queue-num $q"$'\n'
    nsx "$router" iptables-restore --noflush <<<"${rules}COMMIT"$'\n'
}

# stop_pid PID EXE : SIGTERM (SIGKILL after 10 s) PID, only while it still runs EXE
stop_pid() {
    local pid="$1" exe="$2"
    [[ -n "$pid" && -e /proc/$pid ]] || return 0
    [[ "$(readlink -f /proc/"$pid"/exe 2>/dev/null)" == "$(readlink -f "$exe")" ]] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do
        [[ -e /proc/$pid && "$(awk '{print $3}' /proc/"$pid"/stat 2>/dev/null)" != Z ]] || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}
