"""Benchmarks and validation studies behind ``kvcast bench`` (figures measured, never assumed)."""
