"""The Grid Engine adapter: the contract of the Slurm one (docs/gridengine.md) against a
real Son of Grid Engine cell, every command through a ``Runner`` on the submit host.

``GridEngineAdapter`` implements ``controller.reconcile.ports.SchedulerPort``, plus
Inspect, Output and Preflight. It owns:

* **which command answers which question** (argv lists; quoting only in the sh
  scripts of Start, the reads and the output scripts);
* **the identity check** before every write: the job with the ref's number is read
  from qmaster *now* (``qstat -j <n>,<n>,... -xml``, concurrent checks joined into one
  command) and the write goes ahead only when the number, the exact name, our user,
  the submission time (equal; later only for a rerunnable job, whose reschedule moves
  it forward) agree and the account string is ours (``naming.parse_account``);
  anything else acts on nothing. Grid Engine reuses job numbers (``jobseqnum`` wraps,
  a new cell starts again at 1);
* **error mapping**: ``failures.ge_failure``, one table.

``GridEngineAdapter`` is the facade (Start, the cluster statistics); each concern has a
module: ``base`` (what the parts share), ``reads`` (the live read, seed 003's check, the
identity reads, accounting), ``writes``, ``files`` (Output, file checks, the ownership
marker), ``preflight``; and the pure ones: ``naming``, ``qstat``, ``accounting``,
``classify``, ``script``, ``capabilities``, ``verify``.

Reading
-------
FindMany makes ONE command for any number of jobs, ``qstat -f -xml -u <user>``: our
jobs with their state letters and queue instance, and every queue instance's state
(``u``: its execd is unheard). What the list lacks -- a running job's submission time,
the account string, the context (a dispatch hold's instance), an ``Eqw`` job's reason
-- comes from ONE joined ``qstat -j <n>,... -xml`` of the jobs whose (number, name,
state, time) the last read did not already explain, and the kind of a hold (the list
shows ``hqw`` for the gate, a dispatch hold, an operator's and a system hold alike)
from the filtered lists ``qstat -s hu|ho|hs``, read only when a job of ours is held;
both in one round trip. A steady queue costs one command per tick.

Accounting
----------
A job that left qstat is read from the accounting file, followed incrementally by
offset (``accounting.AccountingIndex``), never with one ``qacct`` per job; the record
of *this* object is ``accounting.pick_record``'s, and a job in neither is unknown (the
planner's grace), never assumed successful. A record written while the job is still
listed (``Eqw``) is never read for it: only refs missing from the live read are
inspected.

Writes
------
Start: ``qsub -terse [-h]`` in the Start script, read back in the same round trip
(``script``). Release: ``qrls`` (a user hold: the gate or a dispatch hold; an
operator's hold is left alone -- the owner's ``qrls`` of it is a silent no-op).
Hold: ``qalter -ac dispatch_hold=<h>`` then ``qhold``, read back. Stop: ``qdel``
(``qdel -f`` for a job whose host is unheard, where Preflight found forced deletion
allowed), then confirmed. Releases and stops issued together share one command.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from controller.coalesce import Coalescer
from controller.errors import (
    ErrInvalid,
    ProtocolError,
    TransientError,
)
from controller.gridengine import (
    accounting,
    classify,
    qstat,
    script,
    verify,
)
from controller.gridengine.base import JOINED_LIMIT, DetailKey
from controller.gridengine.capabilities import Capabilities
from controller.gridengine.failures import ge_failure
from controller.gridengine.files import Files
from controller.gridengine.preflight import Preflight
from controller.gridengine.writes import Writes
from controller.model.obs import ObjectRef, StartRequest
from controller.reconcile.ports import ClusterStats
from controller.runner.base import DEFAULT_COMMAND_TIMEOUT_S, CommandResult, Runner, Sleep
from controller.slurm import naming as slurm_naming
from controller.slurm.script import StartSettings, check_output_dir


class GridEngineAdapter(Writes, Files, Preflight):
    """One Grid Engine cell, reached through ``runner``, acting as user ``user``."""

    def __init__(self, runner: Runner, *, cluster: str, settings: StartSettings,
                 user: str, ge: script.GridEngineSettings | None = None,
                 accounting_file: str = accounting.DEFAULT_ACCOUNTING_FILE,
                 clock: Callable[[], float] = time.time,
                 capabilities: Capabilities | None = None,
                 command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 sleep: Sleep = asyncio.sleep,
                 poll_interval: float = 2.0, stop_confirm_s: float = 15.0,
                 write_guard: Callable[[], None] | None = None,
                 first_read_bytes: int = accounting.FIRST_READ_BYTES,
                 unheard_grace_s: float = verify.UNHEARD_GRACE_S) -> None:
        if not cluster:
            raise ErrInvalid("must not be empty", field="cluster")
        if not user:
            raise ErrInvalid("must not be empty", field="user")
        check_output_dir(settings.output_dir)
        self.cluster = cluster
        self.user = user
        self.capabilities = capabilities
        self._runner = runner
        self._settings = settings
        self._ge = ge or script.GridEngineSettings()
        self._accounting_file = accounting_file
        self._clock = clock
        self._timeout = float(command_timeout)
        self._sleep = sleep
        self._poll_interval = poll_interval
        self._stop_confirm_s = stop_confirm_s
        self._write_guard = write_guard
        self._first_read_bytes = first_read_bytes
        self._unheard_grace_s = unheard_grace_s
        self._unheard_since: dict[str, int] = {}  # host -> first read that found it 'u'
        self._details: dict[DetailKey, qstat.JobDetail] = {}
        self._holds: dict[DetailKey, tuple[classify.Holds, int]] = {}  # (kinds, read at)
        self._unheard_hosts: frozenset[str] = frozenset()
        self._on_unheard: frozenset[int] = frozenset()  # jobs listed on such a host
        self._index = accounting.AccountingIndex(user)
        self._index_lock = asyncio.Lock()
        # (number, submit) of the jobs this process deleted -> when: a qdel reads as any
        # signal in accounting (failed 100), so only our memory makes it "cancelled"
        self._cancelled: dict[tuple[int, int], int] = {}
        self._identity_reads: Coalescer[int, qstat.JobDetail | None] = Coalescer(
            self._read_details, limit=JOINED_LIMIT, parallel=2)
        self._joined: Coalescer[tuple[str, int], CommandResult] = Coalescer(
            self._run_joined, limit=JOINED_LIMIT, parallel=2)


    # ------------------------------------------------------------ Start

    async def start(self, request: StartRequest) -> ObjectRef:
        """Submit one job (gated when ``request.gate``: ``qsub -h``) and read it back."""
        text = script.render_start_script(request, self._settings, self._ge)
        self._guard()
        result = await self._runner.run_script(text, timeout=self._timeout)
        number = None
        head, _, rest = result.stdout.partition("\n")
        if head.startswith(script.ID_LINE + " "):
            word = head.split(" ", 1)[1].strip()
            number = int(word) if word.isascii() and word.isdigit() else None
        if not result.ok and number is None:
            raise ge_failure(result, operation="qsub")
        if number is None:
            raise ProtocolError(f"qsub printed no job number: {result.stdout[:120]!r}")
        details = qstat.parse_details(rest) if result.ok else {}
        detail = details.get(number)
        name = slurm_naming.discovery_name(request.job_id)
        if detail is None:
            # submitted, but the read-back did not answer: the next tick adopts it by
            # name and submission (the intent is committed); never submit again here
            raise TransientError(f"qsub: job {number} was submitted but could not be read "
                                 "back", retry_after=1.0)
        if detail.name != name or detail.owner != self.user:
            raise ProtocolError(f"qsub: job {number} reads back as {detail.name!r} of "
                                f"{detail.owner!r}")
        return ObjectRef(self.cluster, name, number, detail.submit)


    # ------------------------------------------------------------ cluster

    async def cluster_stats(self) -> ClusterStats:
        """Running and pending jobs of all users and the hosts whose queue instances
        are unheard (``u``), disabled or in error: one ``qstat -f -xml -u '*'``."""
        result = await self._script("exec qstat -f -xml -u '*'\n", "qstat -f (stats)")
        listed = qstat.parse_list(result.stdout)
        running = sum(1 for j in listed.jobs if j.queue)
        pending = sum(1 for j in listed.jobs if not j.queue)
        down = frozenset(q.host for q in listed.queues
                         if any(c in q.state for c in "uE"))
        return ClusterStats(running=running, pending=pending, down_nodes=down)

