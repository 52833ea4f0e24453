"""The simulator's scheduler: virtual time, the await points every call into the model
cluster passes through, and the trace of what happened.

Everything runs on one asyncio event loop in one thread. A coroutine of the production
code that calls the model (``tests.sim.cluster``) is suspended at a *point* (a future
only the driver resolves); the driver (``tests.sim.run``) lets the loop run until every
task is suspended at a point or done (``settle``), then picks the next step with the
seed's random generator: which point proceeds, or which other actor acts. Nothing here
sleeps or reads a real clock: the same seed gives the same steps, in the same order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

WALL0 = 1_800_000_000.0  # the virtual wall clock's start (epoch seconds)
MONO0 = 5_000.0  # the virtual monotonic clock's start


class VirtualClock:
    """One virtual time for the whole world: the wall clock (``wall``) and the monotonic
    clock (``mono``, also the tick's ``perf_counter``) move together, only when the
    driver or the model says so."""

    def __init__(self) -> None:
        self.t = 0.0  # seconds since the simulation began

    def wall(self) -> float:
        return WALL0 + self.t

    def mono(self) -> float:
        return MONO0 + self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("virtual time never goes back")
        self.t += seconds


@dataclass(eq=False)
class Point:
    """One suspended call: who waits (``actor``: a replica's name), where (``label``)."""

    seq: int
    actor: str
    label: str
    future: asyncio.Future[None] = field(repr=False)


class Closing(BaseException):
    """Raised at every point once the world is torn down: no suspended call goes on."""


class Scheduler:
    """The points in the order they were reached, the trace, and ``settle``."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.points: list[Point] = []
        self.trace: list[str] = []
        self.closing = False
        self._seq = 0

    async def point(self, actor: str, label: str) -> None:
        """Suspend the calling coroutine until the driver resumes this point."""
        if self.closing:
            raise Closing
        self._seq += 1
        here = Point(self._seq, actor, label, asyncio.get_running_loop().create_future())
        self.points.append(here)
        try:
            await here.future
        finally:
            if here in self.points:
                self.points.remove(here)
        if self.closing:
            raise Closing

    def resume(self, point: Point) -> None:
        self.points.remove(point)
        point.future.set_result(None)

    async def settle(self) -> None:
        """Run the loop until no callback is ready: every task waits at a point (or on
        something only a point's resumption can bring about), or is done.

        Reads the event loop's ready queue (``_ready``, a private attribute: asyncio
        offers no public way to ask whether the loop is idle). A timer would mean the
        production code slept on the real clock: that is refused."""
        loop = asyncio.get_running_loop()
        for _ in range(100_000):
            await asyncio.sleep(0)
            if not loop._ready:  # type: ignore[attr-defined]
                if loop._scheduled:  # type: ignore[attr-defined]
                    raise RuntimeError("a coroutine slept on the real clock")
                return
        raise RuntimeError("the world never settled")

    def next_seq(self) -> int:
        """A number that orders everything that happens (virtual time may stand still)."""
        self._seq += 1
        return self._seq

    def log(self, actor: str, text: str) -> None:
        self.trace.append(f"t={self.clock.t:7.1f}  {actor:<9} {text}")
