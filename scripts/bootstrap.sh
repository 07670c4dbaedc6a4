# Sourced by scripts/demo and scripts/test: make a fresh machine ready, idempotently.
#   - a virtualenv in .venv with this package and its extras installed (editable);
#   - the pinned Kubo binary, built once from the Go module proxy by scripts/install-kubo.
# Exports GRADFED_KUBO_BIN and puts .venv/bin first on PATH.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${GRADFED_EXTRAS:-test}"
PYTHON="${PYTHON:-python3}"

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bootstrap: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
# Reinstall only when pyproject.toml changed since the last successful install.
stamp="$VENV/.gradfed-installed-$EXTRAS"
if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" ]]; then
    echo "bootstrap: installing gradfed-ipfs[$EXTRAS] into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]" >&2
    touch "$stamp"
fi

GRADFED_KUBO_BIN="$("$ROOT/scripts/install-kubo")"
export GRADFED_KUBO_BIN
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
