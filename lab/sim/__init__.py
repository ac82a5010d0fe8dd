"""Trace-driven cache simulators (whole-content LRU, the block-level prefix cache), policies."""
