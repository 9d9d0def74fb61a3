"""Hand-written KuaiRand-1K style raw files for the data tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from hstu_replay.data import schema

#: user_features rows unless a test gives its own:
#: (user, degree, follow range, fans range, friend range, register days range)
DEFAULT_FEATURES = [
    (1, "high_active", "(0,10]", "[1,10)", "[1,5)", "15-30"),
    (2, "full_active", "(10,50]", "0", "[1,5)", "31-60"),
    (3, "high_active", "(0,10]", "[10,100)", "0", "15-30"),
    (4, "middle_active", "500+", "[1,10)", "250+", "730+"),
]


def log_line(user: int, video: int, time_ms: int, **fields: int) -> str:
    """One log row; every column not given is 0 except date/hourmin (plausible constants)."""
    values = {name: 0 for name in schema.LOG_COLUMNS}
    values.update(user_id=user, video_id=video, time_ms=time_ms, date=20220410, hourmin=1200)
    values.update(fields)
    unknown = set(fields) - set(schema.LOG_COLUMNS)
    assert not unknown, unknown
    return ",".join(str(values[name]) for name in schema.LOG_COLUMNS)


def features_text(rows) -> str:
    """user_features_1k.csv text: ranges quoted exactly as the real file quotes them."""
    header = ",".join(schema.USER_FEATURE_COLUMNS)
    lines = [header]
    for user, degree, follow, fans, friend, register in rows:
        q = lambda s: f'"{s}"' if "," in s else s  # noqa: E731
        fields = [str(user), degree, "0", "0", "1", "5", q(follow), "3", q(fans), "2", q(friend)]
        fields += ["20", q(register)] + ["0"] * 18
        lines.append(",".join(fields))
    return "\n".join(lines) + "\n"


def log_text(lines: list[str]) -> str:
    return ",".join(schema.LOG_COLUMNS) + "\n" + "".join(line + "\n" for line in lines)


@pytest.fixture
def write_raw(tmp_path: Path):
    """write_raw(period1=[lines], period2=[lines], random=[lines], features=rows) -> raw dir."""

    def write(period1=(), period2=(), random=(), features=DEFAULT_FEATURES, name="raw") -> Path:
        raw = tmp_path / name
        raw.mkdir()
        (raw / schema.LOG_PERIOD1).write_text(log_text(list(period1)))
        (raw / schema.LOG_PERIOD2).write_text(log_text(list(period2)))
        (raw / schema.LOG_RANDOM).write_text(log_text(list(random)))
        (raw / schema.USER_FEATURES).write_text(features_text(features))
        return raw

    return write
