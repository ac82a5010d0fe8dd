"""Pure computation: events, conversations, rolling statistics, forecast, simulators.

Nothing here performs network I/O (a delay file named by the user is the only file read); every
module is deterministic.
"""
