"""Pure computation: events, conversations, rolling statistics, forecast, simulators.

Nothing here performs network or file I/O; every module is deterministic.
"""
