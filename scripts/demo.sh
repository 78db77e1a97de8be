#!/usr/bin/env bash
# The main job on the bundled sample data: install (if needed), ingest, show the store, train a small model
# from a shuffled loader and print the starvation meter; compute Qlib's Alpha158 features beside it.
source "$(dirname "$0")/_env.sh"
STORE="${1:-$ROOT/demo_store}"
kline-store ingest sample_data/us_yahoo_daily -o "$STORE" --replace
kline-store info "$STORE"
kline-store verify "$STORE"
kline-store features "$STORE" -o "${STORE}_alpha158" --set alpha158 --replace      # Qlib's Alpha158 + LABEL0
if [ -f scripts/train.py ]; then
  "$PY" scripts/train.py "$STORE" "${@:2}"
fi
