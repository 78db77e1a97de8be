"""What a sample is: date ranges, the sample spec, the valid-window index, transforms, the gather of a batch
from the memmap, KlineDataset, CrossSectionDataset and leakage-safe splits.

May import: kline_store.errors, kline_store.progress, kline_store.memory, kline_store.system, kline_store.store,
kline_store.features, and from kline_store.feed only what offering a loader needs (loader, options, source,
collate, shm: a dataset hands itself to the loader).
"""
