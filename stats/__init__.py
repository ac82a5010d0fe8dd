"""Pure computation: event contract, conversation tracking, rolling statistics, forecast, simulators.

Nothing here performs network or file I/O; every module is deterministic.
"""
