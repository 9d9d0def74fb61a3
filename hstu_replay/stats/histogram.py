"""A log-linear latency histogram (HdrHistogram-style) that merges by adding counts.

Values are recorded in integer microseconds. Below 2048 us every value has its own bucket;
above, each power of two is split into 1024 buckets, so any percentile is reported within
0.1% of the true value. Counts are a sparse dict of ints: they serialize to JSON and add up
across Locust workers.

A latency's microseconds are rounded from its milliseconds (seconds x 1e3, the figure the
per-request records hold as `latency_ms`), so the histogram rebuilt from records files
(`LatencyHistogram.of_ms`) is exactly the one recorded during the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

SUB_BUCKET_BITS = 10
_SUB = 1 << SUB_BUCKET_BITS  # 1024


def micros_of_ms(ms: float) -> int:
    """Whole microseconds of a latency in milliseconds (negative values count as 0)."""
    return max(int(round(ms * 1e3)), 0)


def micros(seconds: float) -> int:
    """Whole microseconds of a latency in seconds, rounded from its milliseconds (see above)."""
    return micros_of_ms(seconds * 1e3)


def nearest_rank(q: float, total: int) -> int:
    """The 1-based rank of the q-th percentile (0..100) of `total` values: ceil(q/100 x total),
    at least 1, computed on the decimal q as written (99.9% of 1000 is rank 999, not 1000)."""
    return max(1, math.ceil(Fraction(repr(float(q))) * total / 100))


def bucket_of(value_us: int) -> int:
    if value_us < 2 * _SUB:
        return max(value_us, 0)
    shift = value_us.bit_length() - SUB_BUCKET_BITS - 1
    return shift * _SUB + (value_us >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high) of a bucket, in microseconds."""
    if index < 2 * _SUB:
        return index, index + 1
    shift = index // _SUB - 1
    low = (index - shift * _SUB) << shift
    return low, low + (1 << shift)


@dataclass
class LatencyHistogram:
    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0
    sum_us: int = 0
    max_us: int = 0

    def record(self, seconds: float) -> None:
        self.record_us(micros(seconds))

    def record_us(self, us: int) -> None:
        b = bucket_of(us)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.total += 1
        self.sum_us += us
        self.max_us = max(self.max_us, us)

    def merge(self, other: LatencyHistogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.total += other.total
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)

    @property
    def mean_ms(self) -> float:
        return self.sum_us / self.total / 1e3 if self.total else math.nan

    def percentile_ms(self, q: float) -> float:
        """The q-th percentile (0..100), as the midpoint of its bucket (capped at the max)."""
        if not self.total:
            return math.nan
        return self.at_rank_ms(nearest_rank(q, self.total))

    def at_rank_ms(self, rank: int) -> float:
        """The rank-th smallest value (1-based), as the midpoint of its bucket (capped at the max)."""
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                low, high = bucket_bounds(b)
                mid = low if high - low == 1 else (low + high - 1) / 2
                return min(mid, self.max_us) / 1e3
        return self.max_us / 1e3

    def percentile_interval_ms(self, q: float, z: float = 1.96) -> tuple[float, float]:
        """A distribution-free confidence interval (95% at z=1.96) for the q-th percentile: the
        order statistics whose ranks bound the binomial count of samples below it. A bound whose
        rank falls outside the samples is NaN: there are too few to bound it on that side."""
        n, p = self.total, q / 100
        if not n:
            return math.nan, math.nan
        spread = z * math.sqrt(n * p * (1 - p))
        low, high = math.floor(n * p - spread), math.ceil(n * p + spread) + 1
        return (self.at_rank_ms(low) if low >= 1 else math.nan,
                self.at_rank_ms(high) if high <= n else math.nan)

    def to_dict(self) -> dict:
        return {"counts": {str(b): c for b, c in self.counts.items()}, "total": self.total,
                "sum_us": self.sum_us, "max_us": self.max_us}

    @classmethod
    def from_dict(cls, data: Mapping) -> LatencyHistogram:
        return cls({int(b): int(c) for b, c in data["counts"].items()}, int(data["total"]),
                   int(data["sum_us"]), int(data["max_us"]))

    @classmethod
    def of(cls, seconds: Iterable[float]) -> LatencyHistogram:
        h = cls()
        for s in seconds:
            h.record(s)
        return h

    @classmethod
    def of_ms(cls, milliseconds: Iterable[float]) -> LatencyHistogram:
        """The histogram of latencies given in milliseconds (e.g. records' `latency_ms`)."""
        h = cls()
        for ms in milliseconds:
            h.record_us(micros_of_ms(ms))
        return h
