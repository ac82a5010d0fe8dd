"""Eviction adapters that plug the IAC priority into inference engines' prefix caches."""

from kvcast.exporters.adapters.sglang import IACStrategy
from kvcast.exporters.adapters.vllm import IACFreeBlockQueue

__all__ = ["IACFreeBlockQueue", "IACStrategy"]
