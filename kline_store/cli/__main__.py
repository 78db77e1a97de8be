"""`python -m kline_store.cli`: the same command as `kline-store`."""

from .main import main

main()
