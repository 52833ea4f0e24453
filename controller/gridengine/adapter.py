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
import logging
import posixpath
import shlex
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import asdict, replace
from typing import Any, Final, Literal

from controller.coalesce import Coalescer
from controller.errors import (
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    ProtocolError,
    TransientError,
)
from controller.gridengine import (
    accounting,
    capabilities,
    classify,
    naming,
    qstat,
    script,
    verify,
)
from controller.gridengine.capabilities import Capabilities
from controller.gridengine.failures import ge_failure
from controller.model import identity
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, StartRequest, State
from controller.reconcile.ports import ClusterStats
from controller.runner.base import DEFAULT_COMMAND_TIMEOUT_S, CommandResult, Runner, Sleep
from controller.slurm import naming as slurm_naming
from controller.slurm import output_scripts
from controller.slurm.script import StartSettings, check_output_dir, manifest_path, output_dir
from controller.slurm.script import parse_manifest as _parse_manifest

log = logging.getLogger(__name__)

JOINED_LIMIT: Final = 256  # job numbers in one joined qstat -j / qrls / qdel
_SPLIT: Final = "<!-- DISPATCH-SPLIT -->"
_ACCOUNTING_READS_PER_CALL: Final = 16  # at most 16 * 8 MiB of accounting per inspect
# How long the hold kinds read for a held job whose listing did not change are trusted:
# an operator's hold added on top of ours leaves the list's ``hqw`` as it was.
HOLD_RECHECK_S: Final = 30
_CANCELLED_KEPT: Final = 100_000  # deletions remembered (for their accounting cause)
Stream = Literal["stdout", "stderr"]

# find_many's memory: (number, name, state letters, listed time) -> the job's details
_Key = tuple[int, str, str, int | None]


