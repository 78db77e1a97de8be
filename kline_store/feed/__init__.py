"""Getting samples to the device: the epoch order (sampling), batches and buffers, prefetch threads, worker
processes over a shared-memory ring, pinned and device placement, collate, and the loader that drives them.

May import: kline_store.errors, kline_store.progress, kline_store.memory, kline_store.system, kline_store.store.
It knows samples only through the typed protocols of feed/source.py (BatchSource, BlockOrderSource), so it never
imports kline_store.samples.
"""
