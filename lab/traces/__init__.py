"""Public trace formats converted into events of the SPEC section 2 contract."""

from kvcast.lab.traces.bailian import convert_bailian
from kvcast.lab.traces.common import FORMATS, ConversionSummary, TraceError
from kvcast.lab.traces.mooncake import MATCH_MODES, convert_mooncake, recover_conversations
from kvcast.lab.traces.sharegpt import convert_sharegpt

__all__ = [
    "FORMATS",
    "MATCH_MODES",
    "ConversionSummary",
    "TraceError",
    "convert_bailian",
    "convert_mooncake",
    "convert_sharegpt",
    "recover_conversations",
]
