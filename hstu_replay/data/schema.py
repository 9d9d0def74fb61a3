"""KuaiRand's raw layouts: file names, column order and the contextual features' categories.

Facts from the dataset's README (see shared/reference/kuairand-1k.md); the synthesizer writes
exactly this and `prepare` checks real files against it. The three releases (1K, 27K, Pure)
share the columns; they differ in file names, and 27K splits each standard log into part files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hstu_replay.interface import ACTION_BITS, CONTEXT_KEYS

LOG_PERIOD1 = "log_standard_4_08_to_4_21_1k.csv"
LOG_PERIOD2 = "log_standard_4_22_to_5_08_1k.csv"
LOG_RANDOM = "log_random_4_22_to_5_08_1k.csv"
USER_FEATURES = "user_features_1k.csv"

#: The standard logs, in the order their events are concatenated.
STANDARD_LOGS: tuple[str, ...] = (LOG_PERIOD1, LOG_PERIOD2)
RAW_FILES: tuple[str, ...] = (LOG_PERIOD1, LOG_PERIOD2, LOG_RANDOM, USER_FEATURES)

#: Header of every log file, in file order; all fields are integers.
LOG_COLUMNS: tuple[str, ...] = (
    "user_id",
    "video_id",
    "date",
    "hourmin",
    "time_ms",
    "is_click",
    "is_like",
    "is_follow",
    "is_comment",
    "is_forward",
    "is_hate",
    "long_view",
    "play_time_ms",
    "duration_ms",
    "profile_stay_time",
    "comment_stay_time",
    "is_profile_enter",
    "is_rand",
    "tab",
)

#: The action flag columns, in bit order (bit i has weight 2**i).
ACTION_COLUMNS: tuple[str, ...] = tuple(name for name, _ in ACTION_BITS)
ACTION_WEIGHTS: tuple[int, ...] = tuple(weight for _, weight in ACTION_BITS)

#: What `prepare` reads from a log; the other columns are parsed for shape only.
LOG_COLUMNS_USED: tuple[str, ...] = ("user_id", "video_id", "time_ms", *ACTION_COLUMNS)

#: Header of user_features_1k.csv, in file order.
USER_FEATURE_COLUMNS: tuple[str, ...] = (
    "user_id",
    "user_active_degree",
    "is_lowactive_period",
    "is_live_streamer",
    "is_video_author",
    "follow_user_num",
    "follow_user_num_range",
    "fans_user_num",
    "fans_user_num_range",
    "friend_user_num",
    "friend_user_num_range",
    "register_days",
    "register_days_range",
    *(f"onehot_feat{i}" for i in range(18)),
)

#: The contextual features `prepare` re-codes 1..k, in CONTEXT_KEYS order.
CONTEXT_COLUMNS: tuple[str, ...] = CONTEXT_KEYS

#: The published category strings of each contextual feature (range strings hold commas).
CONTEXT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "user_active_degree": ("high_active", "full_active", "middle_active", "UNKNOWN"),
    "follow_user_num_range": (
        "0", "(0,10]", "(10,50]", "(50,100]", "(100,150]", "(150,250]", "(250,500]", "500+",
    ),
    "fans_user_num_range": (
        "0", "[1,10)", "[10,100)", "[100,1k)", "[1k,5k)", "[5k,1w)", "[1w,10w)",
    ),
    "friend_user_num_range": (
        "0", "[1,5)", "[5,30)", "[30,60)", "[60,120)", "[120,250)", "250+",
    ),
    "register_days_range": (
        "15-30", "31-60", "61-90", "91-180", "181-365", "366-730", "730+",
    ),
}



@dataclass(frozen=True)
class Release:
    """One release's file names and published size.

    `periods` are the stems of the two standard logs; with `parts` > 0 each is split into part
    files `<stem>_part1.csv` .. `<stem>_partK.csv` (at least the published K, more if present,
    numbered without gaps), else it is the one file `<stem>.csv`.
    """

    name: str
    periods: tuple[str, str]
    random_log: str
    user_features: str
    parts: int
    users: int
    standard_events: int

    def period_files(self, raw: Path, period: int) -> list[Path]:
        """The files of standard period `period` (0 or 1) in concatenation order (may not exist)."""
        stem = self.periods[period]
        if not self.parts:
            return [raw / f"{stem}.csv"]
        found = {int(p.stem.rsplit("_part", 1)[1]) for p in raw.glob(f"{stem}_part*.csv")
                 if p.stem.rsplit("_part", 1)[1].isdigit()}
        last = max([self.parts, *found])
        return [raw / f"{stem}_part{k}.csv" for k in range(1, last + 1)]

    def part_name(self, period: int, part: int) -> str:
        """File name of part `part` (0-based) of standard period `period`."""
        stem = self.periods[period]
        return f"{stem}_part{part + 1}.csv" if self.parts else f"{stem}.csv"


#: The published releases, by the name `data synth --release` and the store's meta use.
RELEASES: dict[str, Release] = {
    release.name: release
    for release in (
        Release("1k", (LOG_PERIOD1[:-4], LOG_PERIOD2[:-4]), LOG_RANDOM, USER_FEATURES, 0,
                1_000, 11_713_045),
        Release("27k", ("log_standard_4_08_to_4_21_27k", "log_standard_4_22_to_5_08_27k"),
                "log_random_4_22_to_5_08_27k.csv", "user_features_27k.csv", 2, 27_285, 322_278_385),
        Release("pure", ("log_standard_4_08_to_4_21_pure", "log_standard_4_22_to_5_08_pure"),
                "log_random_4_22_to_5_08_pure.csv", "user_features_pure.csv", 0, 27_285, 1_436_609),
    )
}
DEFAULT_RELEASE = "1k"


assert tuple(CONTEXT_CATEGORIES) == CONTEXT_COLUMNS
assert set(LOG_COLUMNS_USED) <= set(LOG_COLUMNS)
