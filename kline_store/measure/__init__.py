"""Measuring and tuning: timing helpers, the starvation meter, synthetic stores, the auto-tuner, the classic
DataLoader recipe and the loader benchmark (its rows, its rounds, its report).

May import every wing below it: errors, progress, store, ingest, feed, samples.
"""
