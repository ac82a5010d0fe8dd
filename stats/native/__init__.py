"""The replay engine in C (``_replay.c``), specified against ``kvcast.stats.ingest``."""
