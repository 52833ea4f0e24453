"""Reading jobs: the one live read per tick (``find_many``), seed 003's check of jobs
listed running, the identity reads before writes, and the accounting file followed by
offset (``inspect_many``, ``inspect``); the adapter module's docstring says how.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Collection, Sequence
from dataclasses import replace

from controller.errors import (
    ErrInvalid,
    ErrNotFound,
    ProtocolError,
    TransientError,
)
from controller.gridengine import (
    accounting,
    classify,
    naming,
    qstat,
    verify,
)
from controller.gridengine.base import (
    ACCOUNTING_READS_PER_CALL,
    HOLD_RECHECK_S,
    SPLIT,
    AdapterBase,
    DetailKey,
)
from controller.model import identity
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, State
from controller.slurm import naming as slurm_naming

log = logging.getLogger(__name__)



class Reads(AdapterBase):
    """qstat and accounting reads of one cell (module docstring)."""

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
                parts.append(f"echo {shlex.quote(SPLIT)}")
                parts.append(f"qstat -xml -u {user} -s {kind} || exit $?")
        if not parts:
            return {}, {}
        result = await self._script("\n".join(parts) + "\n", "qstat -j / -s h")
        pieces = result.stdout.split(SPLIT + "\n")
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
        remembered: dict[DetailKey, qstat.JobDetail] = {}
        holds_seen: dict[DetailKey, tuple[classify.Holds, int]] = {}
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
            for _ in range(ACCOUNTING_READS_PER_CALL):
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

