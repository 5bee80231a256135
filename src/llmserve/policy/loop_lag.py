"""How far behind its event loop the API process runs: the front end's own saturation.

Admission's service model predicts the engine; at GPU rates the API process can saturate first
(one core parses, validates, tokenizes and relays every request), and then requests wait in the
event loop's backlog, which no engine statistic shows. A timer due every INTERVAL_S measures how
late it fires. The lag rises at once with a late tick and falls smoothly (DECAY per tick), so
one quick tick in a backlog does not read as recovery.
"""

from __future__ import annotations

import asyncio

INTERVAL_S = 0.01
DECAY = 0.8  # per tick: a backlog's lag fades over ~50 ms once the loop keeps time again


class EventLoopLag:
    def __init__(self) -> None:
        self.lag_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Measure `loop` from now on (once per loop; idempotent)."""
        if self._loop is loop:
            return
        self._loop, self.lag_s = loop, 0.0
        self._schedule(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        due = loop.time() + INTERVAL_S
        loop.call_at(due, self._tick, loop, due)

    def _tick(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        if loop is not self._loop:  # watching another loop now
            return
        late = max(0.0, loop.time() - due)
        self.lag_s = late if late > self.lag_s else DECAY * self.lag_s + (1 - DECAY) * late
        self._schedule(loop)
