"""What every part of the Grid Engine adapter shares: its hold on one cell (the runner,
the clock, the write guard, the memories of the last read) and the primitives on them.
The parts (``reads``, ``writes``, ``files``, ``preflight``) are mixins over it;
``adapter.GridEngineAdapter`` sets the state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Final, Literal

from controller.coalesce import Coalescer
from controller.gridengine import (
    accounting,
    classify,
    qstat,
    script,
)
from controller.gridengine.capabilities import Capabilities
from controller.gridengine.failures import ge_failure
from controller.runner.base import CommandResult, Runner, Sleep
from controller.slurm.script import StartSettings

JOINED_LIMIT: Final = 256  # job numbers in one joined qstat -j / qrls / qdel
SPLIT: Final = "<!-- DISPATCH-SPLIT -->"
ACCOUNTING_READS_PER_CALL: Final = 16  # at most 16 * 8 MiB of accounting per inspect

# How long the hold kinds read for a held job whose listing did not change are trusted:
# an operator's hold added on top of ours leaves the list's ``hqw`` as it was.
HOLD_RECHECK_S: Final = 30
CANCELLED_KEPT: Final = 100_000  # deletions remembered (for their accounting cause)
Stream = Literal["stdout", "stderr"]

# find_many's memory: (number, name, state letters, listed time) -> the job's details
DetailKey = tuple[int, str, str, int | None]



class AdapterBase:
    """The state and primitives the adapter's parts share (module docstring)."""

    cluster: str
    user: str
    capabilities: Capabilities | None
    _runner: Runner
    _settings: StartSettings
    _ge: script.GridEngineSettings
    _accounting_file: str
    _clock: Callable[[], float]
    _timeout: float
    _sleep: Sleep
    _poll_interval: float
    _stop_confirm_s: float
    _write_guard: Callable[[], None] | None
    _first_read_bytes: int
    _unheard_grace_s: float
    _unheard_since: dict[str, int]
    _details: dict[DetailKey, qstat.JobDetail]
    _holds: dict[DetailKey, tuple[classify.Holds, int]]
    _unheard_hosts: frozenset[str]
    _on_unheard: frozenset[int]
    _index: accounting.AccountingIndex
    _index_lock: asyncio.Lock
    _cancelled: dict[tuple[int, int], int]
    _identity_reads: Coalescer[int, qstat.JobDetail | None]
    _joined: Coalescer[tuple[str, int], CommandResult]

    # ------------------------------------------------------------ commands

    def _now(self) -> int:
        return int(self._clock())

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        return await self._runner.run(argv, timeout=self._timeout)

    async def _checked(self, argv: Sequence[str], operation: str) -> CommandResult:
        result = await self._run(argv)
        if not result.ok:
            raise ge_failure(result, operation=operation)
        return result

    async def _script(self, text: str, operation: str) -> CommandResult:
        result = await self._runner.run_script(text, timeout=self._timeout)
        if not result.ok:
            raise ge_failure(result, operation=operation)
        return result

    def _guard(self) -> None:
        if self._write_guard is not None:
            self._write_guard()

