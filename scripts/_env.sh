# Sourced by demo.sh and test.sh: create the virtualenv if missing and install the project into it.
# Needs only python3. Installs torch==2.13.0 first (a CPU build from local disk on our machines; on yours
# pip picks the default build for your platform, or set KLINE_TORCH, e.g.
#   KLINE_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"  for a CUDA 12.6 build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${KLINE_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV" >&2
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.kline-store-installed"
WANT="$(cat pyproject.toml scripts/_env.sh | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "installing kline-store and its dependencies into $VENV (log: $VENV/install.log)" >&2
  LOG="$VENV/install.log"
  : > "$LOG"
  pipq() { "$PY" -m pip install -q --disable-pip-version-check "$@" >>"$LOG" 2>&1 || { tail -20 "$LOG" >&2; echo "install failed: see $LOG" >&2; exit 1; }; }
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip >>"$LOG" 2>&1 || true
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    pipq ${KLINE_TORCH:-torch==2.13.0}
  fi
  pipq -e ".[test,plot]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
