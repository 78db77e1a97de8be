"""Qlib expressions evaluated vectorised in torch over a [symbols, bars] panel (see evaluate.py)."""
