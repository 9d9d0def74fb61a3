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


def compare(logits: np.ndarray, reference: np.ndarray, num_candidates: np.ndarray,
            tolerance: float = DEFAULT_TOLERANCE) -> Verdict:
    if logits.shape != reference.shape:
        return Verdict(False, float("inf"), -1, f"shape {list(logits.shape)} != reference {list(reference.shape)}")
    if logits.size == 0:
        return Verdict(True, 0.0, -1)
    diff = np.abs(logits.astype(np.float64) - reference.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN answer is never a match
    row = int(np.argmax(diff.max(axis=1)))
    worst = float(diff[row].max())
    user = int(np.searchsorted(np.cumsum(num_candidates), row, side="right"))
    return Verdict(worst <= tolerance, worst, user)
