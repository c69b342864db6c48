"""A heap of timed callbacks: the clock of the discrete-event simulator.

Events at the same time run in the order they were scheduled (a sequence number breaks ties), so a
run is deterministic for a given seed. A scheduled event can be cancelled through its ``Timer``;
cancelled entries stay in the heap and are skipped when popped (cheaper than removing them).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable


@dataclass(eq=False)
class Timer:
    time: float
    fn: Callable[[], None] | None = field(repr=False)

    def cancel(self) -> None:
        self.fn = None

    @property
    def active(self) -> bool:
        return self.fn is not None


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self.now = 0.0
        self.processed = 0

    def at(self, time: float, fn: Callable[[], None]) -> Timer:
        if time < self.now:
            time = self.now  # never schedule into the past (float noise)
        timer = Timer(time, fn)
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, timer))
        return timer

    def after(self, delay: float, fn: Callable[[], None]) -> Timer:
        return self.at(self.now + max(0.0, delay), fn)

    def peek_time(self) -> float | None:
        while self._heap and not self._heap[0][2].active:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Run the next live event; False when none is left."""
        while self._heap:
            time, _, timer = heapq.heappop(self._heap)
            fn = timer.fn
            if fn is None:
                continue
            timer.fn = None
            self.now = time
            self.processed += 1
            fn()
            return True
        return False
