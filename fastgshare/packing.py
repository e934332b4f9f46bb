"""Maximal Rectangles packing of (time x SM) rectangles into one GPU's bin.

A GPU is a bin ``TIME_UNITS`` wide (the scheduling window, in permille) and ``SM_UNITS``
tall (percent of the SMs). A pod with request ``r`` and partition ``s`` is a rectangle
``ceil(r*1000)`` wide and ``s`` tall; rectangles never rotate (time and SMs are different
axes). If every pod's rectangle can be placed without overlap, a schedule exists that gives
each pod its guaranteed time on its SMs with the SM sum of concurrent pods <= 100 %: read
the bin left to right as one window.

This is Jylaenki's MAXRECTS with the best-area-fit rule (short-side fit breaks ties), as in
the FaST-GShare paper. The free space is kept as the list of *all maximal* free rectangles,
so it can also be rebuilt from any set of placed rectangles (used after a removal).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from fastgshare import keys


@attrs.frozen
class Rect:
    """An axis-aligned rectangle: ``x`` along time, ``y`` along SMs."""

    x: int
    y: int
    width: int
    height: int

    @property
    def right(self) -> int:
        return self.x + self.width

    @property
    def top(self) -> int:
        return self.y + self.height

    @property
    def area(self) -> int:
        return self.width * self.height

    def contains(self, other: Rect) -> bool:
        return (self.x <= other.x and self.y <= other.y
                and other.right <= self.right and other.top <= self.top)

    def intersects(self, other: Rect) -> bool:
        return (self.x < other.right and other.x < self.right
                and self.y < other.top and other.y < self.top)


BIN = Rect(0, 0, keys.TIME_UNITS, keys.SM_UNITS)


class MaxRectsBin:
    """The free space of one bin; :meth:`insert` places a rectangle best-area-fit."""

    def __init__(self, placed: Iterable[Rect] = ()) -> None:
        self._free: list[Rect] = [BIN]
        for rect in placed:
            self._occupy(rect)

    @property
    def free_rects(self) -> Sequence[Rect]:
        """The maximal free rectangles (none contains another)."""
        return tuple(self._free)

    def find_position(self, width: int, height: int) -> Rect | None:
        """Where a ``width x height`` rectangle would go, or ``None`` if it does not fit."""
        best: Rect | None = None
        best_key: tuple[int, int, int, int] | None = None
        for free in self._free:
            if free.width < width or free.height < height:
                continue
            leftover_w, leftover_h = free.width - width, free.height - height
            key = (free.area - width * height, min(leftover_w, leftover_h), free.x, free.y)
            if best_key is None or key < best_key:
                best, best_key = Rect(free.x, free.y, width, height), key
        return best

    def insert(self, width: int, height: int) -> Rect | None:
        """Place a rectangle and return where it went, or ``None`` (bin unchanged)."""
        if width <= 0 or height <= 0:
            raise ValueError(f"rectangle must have a positive size, got {width}x{height}")
        position = self.find_position(width, height)
        if position is not None:
            self._occupy(position)
        return position

    def _occupy(self, used: Rect) -> None:
        split: list[Rect] = []
        for free in self._free:
            if free.intersects(used):
                split.extend(_split(free, used))
            else:
                split.append(free)
        self._free = _prune(split)


def _split(free: Rect, used: Rect) -> list[Rect]:
    """The up-to-four maximal pieces of ``free`` that lie outside ``used``."""
    pieces = []
    if used.x > free.x:
        pieces.append(Rect(free.x, free.y, used.x - free.x, free.height))
    if used.right < free.right:
        pieces.append(Rect(used.right, free.y, free.right - used.right, free.height))
    if used.y > free.y:
        pieces.append(Rect(free.x, free.y, free.width, used.y - free.y))
    if used.top < free.top:
        pieces.append(Rect(free.x, used.top, free.width, free.top - used.top))
    return pieces


def _prune(rects: list[Rect]) -> list[Rect]:
    """Drop duplicates and every rectangle contained in another; keep a stable order."""
    unique = sorted(set(rects), key=lambda r: (r.x, r.y, r.width, r.height))
    return [r for r in unique
            if not any(other != r and other.contains(r) for other in unique)]


def pack(sizes: Sequence[tuple[int, int]]) -> list[Rect] | None:
    """Pack ``(width, height)`` rectangles in the given order into an empty bin.

    Returns their positions in input order, or ``None`` if one does not fit.
    """
    packer = MaxRectsBin()
    placed = []
    for width, height in sizes:
        rect = packer.insert(width, height)
        if rect is None:
            return None
        placed.append(rect)
    return placed
