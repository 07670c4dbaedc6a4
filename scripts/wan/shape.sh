#!/usr/bin/env bash
# shape.sh — change the delay, rate or loss of a running setup.sh network in place (root).
#
#   scripts/wan/shape.sh [-d DELAY_MS] [-r RATE|none] [-l LOSS_PCT]
#   Unspecified values keep the current ones. Daemons and connections stay up. A new delay line
#   starts on the other queue number and the router's chain switches to it atomically before the
#   old line is stopped (it releases what it holds): the switch drops no packet.

source "$(dirname "$(readlink -f "$0")")/lib.sh"
need ip tc iptables iptables-restore numfmt
[[ -e "$RUN_DIR/state.env" ]] || die "no $RUN_DIR/state.env: run setup.sh first"
source "$RUN_DIR/state.env"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -d) DELAY_MS="$2"; shift 2 ;; -r) RATE="$2"; shift 2 ;; -l) LOSS_PCT="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ "$DELAY_MS" =~ ^[0-9]+$ ]] || die "DELAY_MS must be whole milliseconds"
[[ "$LOSS_PCT" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "LOSS_PCT must be a number"
i=0
for ns in $NAMESPACES; do
    i=$((i + 1)); shape_rate "$ns" "${LETTERS[i - 1]}" "$ROUTER" "$RATE" "$DELAY_MS"
done
OLD="$NFQ_PID"; NFQ_PID=""; Q=""
if ((DELAY_MS > 0)); then Q=$(( ${NFQ_Q:-1} == 0 ? 1 : 0 )); NFQ_PID=$(start_delay "$ROUTER" "$DELAY_MS" "$Q"); fi
set_chain "$ROUTER" "$LOSS_PCT" "$Q"
stop_pid "$OLD" "$NFQ_BIN"
sed -i -e "s/^DELAY_MS=.*/DELAY_MS=$DELAY_MS/" -e "s/^RATE=.*/RATE=$RATE/" \
    -e "s/^LOSS_PCT=.*/LOSS_PCT=$LOSS_PCT/" -e "s/^NFQ_PID=.*/NFQ_PID=$NFQ_PID/" \
    -e "s/^NFQ_Q=.*/NFQ_Q=$Q/" "$RUN_DIR/state.env"
echo "wan: RTT $((2 * DELAY_MS)) ms, $RATE, loss $LOSS_PCT %"
