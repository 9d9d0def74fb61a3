"""Files written whole, and strict JSON.

Every file is written to a temporary name beside it and renamed into place, so a killed process
leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import secrets
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same directory and os.replace."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open rather than mkstemp: the file gets the usual umask permissions, not 0600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def jsonable(value: Any) -> Any:
    """A copy fit for strict JSON: NaN and infinities become None, keys strings, tuples lists.

    Anything else that JSON cannot hold (a Path, an enum) becomes its str().
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [jsonable(v) for v in sorted(value, key=str)]
    return str(value)


def json_bytes(data: dict) -> bytes:
    """`data` as indented JSON, one newline at the end."""
    try:
        import orjson
    except ImportError:  # orjson is a dependency, but the stdlib does as well here
        return json.dumps(data, indent=2, allow_nan=False).encode() + b"\n"
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"
