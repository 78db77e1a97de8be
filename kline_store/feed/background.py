"""Deprecated: background threads moved to :mod:`kline_store.system.background` (every wing may use them). This old
import path gives the same objects (the tracked threads, the ``stopping`` event) and warns once."""

from __future__ import annotations

import warnings

from ..system.background import (JOIN_TIMEOUT, _owners, _stop_all, _threads, stop_before_exit,  # noqa: F401
                                 stopping, track)

warnings.warn("kline_store.feed.background moved to kline_store.system.background", DeprecationWarning,
              stacklevel=2)
