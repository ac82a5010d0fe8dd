"""Validation of the forecast and sweeps of the eviction policies, with their plots."""
