"""Keys a source will never send again, collected as they retire and handed out once by its `settle`
(the process's cache model then forgets them where nothing bounds it)."""

from __future__ import annotations

from collections.abc import Iterable


class RetiredKeys:
    def __init__(self) -> None:
        self._keys: list[int] = []

    def add(self, key: int) -> None:
        self._keys.append(key)

    def extend(self, keys: Iterable[int]) -> None:
        self._keys.extend(keys)

    def take(self) -> list[int]:
        """The keys retired since the last call."""
        keys, self._keys = self._keys, []
        return keys
