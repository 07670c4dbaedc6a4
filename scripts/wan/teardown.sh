#!/usr/bin/env bash
# teardown.sh — undo setup.sh (root): stop its daemons and delay line by PID (only while each PID
# still runs the recorded binary), stop any other process left inside its namespaces by PID,
# delete its namespaces (veths, qdiscs and rules go with them) and its Kubo repos.
#
#   scripts/wan/teardown.sh [--keep]    # --keep: keep RUN_DIR/<ns> (repos and daemon logs)

source "$(dirname "$(readlink -f "$0")")/lib.sh"
KEEP=0
case "${1:-}" in --keep) KEEP=1 ;; -h|--help) usage ;; "") ;; *) die "unknown argument $1" ;; esac
need ip
[[ -e "$RUN_DIR/state.env" ]] || die "no $RUN_DIR/state.env: nothing to tear down"
source "$RUN_DIR/state.env"
for ns in $NAMESPACES; do var="PID_$ns"; stop_pid "${!var:-}" "$KUBO"; done
stop_pid "${NFQ_PID:-}" "$NFQ_BIN"
for ns in $NAMESPACES $ROUTER; do
    ip netns list | awk '{print $1}' | grep -qx "$ns" || continue
    for pid in $(ip netns pids "$ns"); do
        echo "wan: stopping leftover pid $pid in $ns"
        stop_pid "$pid" "$(readlink -f /proc/"$pid"/exe 2>/dev/null || true)"
    done
    ip netns del "$ns"
done
((KEEP)) || for ns in $NAMESPACES; do rm -rf "${RUN_DIR:?}/$ns"; done
rm -f "$RUN_DIR/state.env"
echo "wan: torn down"
