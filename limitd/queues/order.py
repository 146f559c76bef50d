"""Which queue to try first, decided afresh for every fetch (Sidekiq's three modes).

- strict: no queue has a weight; always the configured order.
- random: every weight is 1; a fresh shuffle each time.
- weighted: a queue of weight w appears w times before the shuffle, and duplicates are
  then removed keeping first occurrences, so a heavier queue is more likely to come
  first but a light queue is never starved of a place in the order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

QueueSpec = str | Sequence[object]


class QueueOrder:
    """A capsule's queues and how to order them."""

    def __init__(self, queues: Sequence[QueueSpec], rng: random.Random | None = None) -> None:
        if not queues:
            raise ValueError("a capsule needs at least one queue")
        self.weights: dict[str, int] = {}
        for entry in queues:
            name, weight = _parse(entry)
            self.weights[name] = weight
        self.names = list(self.weights)
        self.mode = _mode(list(self.weights.values()))
        self._weighted = [name for name, w in self.weights.items() for _ in range(max(w, 1))]
        self._rng = rng or random.Random()

    def next_order(self) -> list[str]:
        """The queue names in the order this fetch should try them."""
        if self.mode == "strict":
            return list(self.names)
        if self.mode == "random":
            names = list(self.names)
            self._rng.shuffle(names)
            return names
        pool = list(self._weighted)
        self._rng.shuffle(pool)
        return list(dict.fromkeys(pool))

    def order_of(self, names: Sequence[str]) -> list[str]:
        """Like ``next_order``, over ``names`` only (the queues a fetch knows to have
        work, out of many listed): the same mode and weights, drawn among fewer."""
        if self.mode == "strict":
            rank = {name: place for place, name in enumerate(self.names)}
            return sorted(names, key=rank.__getitem__)
        if self.mode == "random":
            drawn = list(names)
            self._rng.shuffle(drawn)
            return drawn
        pool = [name for name in names for _ in range(max(self.weights[name], 1))]
        self._rng.shuffle(pool)
        return list(dict.fromkeys(pool))


def _parse(entry: QueueSpec) -> tuple[str, int]:
    if isinstance(entry, str):
        name, _, weight = entry.partition(",")
        return _checked(name.strip(), weight.strip() or "0", entry)
    if len(entry) == 2:
        return _checked(str(entry[0]), entry[1], entry)
    raise ValueError(f"queue entry {entry!r}: expected a name or [name, weight]")


def _checked(name: str, weight: object, entry: object) -> tuple[str, int]:
    if not name:
        raise ValueError(f"queue entry {entry!r}: empty queue name")
    try:
        value = int(weight)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f"queue entry {entry!r}: weight must be an integer >= 0") from None
    if value < 0 or isinstance(weight, bool):
        raise ValueError(f"queue entry {entry!r}: weight must be an integer >= 0")
    return name, value


def _mode(weights: list[int]) -> str:
    if all(w == 0 for w in weights):
        return "strict"
    if all(w == 1 for w in weights):
        return "random"
    return "weighted"
