"""NVIDIA's published HSTU inference figures, as printed beside ours (facts, not measurements).

Source: NVIDIA recsys-examples, examples/hstu/inference_aoti (the benchmark write-up and
benchmark/README.md). Model: hidden 512, 4 heads of 128, bf16 weights and cache, 8 tasks,
4096 history items, 100 candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

HARDWARE = "NVIDIA RTX PRO 6000 Blackwell"


@dataclass(frozen=True)
class BackendFigure:
    label: str  # NVIDIA's name of the row
    e2e_s: float  # total end-to-end seconds for the same measured cases, batch 2


#: The backend comparison at batch 2, in NVIDIA's order (the first row is the baseline).
BACKENDS: tuple[BackendFigure, ...] = (
    BackendFigure("Python backend, no cache", 1.311),
    BackendFigure("AOTI backend, no cache", 1.065),
    BackendFigure("AOTI backend, GPU KV-cache hit", 0.804),
)
BACKEND_BATCH = 2


@dataclass(frozen=True)
class ScalingFigure:
    layers: int
    batch_size: int
    hit_ms: float  # ms per logical request, 100% GPU KV-cache hits
    speedup: float  # over the same AOTI model without KV cache

    @property
    def no_cache_ms(self) -> float:
        """Derived: hit_ms x speed-up (NVIDIA prints the two figures above, not this one)."""
        return self.hit_ms * self.speedup


#: Batch-size scaling: NVIDIA publishes its batch-8 points.
SCALING: tuple[ScalingFigure, ...] = (
    ScalingFigure(layers=3, batch_size=8, hit_ms=0.423, speedup=4.47),
    ScalingFigure(layers=8, batch_size=8, hit_ms=0.678, speedup=5.93),
)
