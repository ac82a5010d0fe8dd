"""The replay engine's C extension (stats/native/_replay.c); everything else is in pyproject.toml.

Optional: where no C compiler is at hand the install still succeeds, and `kvcast replay` uses
the Python engine, which gives the same numbers (stats/native/replay.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvcast.stats.native._replay",
            sources=["stats/native/_replay.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
