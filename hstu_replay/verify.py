"""Compare served logits with reference logits, naming the worst user and its difference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: NVIDIA's tolerance for bf16 HSTU logits (absolute).
DEFAULT_TOLERANCE = 0.0625


@dataclass(frozen=True)
class Verdict:
    ok: bool
    max_abs_diff: float
    worst_user: int  # index within the batch (-1 when shapes differ)
    reason: str = ""


@dataclass(frozen=True)
class Difference:
    """The largest difference between two sets of logits of the same shape."""

    user: int  # index within the batch
    candidate: int  # index within the user's candidates
    task: int
    expected: float
    got: float
    size: float  # |got - expected|; inf where either is NaN

    def line(self, tolerance: float) -> str:
        return (f"candidate {self.candidate}, task {self.task}: expected {self.expected:.6g}, got {self.got:.6g} "
                f"(|diff| {self.size:.4g} > tolerance {tolerance})")


def largest_difference(logits: np.ndarray, reference: np.ndarray, num_candidates: np.ndarray) -> Difference | None:
    """Where `logits` lie farthest from `reference` (same shape, [sum(num_candidates), tasks]); None if empty."""
    if logits.size == 0:
        return None
    diff = np.abs(logits.astype(np.float64) - reference.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN answer is never a match
    row = int(np.argmax(diff.max(axis=1)))
    task = int(np.argmax(diff[row]))
    ends = np.cumsum(num_candidates)
    user = int(np.searchsorted(ends, row, side="right"))
    first = int(ends[user] - num_candidates[user])
    return Difference(user, row - first, task, float(reference[row, task]), float(logits[row, task]),
                      float(diff[row, task]))


def compare(logits: np.ndarray, reference: np.ndarray, num_candidates: np.ndarray,
            tolerance: float = DEFAULT_TOLERANCE) -> Verdict:
    if logits.shape != reference.shape:
        return Verdict(False, float("inf"), -1, f"shape {list(logits.shape)} != reference {list(reference.shape)}")
    worst = largest_difference(logits, reference, num_candidates)
    if worst is None:
        return Verdict(True, 0.0, -1)
    return Verdict(worst.size <= tolerance, worst.size, worst.user)
