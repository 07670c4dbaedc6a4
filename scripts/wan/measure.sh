#!/usr/bin/env bash
# measure.sh — measure gradfed_ipfs on the network setup.sh built (root): raw TCP, bitswap fetch
# and N-process rounds, one JSON line of results; or the whole matrix (setup/shape/teardown).
#
#   scripts/wan/measure.sh [link|fetch|round|all|sweep] [--d N] [--round-d N] [--reps R]
#                          [--rounds R] [--concurrency C] [--timeout S]
#   Runs benchmarks/bench_wan.py (its docstring has the measured table) with the project's
#   virtualenv python (or $PYTHON).

ROOT="$(dirname "$(readlink -f "$0")")/../.."
case "${1:-}" in -h|--help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"
cd "$ROOT" && exec "$PYTHON" -m benchmarks.bench_wan "${@:-all}"
