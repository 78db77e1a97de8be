#!/usr/bin/env bash
# Install (if needed) and run the test suite. Extra arguments go to pytest; without a test path among them the
# whole suite (tests/) runs.
source "$(dirname "$0")/_env.sh"
source "$(dirname "$0")/_qlib_env.sh"
source "$(dirname "$0")/_kunquant_env.sh"
PATHS=(tests)
for arg in "$@"; do [[ "$arg" != -* && -e "$arg" ]] && PATHS=(); done
exec "$PY" -m pytest -q -p no:cacheprovider "$@" "${PATHS[@]}"
