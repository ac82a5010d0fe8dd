"""Eviction adapters that plug the IAC priority into inference engines' prefix caches."""

from kvcast.exporters.kit.adapters.sglang import IACStrategy
from kvcast.exporters.kit.adapters.vllm import IACFreeBlockQueue

__all__ = ["IACFreeBlockQueue", "IACStrategy"]
