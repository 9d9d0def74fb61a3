"""CI thresholds: limits on a report whose violations make the run fail.

A limit that names a hit ratio no bin has is itself a violation: a sweep that silently lost
the stage a gate was written for must not pass. With any threshold set, a flagged stage fails
the run too, but for the flags of failures (`errors`, `mismatches`) where a threshold that
allows some of them is set (`ALLOWED_BY`): that threshold alone judges them, once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from hstu_replay.arguments import HIT_RATIO_RULE, is_hit_ratio
from hstu_replay.errors import ConfigError
from hstu_replay.report.flags import ERRORS, MISMATCHES

_RATIO_TOL = 1e-9

#: The flags of failures, and the thresholds (fields of Thresholds) that allow some of them: with
#: one of those set, the flag does not fail the run by itself (--max-error-ratio counts wrong
#: answers as failures too).
ALLOWED_BY = {ERRORS: ("max_error_ratio",), MISMATCHES: ("max_mismatches", "max_error_ratio")}


@dataclass(frozen=True)
class Thresholds:
    max_mismatches: int | None = None
    max_error_ratio: float | None = None
    max_p99_ms: dict[float | None, float] = field(default_factory=dict)  # None: every bin
    min_speedup: dict[float, float] = field(default_factory=dict)  # target ratio -> minimum
    max_workers_lost: int | None = None  # workers a distributed run may lose

    @property
    def empty(self) -> bool:
        return not self.described()

    def allows(self, flag: str) -> bool:
        """Whether a threshold set judges the failures `flag` names (see ALLOWED_BY)."""
        return any(getattr(self, name) is not None for name in ALLOWED_BY.get(flag, ()))

    def described(self) -> list[str]:
        """Each limit set, in words: "p99 <= 250 ms", "speed-up >= 1.5x at hit ratio 1.00"."""
        out = [f"mismatches <= {self.max_mismatches}"] if self.max_mismatches is not None else []
        if self.max_error_ratio is not None:
            out.append(f"error ratio <= {self.max_error_ratio:g}")
        out += [f"p99 <= {ms:g} ms" + ("" if ratio is None else f" at hit ratio {_hr(ratio)}")
                for ratio, ms in self.max_p99_ms.items()]
        out += [f"speed-up >= {minimum:g}x at hit ratio {_hr(ratio)}" for ratio, minimum in self.min_speedup.items()]
        if self.max_workers_lost is not None:
            out.append(f"workers lost <= {self.max_workers_lost}")
        return out


# -- parsing ----------------------------------------------------------------------------------

def _number(option: str, whole: str, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{option} {whole!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{option} {whole!r}: {what} {text!r} is not a finite number")
    return value


def _ratio_map(option: str, text: str | None, bare_means_all: bool) -> dict:
    """Parse "RATIO:VALUE,..." (and, where allowed, a bare "VALUE" for every bin)."""
    if text is None or not str(text).strip():
        return {}
    text = str(text)
    out: dict[float | None, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ConfigError(f"{option} {text!r}: empty entry")
        if ":" in item:
            ratio_text, value_text = (s.strip() for s in item.split(":", 1))
            ratio: float | None = _number(option, text, ratio_text, "hit ratio")
            if not is_hit_ratio(ratio):
                raise ConfigError(f"{option} {text!r}: ratio {ratio_text!r}: {HIT_RATIO_RULE}")
        elif bare_means_all:
            ratio, value_text = None, item
        else:
            raise ConfigError(f"{option} {text!r}: {item!r} is not of the form RATIO:VALUE")
        value = _number(option, text, value_text, "value")
        if value <= 0:
            raise ConfigError(f"{option} {text!r}: value {value_text!r} must be positive")
        if ratio in out:
            which = "the all-bins value" if ratio is None else f"hit ratio {ratio_text!r}"
            raise ConfigError(f"{option} {text!r}: {which} given twice")
        out[ratio] = value
    return out


def _max_mismatches(value: str | int | None) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ConfigError(f"--max-mismatches {value!r}: expected a non-negative integer")
    try:
        n = int(value) if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise ConfigError(f"--max-mismatches {value!r}: expected a non-negative integer") from None
    if n < 0:
        raise ConfigError(f"--max-mismatches {value!r}: expected a non-negative integer")
    return n


def _max_error_ratio(value: str | float | None) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip()
    ratio = _number("--max-error-ratio", text, text, "ratio")
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"--max-error-ratio {text!r}: expected a ratio in 0..1")
    return ratio


def parse_thresholds(
    max_mismatches: str | int | None = None,
    max_error_ratio: str | float | None = None,
    max_p99_ms: str | None = None,
    min_speedup: str | None = None,
    max_workers_lost: int | None = None,
) -> Thresholds:
    """From option text: `max_p99_ms` "250" or "0:300,1.0:120"; `min_speedup` "1.0:1.5"."""
    return Thresholds(
        max_mismatches=_max_mismatches(max_mismatches),
        max_error_ratio=_max_error_ratio(max_error_ratio),
        max_p99_ms=_ratio_map("--max-p99-ms", max_p99_ms, bare_means_all=True),
        min_speedup=_ratio_map("--min-speedup", min_speedup, bare_means_all=False),
        max_workers_lost=_max_workers_lost(max_workers_lost),
    )


def _max_workers_lost(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--max-workers-lost {value!r}: expected a whole number >= 0 (-1: off)")
    return value


# -- evaluation -------------------------------------------------------------------------------

def _hr(ratio: float) -> str:
    """A hit ratio for a message: two decimals unless that would hide digits."""
    return f"{ratio:.2f}" if round(ratio, 2) == ratio else f"{ratio:g}"


def _same(a: float, b: float) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=0.0, abs_tol=_RATIO_TOL)


def _at(bins: list[dict], ratio: float) -> list[dict]:
    return [b for b in bins if _same(b["target_ratio"], ratio)]


def _error_ratio_violations(bins: list[dict], limit: float) -> list[str]:
    failures = sum(b["failures"] for b in bins)  # no answer, or a wrong one
    total = sum(b["requests"] + b["errors"] for b in bins)  # requests sent
    if not total:
        return ["no measured requests for --max-error-ratio"]
    ratio = failures / total
    if ratio <= limit:
        return []
    shown = f"{ratio:.3f}" if ratio >= 0.001 else f"{ratio:.2g}"
    return [f"error ratio {shown} > {limit:g}"]


def _p99_violations(bins: list[dict], limits: dict[float | None, float]) -> list[str]:
    out = [f"no bin at hit ratio {_hr(r)} for --max-p99-ms"
           for r in limits if r is not None and not _at(bins, r)]
    for b in bins:
        specific = [ms for r, ms in limits.items() if r is not None and _same(r, b["target_ratio"])]
        limit = specific[0] if specific else limits.get(None)
        if limit is None:
            continue
        p99 = b["p99_ms"]
        if p99 is None:
            out.append(f"no latencies in bin {b['name']} for --max-p99-ms")
        elif p99 > limit:
            out.append(f"p99 {p99:.1f} ms > {limit:g} ms in bin {b['name']}")
    return out


def _speedup_violations(bins: list[dict], minimums: dict[float, float]) -> list[str]:
    out = []
    for ratio, minimum in minimums.items():
        matched = _at(bins, ratio)
        if not matched:
            out.append(f"no bin at hit ratio {_hr(ratio)} for --min-speedup")
        for b in matched:
            s, where = b["speedup"], f"at hit ratio {_hr(ratio)} (batch {b['batch_size']})"
            if s is None:
                out.append(f"speed-up unknown {where}: needs latencies here and in a 0.00 bin")
            elif s < minimum:
                out.append(f"speed-up {s:.2f}x < {minimum:g}x {where}")
    return out


def evaluate(report: dict, thresholds: Thresholds) -> list[str]:
    """One line per violated threshold; an empty list means the run passes. With any threshold
    set, a stage whose figures are flagged as not solid fails the run too (naming why), but for
    failures a threshold set allows (`Thresholds.allows`)."""
    bins = report["bins"]
    interrupted = report.get("interrupted")  # never passes, also where the stage it cut measured nothing
    out: list[str] = [] if interrupted is None else [f"the run was interrupted by {interrupted['signal']}"]
    out += [f"stage {s['name']} is {f['flag']}: {f['reason']}"
            for s in report["stages"] for f in s["flags"] if not thresholds.allows(f["flag"])]
    if thresholds.max_mismatches is not None:
        n = report["verification"]["mismatches"]
        if n > thresholds.max_mismatches:
            out.append(f"{n} mismatches > {thresholds.max_mismatches} allowed")
    if thresholds.max_error_ratio is not None:
        out += _error_ratio_violations(bins, thresholds.max_error_ratio)
    out += _p99_violations(bins, thresholds.max_p99_ms)
    out += _speedup_violations(bins, thresholds.min_speedup)
    lost = len(report.get("workers_lost") or ())
    if thresholds.max_workers_lost is not None and lost > thresholds.max_workers_lost:
        out.append(f"{lost} workers lost > {thresholds.max_workers_lost} allowed")
    return out


def verdict(violations: Iterable[str], checked: Iterable[str] = ()) -> dict:
    """What goes into report["thresholds"]: `checked` are the limits set, in words (`Thresholds.described`)."""
    violations = list(violations)
    return {"passed": not violations, "violations": violations, "checked": list(checked)}
