"""The `kline-store` command: parses arguments, calls the library, prints; no logic lives here.

May import every wing. `kline_store.cli:main` is the console entry point; `python -m kline_store.cli` runs it too.
"""

from .main import main

__all__ = ["main"]
