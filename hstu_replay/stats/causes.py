"""A failure's cause: its message without what is particular to one request.

A failure's message names the request it befell: its users, keys, history lengths, the dump batch,
the difference found, the server's address. The same failure of many requests reads as one cause
once these are placeholders, so a run counts its failures by cause and keeps one whole message of
each as its example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: What varies from one request to the next, in the order it is replaced, and its placeholder.
#: Numbers go last, and not those that belong to a word (h2, HTTP/1.1, HTTP 503, b8): those name
#: the kind of failure, not the request.
PARTICULARS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\[[0-9A-Fa-f]*(?::[0-9A-Fa-f]*)+\](?::\d+)?"), "<addr>"),  # [::1]:8001
    (re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?(?![\w.])"), "<addr>"),  # 127.0.0.1:8001
    (re.compile(r"(?<![\w.])(?:localhost|[A-Za-z][\w-]*(?:\.[\w-]+)+):\d+(?!\w)"), "<addr>"),  # host.name:8001
    (re.compile(r"\b0x[0-9A-Fa-f]+\b"), "<hex>"),
    (re.compile(r"\buser -?\d+"), "user <id>"),
    (re.compile(r"\bkey -?\d+"), "key <key>"),
    (re.compile(r"(?<![A-Za-z0-9.])(?<!HTTP )(?<!HTTP/)-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])"), "<n>"),
)



def cause_of(message: str) -> str:
    """`message` with every request's particulars replaced by placeholders."""
    text = message
    for pattern, placeholder in PARTICULARS:
        text = pattern.sub(placeholder, text)
    return _once(text)


def _once(text: str) -> str:
    """The same part named once per user of a batch ("user <id> key <key>; user <id> key <key>: ...")
    read once, then "; ...": a batch of 8 and one of 32 fail of the same cause. A part repeats the
    one before it (the end of the first, after its words of introduction) up to its first ":";
    what follows that stays. One pass over the parts: a long message costs no more than its length."""
    out: list[str] = []
    unit = None  # the part the next one may repeat
    for part in text.split("; "):
        head, colon, rest = part.partition(":")
        if unit is not None and head and (head == unit or unit.endswith(" " + head)):
            if out[-1] != "; ...":
                out.append("; ...")
            unit = head
            if colon:  # the last repeat: what it says after it stays
                out.append(colon + rest)
                unit = None
            continue
        out.append("; " + part if out else part)
        unit = part
    return "".join(out)


@dataclass
class ErrorCause:
    """How many failures had one cause, and one whole message of them."""

    count: int
    example: str

    def to_dict(self) -> dict:
        return {"count": self.count, "example": self.example}

    @classmethod
    def from_dict(cls, d: dict) -> ErrorCause:
        return cls(int(d["count"]), str(d["example"]))
