# Shared by scripts/demo and scripts/test: make .venv with the project installed.
# Sourced, not run. Honours PYTHON (default: python3) and VENV (default: .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$ROOT/.venv}"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: trio_coord needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setting up $VENV ..." >&2
    "$PYTHON" -m venv "$VENV"
fi
# Re-install only when the project's metadata changed since the last set-up.
stamp="$VENV/.trio-coord-installed-$1"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT$2"
    touch "$stamp"
fi
