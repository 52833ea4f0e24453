"""Joining concurrent per-job calls into one batched call: the adapter's identity reads
and writes (release, cancel) and the tick's recording of new refs, that many jobs need
at once in a burst. Pure asyncio: nothing here knows Slurm or the database.

A ``Coalescer`` takes keys from callers that ask in the same event-loop iteration (the
tick runs a job's actions concurrently, so a burst's releases arrive together) and
hands them, at most ``limit`` at a time and at most ``parallel`` batches in flight, to
one ``run`` call, which answers each key with a value or an exception. Every caller
still gets its own answer; a key asked twice is run once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# run(keys) -> an answer per key: its value, or the exception its caller raises. A key
# missing from the answer is a bug of ``run``: its caller gets a RuntimeError.
BatchRun = Callable[[Sequence[K]], Awaitable[Mapping[K, "V | BaseException"]]]


class Coalescer(Generic[K, V]):
    """Concurrent ``call(key)``s joined into batched ``run(keys)``s (module docstring)."""

    def __init__(self, run: BatchRun[K, V], *, limit: int, parallel: int = 1) -> None:
        if limit < 1 or parallel < 1:
            raise ValueError("limit and parallel must be at least 1")
        self._run = run
        self._limit = limit
        self._parallel = parallel
        self._waiting: dict[K, list[asyncio.Future[V]]] = {}
        self._running = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # runs made (for tests and metrics)

    async def call(self, key: K) -> V:
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(future)
        self._schedule()
        return await future

    def _schedule(self) -> None:
        # on the next loop iteration, so every call made in this one joins the batch
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._scheduled = False
        for key in [k for k, fs in self._waiting.items() if all(f.done() for f in fs)]:
            del self._waiting[key]  # every caller of it went away (cancelled)
        while self._waiting and self._running < self._parallel:
            keys = list(self._waiting)[:self._limit]
            batch = {key: self._waiting.pop(key) for key in keys}
            self._running += 1
            self.batches += 1
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: dict[K, list[asyncio.Future[V]]]) -> None:
        try:
            try:
                answers = await self._run(list(batch))
            except Exception as exc:  # the whole batch failed: each caller raises it
                answers = dict.fromkeys(batch, exc)
            for key, futures in batch.items():
                answer = answers.get(key, _MISSING)
                for future in futures:
                    if future.done():
                        continue
                    if answer is _MISSING:
                        future.set_exception(RuntimeError(f"batch gave no answer for {key!r}"))
                    elif isinstance(answer, BaseException):
                        future.set_exception(answer)
                    else:
                        future.set_result(answer)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            for futures in batch.values():
                for future in futures:
                    if not future.done():
                        future.cancel()
            raise
        finally:
            self._running -= 1
            if self._waiting:
                self._schedule()


_MISSING = object()
