"""The pure core: events, conversations, rolling statistics, ingest, forecast, priority table.

Nothing here performs I/O or imports outside ``kvcast.stats`` (``tests/test_architecture.py``
checks it); every module is deterministic.
"""
