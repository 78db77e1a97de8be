#!/usr/bin/env bash
# Install (if needed) and run the whole test suite. Extra arguments go to pytest.
source "$(dirname "$0")/_env.sh"
source "$(dirname "$0")/_qlib_env.sh"
source "$(dirname "$0")/_kunquant_env.sh"
exec "$PY" -m pytest -q -p no:cacheprovider "$@" tests
