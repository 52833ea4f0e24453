"""Submit slices and waves: the actions of one chunk in flight. A chunk's plans are
committed and started in waves (``Reconciler._launch``), each wave at most
``action_concurrency`` jobs acting at once (and holding that many Submits), at most
``DEPTH`` waves in flight; the releases wait for every Start of the chunk; a lease lost
by any action stops the rest."""

from __future__ import annotations

import asyncio
import time

from controller.errors import LeaseLost
from controller.model.job import JobState
from controller.reconcile.plan import Release
from controller.reconcile.report import TickReport


class Acts:
    """The waves of one chunk in flight."""

    DEPTH = 2  # waves in flight: one's Starts run while the next is planned and queued

    def __init__(self, concurrency: int) -> None:
        self.wave = max(1, concurrency)  # Submits per wave, and jobs acting at once in it
        self.lost: list[LeaseLost] = []
        self.releases: list[tuple[JobState, Release]] = []
        self._waves: list[tuple[asyncio.Future[list[None]], float]] = []

    @property
    def busy(self) -> bool:
        """A wave is in flight."""
        return any(not wave.done() for wave, _ in self._waves)

    def gate(self) -> asyncio.Semaphore:
        """The bound of one new wave."""
        return asyncio.Semaphore(self.wave)

    def started(self, wave: asyncio.Future[list[None]]) -> None:
        self._waves.append((wave, time.perf_counter()))

    def cancel(self) -> None:
        """Stop the waves in flight (their intents are committed: the next tick adopts
        or abandons whatever their Starts made)."""
        for wave, _ in self._waves:
            wave.cancel()

    async def room(self) -> None:
        """Wait until fewer than ``DEPTH`` waves are in flight (memory stays bounded
        however many Submits a chunk makes)."""
        while sum(1 for wave, _ in self._waves if not wave.done()) >= self.DEPTH:
            oldest = next(wave for wave, _ in self._waves if not wave.done())
            await asyncio.wait([oldest])

    async def drain(self, report: TickReport) -> None:
        """Wait for every wave; the time from the first wave's start to the last one's
        end is the tick's ``apply``."""
        if not self._waves:
            return
        first = self._waves[0][1]
        await asyncio.gather(*(wave for wave, _ in self._waves), return_exceptions=True)
        report.timings["apply"] += time.perf_counter() - first
        self._waves = []
