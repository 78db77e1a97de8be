# Sourced by test.sh: a small separate virtualenv with pyqlib for the Qlib interoperability tests
# (tests/ingest/test_qlib_store.py runs Qlib in it as a subprocess; .venv-qlib is ignored by git).
# pyqlib is installed without its dependencies (its full set, mlflow, jupyter, lightgbm, cvxpy ..., is 2.2 GB);
# only what qlib.init, D.features and Qlib's storage classes import comes with it (about 470 MB, 1 minute).
# A failed build is not retried on every run (offline machines): the Qlib tests skip naming its log;
# `rm -rf .venv-qlib` (or KLINE_QLIB_RETRY=1) tries again. KLINE_NO_QLIB=1 skips the build altogether.
QLIB_VENV="${KLINE_QLIB_VENV:-$ROOT/.venv-qlib}"
QLIB_PKGS="numpy pandas scipy joblib filelock dill redis python-redis-lock pydantic-settings ruamel.yaml mlflow-skinny
           fire loguru tqdm"   # the last three: what a copy of Qlib's scripts/dump_bin.py imports besides
QLIB_WANT="pyqlib==0.9.7 $QLIB_PKGS"
build_qlib_venv() {
  rm -rf "$QLIB_VENV"
  mkdir -p "$QLIB_VENV"
  local log="$QLIB_VENV/install.log"
  # shellcheck disable=SC2086
  if { python3 -m venv "$QLIB_VENV" &&
       "$QLIB_VENV/bin/python" -m pip install -q --disable-pip-version-check $QLIB_PKGS &&
       "$QLIB_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps pyqlib==0.9.7 &&
       "$QLIB_VENV/bin/python" -c "import qlib.data, qlib.data.storage.file_storage"; } >"$log" 2>&1; then
    echo "$QLIB_WANT" > "$QLIB_VENV/.kline-store-qlib"
  else
    echo "$QLIB_WANT" > "$QLIB_VENV/FAILED"
    echo "could not build $QLIB_VENV: the Qlib tests will skip (log: $QLIB_VENV/install.log)" >&2
  fi
}
if [ -z "${KLINE_NO_QLIB:-}" ]; then
  if [ "$(cat "$QLIB_VENV/.kline-store-qlib" 2>/dev/null)" != "$QLIB_WANT" ] &&
     { [ "$(cat "$QLIB_VENV/FAILED" 2>/dev/null)" != "$QLIB_WANT" ] || [ -n "${KLINE_QLIB_RETRY:-}" ]; }; then
    echo "building $QLIB_VENV for the Qlib tests (about a minute; log: $QLIB_VENV/install.log)" >&2
    build_qlib_venv
  fi
fi
export KLINE_QLIB_PYTHON="${KLINE_QLIB_PYTHON:-$QLIB_VENV/bin/python}"
