"""Eviction adapters that plug the IAC priority into inference engines' prefix caches."""

from kvcast.exporters.adapters.sglang import IACStrategy, tag_path
from kvcast.exporters.adapters.vllm import BlockTag, IACFreeBlockQueue

__all__ = ["BlockTag", "IACFreeBlockQueue", "IACStrategy", "tag_path"]
