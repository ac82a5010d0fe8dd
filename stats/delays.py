"""Inter-turn delay distributions F for the mean-field forecast (times in seconds).

Each distribution gives ``cdf(T) = F(T)``, ``tail_integral(T) = int_0^T (1 - F(u)) du``
(= E[min(W, T)]) and ``ppf(p)`` (smallest T with F(T) >= p), vectorised over numpy arrays.
``parse_delay_law`` turns ``exp:MEAN_S`` / ``lognormal:MU,SIGMA`` into one (``kvcast.cli.delays``
also reads a file of delays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr, ndtri


@runtime_checkable
class DelayDistribution(Protocol):
    """A distribution of inter-turn delays W >= 0 (seconds)."""

    def cdf(self, t: ArrayLike) -> NDArray[np.float64]: ...

    def tail_integral(self, t: ArrayLike) -> NDArray[np.float64]: ...

    def ppf(self, p: ArrayLike) -> NDArray[np.float64]: ...

    @property
    def mean(self) -> float: ...

    def describe(self) -> str: ...


def _arr(t: ArrayLike) -> NDArray[np.float64]:
    return np.asarray(t, dtype=np.float64)


@dataclass(frozen=True)
class Exponential:
    """Exponential delays with mean ``mean_s`` seconds."""

    mean_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_s) and self.mean_s > 0):
            raise ValueError(
                f"exponential mean must be a positive number of seconds, got {self.mean_s}"
            )

    def cdf(self, t: ArrayLike) -> NDArray[np.float64]:
        t = np.maximum(_arr(t), 0.0)
        return -np.expm1(-t / self.mean_s)

    def tail_integral(self, t: ArrayLike) -> NDArray[np.float64]:
        t = np.maximum(_arr(t), 0.0)
        return self.mean_s * -np.expm1(-t / self.mean_s)

    def ppf(self, p: ArrayLike) -> NDArray[np.float64]:
        return -self.mean_s * np.log1p(-np.clip(_arr(p), 0.0, 1.0))

    def pdf(self, t: ArrayLike) -> NDArray[np.float64]:
        """Density (1/s) on t > 0; 0 elsewhere."""
        t = _arr(t)
        return np.where(t > 0, np.exp(-np.maximum(t, 0.0) / self.mean_s) / self.mean_s, 0.0)

    @property
    def mean(self) -> float:
        return self.mean_s

    @property
    def median(self) -> float:
        """Median delay, seconds."""
        return self.mean_s * math.log(2.0)

    def describe(self) -> str:
        return f"exp:{self.mean_s:g}"


@dataclass(frozen=True)
class LogNormal:
    """Log-normal delays: log W ~ Normal(mu, sigma^2), W in seconds."""

    mu: float
    sigma: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise ValueError(f"lognormal mu must be a finite number (log seconds), got {self.mu}")
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"lognormal sigma must be a positive number, got {self.sigma}")

    def _z(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        with np.errstate(divide="ignore"):
            return (np.log(np.maximum(t, 0.0)) - self.mu) / self.sigma

    def cdf(self, t: ArrayLike) -> NDArray[np.float64]:
        return ndtr(self._z(_arr(t)))

    def tail_integral(self, t: ArrayLike) -> NDArray[np.float64]:
        t = np.maximum(_arr(t), 0.0)
        z = self._z(t)
        # E[min(W, T)] = T P(W > T) + E[W; W <= T]; ndtr(-z) keeps precision in the far tail.
        return t * ndtr(-z) + self.mean * ndtr(z - self.sigma)

    def ppf(self, p: ArrayLike) -> NDArray[np.float64]:
        return np.exp(self.mu + self.sigma * ndtri(np.clip(_arr(p), 0.0, 1.0)))

    def pdf(self, t: ArrayLike) -> NDArray[np.float64]:
        """Density (1/s) on t > 0; 0 elsewhere."""
        t = _arr(t)
        z = self._z(t)
        with np.errstate(divide="ignore", invalid="ignore"):
            dens = np.exp(-0.5 * z * z) / (t * self.sigma * math.sqrt(2.0 * math.pi))
        return np.where(t > 0, dens, 0.0)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + 0.5 * self.sigma**2)

    @property
    def median(self) -> float:
        """Median delay, seconds."""
        return math.exp(self.mu)

    def describe(self) -> str:
        return f"lognormal:{self.mu:g},{self.sigma:g}"


class Empirical:
    """Empirical distribution of observed delays (seconds); F(T) = #{W_k <= T} / n."""

    def __init__(self, samples: ArrayLike) -> None:
        w = np.sort(_arr(samples).ravel())
        if w.size == 0:
            raise ValueError("empirical delay distribution needs at least one sample")
        if not np.all(np.isfinite(w)) or w[0] < 0:
            raise ValueError("delays must be finite and non-negative seconds")
        self.samples: NDArray[np.float64] = w
        self._csum = np.concatenate(([0.0], np.cumsum(w)))

    @property
    def n(self) -> int:
        return int(self.samples.size)

    def cdf(self, t: ArrayLike) -> NDArray[np.float64]:
        return np.searchsorted(self.samples, _arr(t), side="right") / self.n

    def tail_integral(self, t: ArrayLike) -> NDArray[np.float64]:
        t = np.maximum(_arr(t), 0.0)
        k = np.searchsorted(self.samples, t, side="right")
        return (self._csum[k] + t * (self.n - k)) / self.n

    def ppf(self, p: ArrayLike) -> NDArray[np.float64]:
        k = np.ceil(np.clip(_arr(p), 0.0, 1.0) * self.n).astype(np.int64)
        return self.samples[np.clip(k - 1, 0, self.n - 1)]

    @property
    def mean(self) -> float:
        return float(self._csum[-1] / self.n)

    def describe(self) -> str:
        return f"empirical({self.n} samples, mean {self.mean:.4g} s)"


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"delay spec {spec!r}: {what} {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"delay spec {spec!r}: {what} must be finite, got {text.strip()!r}")
    return value