class GridEngineAdapter:
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
        self._details: dict[_Key, qstat.JobDetail] = {}
        self._holds: dict[_Key, tuple[classify.Holds, int]] = {}  # (kinds, read at)
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
            number = int(word) if word.isdigit() else None
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

    # ------------------------------------------------------------ reads

    def _list_script(self) -> str:
        return f"exec qstat -f -xml -u {shlex.quote(self.user)}\n"

    async def _read_list(self) -> qstat.LiveList:
        result = await self._script(self._list_script(), "qstat -f -xml")
        return qstat.parse_list(result.stdout)

    async def _read_extra(self, numbers: Sequence[int], holds: bool
                          ) -> tuple[dict[int, qstat.JobDetail], dict[str, frozenset[int]]]:
        """One round trip: ``qstat -j`` of ``numbers`` and, with ``holds``, the three
        hold lists."""
        user = shlex.quote(self.user)
        parts = []
        if numbers:
            parts.append(f"qstat -j {','.join(map(str, numbers))} -xml || exit $?")
        if holds:
            for kind in ("hu", "ho", "hs"):
                parts.append(f"echo {shlex.quote(_SPLIT)}")
                parts.append(f"qstat -xml -u {user} -s {kind} || exit $?")
        if not parts:
            return {}, {}
        result = await self._script("\n".join(parts) + "\n", "qstat -j / -s h")
        pieces = result.stdout.split(_SPLIT + "\n")
        details = qstat.parse_details(pieces[0]) if numbers else {}
        lists: dict[str, frozenset[int]] = {}
        if holds:
            for kind, text in zip(("hu", "ho", "hs"), pieces[1:], strict=True):
                lists[kind] = qstat.parse_numbers(text)
        return details, lists

    def _ours(self, job: qstat.ListedJob, names: Collection[str] | None) -> bool:
        if job.owner != self.user or slurm_naming.job_id_of_name(job.name) is None:
            return False
        return names is None or job.name in names

    async def find(self, job_id: str) -> list[ObjectObs]:
        return list((await self.find_many([job_id]))[job_id])

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, Sequence[ObjectObs]]:
        """Every live object of each dispatch job (ONE ``qstat -f -xml -u`` for all;
        module docstring). With ``strays``, the objects named ``dj-<ULID>`` of ids not
        asked for go there."""
        ids = list(job_ids)
        for job_id in ids:
            slurm_naming.discovery_name(job_id)  # ErrInvalid for a malformed id
        found: dict[str, Sequence[ObjectObs]] = dict.fromkeys(ids, ())
        names = None if strays is not None else {"dj-" + i for i in ids}
        listed = await self._read_list()
        now = self._now()
        self._unheard_hosts = frozenset(q.host for q in listed.queues if "u" in q.state)
        self._unheard_since = {host: self._unheard_since.get(host, now)
                               for host in self._unheard_hosts}
        self._on_unheard = frozenset(j.number for j in listed.jobs
                                     if j.host and j.host in self._unheard_hosts)
        jobs: dict[int, qstat.ListedJob] = {}
        for job in listed.jobs:
            if self._ours(job, names) and job.number not in jobs:
                jobs[job.number] = job  # (an array job's tasks: one entry each)
        keys = {n: (n, j.name, j.state, j.time) for n, j in jobs.items()}
        missing = sorted(n for n, key in keys.items() if key not in self._details)
        held = any("h" in j.state and (
            keys[n] not in self._holds or now - self._holds[keys[n]][1] >= HOLD_RECHECK_S)
            for n, j in jobs.items())
        details, lists = await self._read_extra(missing, held)
        remembered: dict[_Key, qstat.JobDetail] = {}
        holds_seen: dict[_Key, tuple[classify.Holds, int]] = {}
        for number, key in keys.items():
            detail = self._details.get(key) or details.get(number)
            if detail is None or detail.name != key[1] or detail.owner != self.user:
                continue  # gone between the two reads: next tick
            remembered[key] = detail
            if held:
                holds = classify.Holds(user=number in lists.get("hu", ()),
                                       operator=number in lists.get("ho", ()),
                                       system=number in lists.get("hs", ()))
                holds_seen[key] = (holds, now)
            else:
                holds, since = self._holds.get(key, (classify.Holds(), now))
                holds_seen[key] = (holds, since)
            obs = classify.observe_live(jobs[number], detail, cluster=self.cluster,
                                        holds=holds, now=now)
            job_id = key[1][len(slurm_naming.NAME_PREFIX):]
            if job_id in found:
                found[job_id] = (*found[job_id], obs)
            elif strays is not None:
                strays.setdefault(job_id, []).append(obs)
        self._details = remembered
        self._holds = holds_seen
        await self._verify_running(found, strays, jobs, now)
        return found

    async def _verify_running(self, found: dict[str, Sequence[ObjectObs]],
                              strays: dict[str, list[ObjectObs]] | None,
                              jobs: dict[int, qstat.ListedJob], now: int) -> None:
        """Seed 003 (``verify``): a job listed running on a host whose execd has been
        unheard for ``unheard_grace_s``, or past its ``h_rt`` plus ``VERIFY_GRACE_S``, is
        looked for on its host. One with no process there and no accounting record is
        reported running with cause node-lost (the planner deletes it and resubmits
        away from the host), or, once its deletion is registered (``d``), ended; one
        with a record, as its record says."""
        long_unheard = {host for host, since in self._unheard_since.items()
                        if now - since >= self._unheard_grace_s}
        suspects: dict[str, list[ObjectObs]] = {}
        for group in (*found.values(), *(strays or {}).values()):
            for obs in group:
                if obs.state is not State.RUNNING or not obs.nodes:
                    continue
                past = (obs.start is not None and obs.time_limit_s is not None
                        and now > obs.start + obs.time_limit_s + verify.VERIFY_GRACE_S)
                if obs.nodes[0] in long_unheard or past:
                    suspects.setdefault(obs.nodes[0], []).append(obs)
        if not suspects:
            return
        dead: set[int] = set()
        for host, group in suspects.items():
            try:
                text = verify.probe_script(host)
            except ValueError:
                continue
            result = await self._runner.run_script(text, timeout=self._timeout)
            gone = verify.dead_numbers(result.stdout, [o.ref.id for o in group])
            if len(gone) < len(group):
                log.info("listed running, found on its host (or it cannot be told)",
                         extra={"host": host, "ge_ids": sorted(
                             o.ref.id for o in group if o.ref.id not in gone)})
            if gone:
                log.warning("listed running, but no process on its host",
                            extra={"host": host, "ge_ids": sorted(gone),
                                   "unheard": host in self._unheard_hosts})
            dead |= gone
        if not dead:
            return
        # A job that ended while its execd could not tell qmaster (qmaster restarted, a
        # network cut) has no process either: its record, once written, says how it
        # ended, and wins. (The unheard grace keeps a restarted qmaster's first minute
        # of 'u' from counting at all.)
        await self._follow_accounting()
        records = {}
        for group in (*found.values(), *(strays or {}).values()):
            for obs in group:
                if obs.ref.id in dead:
                    record = accounting.pick_record(
                        obs.ref, self._index.records.get(obs.ref.id, ()), user=self.user)
                    if record is not None:
                        records[obs.ref.id] = classify.observe_record(
                            record, cluster=self.cluster, now=now,
                            cancelled=(obs.ref.id, obs.ref.submit) in self._cancelled)

        def checked(obs: ObjectObs) -> ObjectObs:
            if obs.ref.id not in dead:
                return obs
            if obs.ref.id in records:
                return records[obs.ref.id]
            letters = jobs[obs.ref.id].state if obs.ref.id in jobs else ""
            detail = (f"listed '{letters}' on {obs.nodes[0]}"
                      + (" (its execd unheard)" if obs.nodes[0] in self._unheard_hosts
                         else " past its run-time limit")
                      + ", and no process of it there")
            return replace(obs, state=State.ENDED if "d" in letters else State.RUNNING,
                           cause=Cause(CauseKind.NODE_LOST, classify.SCHEDULER, detail))

        for job_id, group in found.items():
            found[job_id] = tuple(checked(o) for o in group)
        for stray_list in (strays or {}).values():
            stray_list[:] = [checked(o) for o in stray_list]

    async def _read_details(self, numbers: Sequence[int]
                            ) -> dict[int, qstat.JobDetail | None]:
        result = await self._script(
            f"exec qstat -j {','.join(map(str, numbers))} -xml\n", "qstat -j")
        try:
            details = qstat.parse_details(result.stdout)
        except ProtocolError as exc:
            log.warning("qstat -j printed what is not its XML", extra={
                "error": str(exc), "stdout": result.stdout[:2000],
                "stderr": result.stderr[:500]})
            raise TransientError(f"qstat -j: {exc}", retry_after=1.0) from exc
        return {n: details.get(n) for n in numbers}

    async def _identified(self, ref: ObjectRef, operation: str) -> qstat.JobDetail:
        """The live job that is ``ref``'s object and ours to write, or ErrNotFound."""
        detail = (None if ref.cluster != self.cluster
                  else await self._identity_reads.call(ref.id))
        if detail is None or detail.owner != self.user or not identity.same_object(
                ref, job_id=detail.number, name=detail.name, submit=detail.submit,
                restart_count=None if detail.rerunnable else 0):
            raise ErrNotFound(f"{operation}: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit} on cluster {ref.cluster}; nothing was done")
        if naming.parse_account(detail.account) is None:
            raise ErrNotFound(f"{operation}: job {ref.id} ({ref.uid}) has an account that "
                              f"is not ours ({detail.account!r:.80}): foreign, never written")
        return detail

    # ------------------------------------------------------------ accounting

    async def _follow_accounting(self) -> None:
        """Read what the accounting file gained since the last read."""
        async with self._index_lock:
            for _ in range(_ACCOUNTING_READS_PER_CALL):
                first = self._index.offset is None
                text = accounting.read_script(
                    self._accounting_file, self._index.offset or 0,
                    tail_bytes=self._first_read_bytes if first else None)
                result = await self._runner.run_script(text, timeout=self._timeout)
                if not result.ok:
                    raise TransientError(
                        f"accounting file {self._accounting_file}: "
                        f"{' '.join(result.stderr.split())[:200]}")
                if not self._index.feed(result.stdout):
                    return

    async def inspect_many(self, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]:
        """Accounting observations of objects that left qstat (the file followed by
        offset: one read of what it gained). Refs without a record are left out."""
        ours = [ref for ref in refs if ref.cluster == self.cluster]
        if not ours:
            return {}
        await self._follow_accounting()
        self._index.prune(min(since, self._now()) - 86_400)
        now = self._now()
        observed: dict[ObjectRef, ObjectObs] = {}
        for ref in ours:
            record = accounting.pick_record(ref, self._index.records.get(ref.id, ()),
                                            user=self.user)
            if record is not None:
                observed[ref] = classify.observe_record(
                    record, cluster=self.cluster, now=now,
                    cancelled=(ref.id, ref.submit) in self._cancelled)
        return observed

    async def inspect(self, ref: ObjectRef) -> ObjectObs:
        """``ref``'s object, live or from accounting; ErrNotFound when neither has it."""
        if ref.cluster != self.cluster:
            raise ErrNotFound(f"inspect: ref of cluster {ref.cluster}, not {self.cluster}")
        job_id = slurm_naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a discovery name: {ref.uid!r:.60}", field="ref.uid")
        for obs in (await self.find_many([job_id]))[job_id]:
            if obs.ref == ref or identity.same_object(
                    ref, job_id=obs.ref.id, name=obs.ref.uid, submit=obs.ref.submit,
                    restart_count=obs.restart_count):
                return obs
        found = await self.inspect_many([ref], since=ref.submit)
        if ref not in found:
            raise ErrNotFound(f"inspect: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit} in qstat or accounting")
        return found[ref]

    # ------------------------------------------------------------ writes

    async def _run_joined(self, keys: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], CommandResult | BaseException]:
        answers: dict[tuple[str, int], CommandResult | BaseException] = {}
        groups: dict[str, list[int]] = {}
        for operation, number in keys:
            groups.setdefault(operation, []).append(number)
        for operation, numbers in groups.items():
            argv = {"release": ["qrls"], "stop": ["qdel"], "stop-forced": ["qdel", "-f"]}[
                operation] + [str(n) for n in numbers]
            try:
                self._guard()
                result = await self._run(argv)
            except Exception as exc:  # e.g. LeaseLost: each caller raises it
                answers.update({(operation, n): exc for n in numbers})
                continue
            if len(numbers) > 1 and not result.ok:
                # which one failed is not read from the text: each alone
                for n in numbers:
                    try:
                        self._guard()
                        answers[(operation, n)] = await self._run(
                            [*argv[:-len(numbers)], str(n)])
                    except Exception as exc:
                        answers[(operation, n)] = exc
            else:
                answers.update({(operation, n): result for n in numbers})
        return answers

    def _forget_holds(self, number: int) -> None:
        """Our own write changes the job's holds: the next read reads them again."""
        self._holds = {key: value for key, value in self._holds.items() if key[0] != number}

    async def release(self, ref: ObjectRef) -> None:
        """Lift our user hold (the gate, or a dispatch hold): ``qrls``. Idempotent;
        ErrNotFound when the identity check fails."""
        detail = await self._identified(ref, "release")
        if detail.start is not None:
            return  # running: nothing to release
        self._forget_holds(ref.id)
        result = await self._joined.call(("release", ref.id))
        if not result.ok:
            raise ge_failure(result, operation="qrls")

    async def hold(self, ref: ObjectRef, instance: int) -> None:
        """Hold a pending object as a dispatch hold: its instance in the context
        (``qalter -ac dispatch_hold=<h>``), then a user hold (``qhold``), read back.
        ErrConflict when it is running or the hold does not read back."""
        if not 1 <= instance <= 4_294_967_295:
            raise ErrInvalid("must be 1 .. 4294967295", field="instance")
        detail = await self._identified(ref, "hold")
        if detail.start is not None:
            raise ErrConflict(f"hold: job {ref.id} has started; only a pending job can "
                              "be held")
        self._forget_holds(ref.id)
        self._guard()
        await self._checked(["qalter", "-ac", f"{naming.HOLD_CONTEXT}={instance}",
                             str(ref.id)], "qalter -ac")
        self._guard()
        await self._checked(["qhold", str(ref.id)], "qhold")
        _, lists = await self._read_extra([], True)
        after = await self._identified(ref, "hold")
        got = naming.parse_hold_instance(after.context_value(naming.HOLD_CONTEXT))
        if ref.id not in lists.get("hu", frozenset()) or got != instance:
            raise ErrConflict(f"hold: job {ref.id} does not read back as held with "
                              f"instance {instance} (got {got}); re-observe")

    async def stop(self, ref: ObjectRef) -> None:
        """``qdel`` ``ref``'s object, then confirm it left qstat. When the identity check
        fails nothing is deleted and Stop succeeds; TransientError when the job is
        still listed after ``stop_confirm_s``."""
        try:
            await self._identified(ref, "stop")
        except ErrNotFound:
            log.info("stop: nothing to delete", extra={"ge_id": ref.id, "uid": ref.uid})
            return
        forced = (self.capabilities is not None and self.capabilities.forced_qdel_unknown
                  and ref.id in self._on_unheard)
        self._cancelled[(ref.id, ref.submit)] = self._now()
        if len(self._cancelled) > _CANCELLED_KEPT:  # the oldest half goes
            for key in sorted(self._cancelled, key=self._cancelled.__getitem__)[
                    :_CANCELLED_KEPT // 2]:
                del self._cancelled[key]
        result = await self._joined.call(("stop-forced" if forced else "stop", ref.id))
        if not result.ok:
            error = ge_failure(result, operation="qdel")
            if not isinstance(error, ErrNotFound):
                raise error
        if ref.id in self._on_unheard and not forced:
            # its execd cannot be reached: qmaster only marks the deletion ('dr') until
            # execd returns; nothing more can be confirmed (verify: it is dead)
            return
        waited, delay = 0.0, 0.2
        while True:
            try:
                await self._identified(ref, "stop (confirm)")
            except ErrNotFound:
                return
            if waited >= self._stop_confirm_s:
                raise TransientError(f"stop: job {ref.id} ({ref.uid}) is still listed "
                                     f"{self._stop_confirm_s:g}s after qdel",
                                     retry_after=self._stop_confirm_s)
            await self._sleep(delay)
            waited += delay
            delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------ files

    async def missing_paths(self, paths: Sequence[str]) -> list[str]:
        missing: list[str] = []
        for start, end, text in output_scripts.missing_paths_scripts(paths):
            result = await self._script(text, "missing_paths")
            missing.extend(paths[start + index]
                           for index in output_scripts.missing_indexes(result.stdout,
                                                                       end - start))
        return missing

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool:
        """Whether ``ref``'s object ever started: the shepherd creates its ``-o`` file
        ``D/s<N>-<id>.ge`` when the job starts."""
        job_id = slurm_naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a dispatch name: {ref.uid!r:.60}", field="ref.uid")
        path = posixpath.join(output_dir(self._settings, job_id),
                              f"s{submission}-{ref.id}.ge")
        return not await self.missing_paths([path])

    async def owner_marker(self, deployment: str) -> str | None:
        result = await self._script(
            output_scripts.owner_read_script(self._settings.output_dir, deployment,
                                             self.cluster), "read the ownership marker")
        return output_scripts.owner_token(result.stdout)

    async def set_owner_marker(self, deployment: str, token: str) -> None:
        text = output_scripts.owner_write_script(self._settings.output_dir, deployment,
                                                 self.cluster, token)
        self._guard()
        await self._script(text, "write the ownership marker")

    async def output(self, ref: ObjectRef, stream: Stream, *, follow: bool = False,
                     submission: int) -> AsyncIterator[bytes]:
        """The bytes of one stream of ``ref``'s executions (as on Slurm, SPEC §3.4)."""
        if stream not in ("stdout", "stderr"):
            raise ErrInvalid("must be stdout or stderr", field="stream")
        job_id = slurm_naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a discovery name: {ref.uid!r:.60}", field="ref.uid")
        manifest = manifest_path(self._settings, job_id, submission)
        result = await self._runner.run_script(output_scripts.cat_script(manifest),
                                               timeout=self._timeout)
        if not result.ok:
            raise ErrNotFound(f"output: no manifest {manifest}")
        if not result.stdout.endswith("\n"):
            raise TransientError(f"output: the manifest {manifest} is being written")
        stdout_files, stderr_files = _parse_manifest(result.stdout)
        files = stdout_files if stream == "stdout" else stderr_files
        directory, prefix = files.locate(posixpath.dirname(manifest))
        offsets: dict[str, int] = {}
        while True:
            ended = True
            if follow:
                try:
                    ended = (await self.inspect(ref)).state is State.ENDED
                except ErrNotFound:
                    ended = True
            more = True
            while more:
                text = output_scripts.read_new_script(directory, prefix, files.suffix,
                                                      offsets)
                read = await self._script(text, f"output of job {ref.id}")
                chunks, more = output_scripts.take_new_bytes(
                    read.stdout, prefix=prefix, suffix=files.suffix, slurm_id=ref.id,
                    offsets=offsets)
                for chunk in chunks:
                    yield chunk
            if ended:
                return
            await self._sleep(self._poll_interval)

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

    # ------------------------------------------------------------ preflight

    async def preflight(self) -> Capabilities:
        """Version, the global configuration (min_uid, max_unheard, reschedule_unknown,
        forced deletion, the accounting flush), the queues, whether the accounting file
        is readable and ``output.dir`` writable, the commands present."""
        out_dir = check_output_dir(self._settings.output_dir)
        from controller.slurm.script import shell_path
        probe = (f"D={shell_path(out_dir)}\n"
                 f"for c in {' '.join(capabilities.REQUIRED_COMMANDS)}; do command -v "
                 "\"$c\" >/dev/null || echo \"missing $c\"; done\n"
                 f"[ -r {shlex.quote(self._accounting_file)} ] && echo accounting-readable\n"
                 "echo \"uid $(id -u)\"\n"
                 'mkdir -p -- "$D" && P="$D/.dispatch-preflight.$$" && '
                 "printf 'probe\\n' >\"$P\" && rm -f -- \"$P\" && echo dir-writable\n"
                 "exit 0\n")
        version_res, conf_res, queues_res, probe_res = await asyncio.gather(
            self._script("qstat -help | head -n 1\n", "qstat -help"),
            self._checked(["qconf", "-sconf"], "qconf -sconf"),
            self._run(["qconf", "-sql"]),
            self._runner.run_script(probe, timeout=self._timeout))
        version = capabilities.parse_version(version_res.stdout)
        conf = capabilities.parse_sconf(conf_res.stdout)
        lines = probe_res.stdout.splitlines()
        warnings: list[str] = []
        if version[:2] not in capabilities.SUPPORTED:
            warnings.append(f"Grid Engine {'.'.join(map(str, version))} is not the tested "
                            "8.1")
        min_uid = conf.get("min_uid")
        params = conf.get("qmaster_params", "")
        forced = "ENABLE_FORCED_QDEL_IF_UNKNOWN" in params or "ENABLE_FORCED_QDEL" in params
        flush = capabilities.flush_s(conf.get("reporting_params"))
        if flush:
            warnings.append(f"accounting is flushed every {flush}s: a job that left qstat "
                            "is in neither qstat nor the file for that long")
        reschedule = capabilities.duration_s(conf.get("reschedule_unknown"))
        if not reschedule:
            warnings.append("reschedule_unknown is 0: Grid Engine keeps the jobs of a dead "
                            "host running ('r') until its execd returns")
        uid_line = next((line for line in lines if line.startswith("uid ")), "")
        caps = Capabilities(
            version=".".join(map(str, version)),
            accounting_file=self._accounting_file,
            accounting_readable="accounting-readable" in lines,
            min_uid=int(min_uid) if min_uid and min_uid.isdigit() else None,
            submit_uid=int(uid_line[4:]) if uid_line[4:].isdigit() else None,
            queues=tuple(queues_res.stdout.split()) if queues_res.ok else (),
            queue_configured=self._ge.queue,
            max_unheard_s=capabilities.duration_s(conf.get("max_unheard")),
            reschedule_unknown_s=reschedule,
            forced_qdel_unknown=forced,
            accounting_flush_s=flush,
            output_dir_writable="dir-writable" in lines,
            missing_commands=tuple(line.split(" ", 1)[1] for line in lines
                                   if line.startswith("missing ")),
            warnings=tuple(warnings))
        self.capabilities = caps
        return caps

    async def check_preflight(self) -> list[str]:
        caps = await self.preflight()
        log.info("preflight: what the cluster supports", extra={"capabilities": asdict(caps)})
        return capabilities.preflight_problems(caps)

    async def preflight_report(self) -> tuple[dict[str, Any], list[str]]:
        """Preflight as ``dispatchctl preflight`` shows it."""
        caps = await self.preflight()
        return asdict(caps), capabilities.preflight_problems(caps)
