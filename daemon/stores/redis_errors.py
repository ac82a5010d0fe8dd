"""Which Redis errors the daemon retries, and how they are reported without their arguments.

Shared by every Redis layout (one server, Sentinel's master, a cluster).
"""

from __future__ import annotations

import re

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvcast.daemon.stores.base import StoreUnavailable

CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
# Errors after which the store is retried with backoff instead of stopping the daemon: lost
# connections, and a server that refuses the command (OOM at maxmemory with noeviction,
# READONLY on a replica after a failover, LOADING, BUSY, MASTERDOWN, ...). A refused MULTI/EXEC
# applies nothing, so retrying the whole commit later is exact.
STORE_ERRORS = (*CONNECTION_ERRORS, ResponseError)
# redis-py prefixes a pipeline's error with the failing command and its arguments (session
# ids among them), and an unknown command's error quotes its arguments: neither may reach logs.
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*\) of pipeline caused error: ", re.S)
_ARGS_SUFFIX = re.compile(r",? with args beginning with:.*$", re.S)


def unavailable(exc: Exception) -> StoreUnavailable:
    """A store error as :class:`StoreUnavailable`, its message free of command arguments."""
    if not isinstance(exc, ResponseError):
        return StoreUnavailable(f"redis: {exc}")
    text = _ARGS_SUFFIX.sub("", _PIPELINE_PREFIX.sub("", str(exc)))
    return StoreUnavailable(f"redis refused the command: {type(exc).__name__}: {text}")
