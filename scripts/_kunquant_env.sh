# Sourced by test.sh: a small separate virtualenv with KunQuant 0.1.12 (a compiled factor engine with its own
# Alpha158 and Alpha101) for the comparison tests and scripts/bench_features.py, which run it as a subprocess
# (scripts/kunquant_side.py). .venv-kunquant is ignored by git. KLINE_KUNQUANT_VENV points at an existing one.
# A failed build is not retried on every run (offline machines): the KunQuant tests skip naming its log;
# `rm -rf .venv-kunquant` (or KLINE_KUNQUANT_RETRY=1) tries again. KLINE_NO_KUNQUANT=1 skips the build.
KUNQUANT_VENV="${KLINE_KUNQUANT_VENV:-$ROOT/.venv-kunquant}"
KUNQUANT_WANT="KunQuant==0.1.12 numpy pandas"
build_kunquant_venv() {
  rm -rf "$KUNQUANT_VENV"
  mkdir -p "$KUNQUANT_VENV"
  local log="$KUNQUANT_VENV/install.log"
  # shellcheck disable=SC2086
  if { python3 -m venv "$KUNQUANT_VENV" &&
       "$KUNQUANT_VENV/bin/python" -m pip install -q --disable-pip-version-check $KUNQUANT_WANT &&
       "$KUNQUANT_VENV/bin/python" -c "import KunQuant.jit, KunQuant.predefined.Alpha158"; } >"$log" 2>&1; then
    echo "$KUNQUANT_WANT" > "$KUNQUANT_VENV/.kline-store-kunquant"
  else
    echo "$KUNQUANT_WANT" > "$KUNQUANT_VENV/FAILED"
    echo "could not build $KUNQUANT_VENV: the KunQuant tests will skip (log: $KUNQUANT_VENV/install.log)" >&2
  fi
}
if [ -z "${KLINE_NO_KUNQUANT:-}" ] && [ -z "${KLINE_KUNQUANT_VENV:-}" ]; then
  if [ "$(cat "$KUNQUANT_VENV/.kline-store-kunquant" 2>/dev/null)" != "$KUNQUANT_WANT" ] &&
     { [ "$(cat "$KUNQUANT_VENV/FAILED" 2>/dev/null)" != "$KUNQUANT_WANT" ] || [ -n "${KLINE_KUNQUANT_RETRY:-}" ]; }; then
    echo "building $KUNQUANT_VENV for the KunQuant tests (about a minute; log: $KUNQUANT_VENV/install.log)" >&2
    build_kunquant_venv
  fi
fi
export KLINE_KUNQUANT_PYTHON="${KLINE_KUNQUANT_PYTHON:-$KUNQUANT_VENV/bin/python}"