def parse_delays_text(text: str, source: str = "<text>") -> Empirical:
    """Delays (seconds) separated by whitespace, commas or newlines; ``#`` starts a comment."""
    values: list[float] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for token in line.split("#", 1)[0].replace(",", " ").split():
            try:
                value = float(token)
            except ValueError:
                raise ValueError(
                    f"{source}:{lineno}: {token!r} is not a delay in seconds"
                ) from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{source}:{lineno}: delay {token!r} must be finite and >= 0")
            values.append(value)
    if not values:
        raise ValueError(f"{source}: no delays found")
    return Empirical(values)


def parse_delay_law(spec: str) -> DelayDistribution | None:
    """``exp:MEAN_S`` | ``lognormal:MU,SIGMA`` -> a distribution; None for anything else.

    Raises ValueError naming what was wrong in a spec of either form. A file of delays is read
    by the caller (``kvcast.cli.delays``) and parsed with :func:`parse_delays_text`.
    """
    text = spec.strip()
    kind, sep, args = text.partition(":")
    kind = kind.strip().lower()
    if sep and kind in ("exp", "exponential"):
        mean = _number(args, "mean", spec)
        if mean <= 0:
            raise ValueError(f"delay spec {spec!r}: exponential mean must be > 0 seconds")
        return Exponential(mean)
    if sep and kind in ("lognormal", "lognorm", "ln"):
        parts = args.split(",")
        if len(parts) != 2:
            raise ValueError(f"delay spec {spec!r}: lognormal needs MU,SIGMA (two numbers)")
        mu = _number(parts[0], "mu", spec)
        sigma = _number(parts[1], "sigma", spec)
        if sigma <= 0:
            raise ValueError(f"delay spec {spec!r}: lognormal sigma must be > 0")
        return LogNormal(mu, sigma)
    return None
