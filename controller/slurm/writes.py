"""Writes: every command that changes a job, each behind the identity check (SPEC §2).

``Writes`` (a part of ``SlurmAdapter``) owns Stop, Hold, Release and Requeue; the
identity check before each (``_identified``: the job read now is ``ref``'s object, ours,
with our comment); what the write names the job by (``_target``: its SLUID where the
cluster's writes take one, else its id); the argv of each write (``_write``, the one
place a command that changes a job runs); and joined writes: releases and cancels issued
together share one command (``_write_many``), and when it fails each job is checked
again and written alone (``_run_joined_writes``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Final

from controller.coalesce import Coalescer
from controller.errors import ErrConflict, ErrInvalid, ErrNotFound, ProtocolError, TransientError
from controller.model.obs import ObjectObs, ObjectRef, State
from controller.runner.base import CommandResult
from controller.slurm import holds, naming
from controller.slurm.base import JOINED_WRITE_LIMIT, PER_JOB_RPC_S
from controller.slurm.dialects import utc_text
from controller.slurm.failures import slurm_failure
from controller.slurm.identity import write_target
from controller.slurm.reads import Reads
from controller.slurm.record import SlurmJob

log = logging.getLogger(__name__)

# A joined write: (operation, target, the job's dispatch name).
_WriteKey = tuple[str, str, str]


class _Alone(Exception):
    """A joined write failed: the job is checked again and written alone."""


_SLUID = re.compile(r"s[0-9A-Z]{10,30}")  # as dialects reads it

_NOT_STARTED: Final = frozenset({State.GATED, State.HELD, State.PENDING})


class Writes(Reads):
    """Identity-checked writes of one cluster (module docstring)."""

    _joined_writes: Coalescer[_WriteKey, CommandResult]
    _stop_confirm_s: float  # how long Stop waits for the job to end

    def _init_writes(self) -> None:
        # releases/cancels of concurrent callers, joined (coalesce)
        self._joined_writes = Coalescer(self._run_joined_writes, limit=JOINED_WRITE_LIMIT,
                                        parallel=2)

    def _target(self, ref: ObjectRef, job: SlurmJob) -> str:
        """What a write names the identity-checked ``job`` by (``identity.write_target``)."""
        return write_target(ref, job, self.capabilities)

    async def _identified(self, ref: ObjectRef, operation: str) -> SlurmJob:
        """The live job that is ``ref``'s object and ours to write, or ErrNotFound."""
        job = None if ref.cluster != self.cluster else await self._read_ours(ref.id)
        if job is None or not self._same_object(ref, job):
            raise ErrNotFound(f"{operation}: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit} on cluster {ref.cluster}; nothing was done")
        if naming.parse_comment(job.comment) is None:
            raise ErrNotFound(f"{operation}: job {ref.id} ({ref.uid}) has a comment that is "
                              f"not ours ({job.comment!r:.80}): foreign, never written")
        return job

    async def _write(self, operation: str, target: str, *, uid: str,
                     begin: int | None = None) -> CommandResult:
        """The one place a command that changes a job runs (after the write guard).
        ``target`` is a SLUID or a numeric id; ``operation`` one of ``cancel``,
        ``hold`` (``StartTime=<begin>``), ``start-now``, ``release``, ``requeue``.
        Callers pass only a target that passed the identity check; a SLUID names
        one job forever, so even a stale one can touch no other job."""
        sluid = _SLUID.fullmatch(target) is not None
        if not sluid and not (target.isascii() and target.isdigit()):
            raise ErrInvalid(f"not a job id or SLUID: {target!r:.40}", field="target")
        match operation:
            case "cancel":
                # with a SLUID, scancel --name cancels nothing on 26.05 (tried): the
                # name filter is the numeric id's belt only
                argv = ["scancel", target] if sluid else ["scancel", f"--name={uid}", target]
            case "hold":
                if begin is None:
                    raise ErrInvalid("hold needs a begin time", field="begin")
                argv = ["scontrol", "update", f"JobId={target}", f"StartTime={utc_text(begin)}"]
            case "start-now":
                argv = ["scontrol", "update", f"JobId={target}", "StartTime=now"]
            case "release" | "requeue":
                argv = ["scontrol", operation, target]
            case _:
                raise ErrInvalid(f"unknown write {operation!r}", field="operation")
        self._guard_write()
        return await self._run(argv)

    async def _checked_write(self, operation: str, target: str, *, uid: str,
                             begin: int | None = None, what: str) -> CommandResult:
        result = await self._write(operation, target, uid=uid, begin=begin)
        if not result.ok:
            raise slurm_failure(result, operation=what)
        return result

    async def _joined_write(self, operation: str, target: str, *, uid: str,
                            what: str) -> CommandResult:
        """A ``release`` or ``cancel`` of one identity-checked target, joined with the
        concurrent ones of the same kind into one command (``_write_many``). _Alone when
        a joined command failed: the caller checks its job again and writes it alone."""
        result = await self._joined_writes.call((operation, target, uid))
        if not result.ok:
            raise slurm_failure(result, operation=what)
        return result

    async def _run_joined_writes(self, keys: Sequence[_WriteKey]
                                 ) -> dict[_WriteKey, CommandResult | BaseException]:
        groups: dict[tuple[str, bool], list[_WriteKey]] = {}
        for key in keys:
            groups.setdefault((key[0], _SLUID.fullmatch(key[1]) is not None), []).append(key)
        answers: dict[_WriteKey, CommandResult | BaseException] = {}
        for (operation, _), group in groups.items():
            try:
                if len(group) == 1:
                    result = await self._write(operation, group[0][1], uid=group[0][2])
                else:
                    result = await self._write_many(operation, [key[1] for key in group])
            except Exception as exc:  # e.g. LeaseLost: each caller raises it
                answers.update(dict.fromkeys(group, exc))
                continue
            if len(group) > 1 and not result.ok:
                # which job made it fail, and whether the others were written, is not
                # told apart from the text: each is checked again and written alone
                answers.update((key, _Alone(result.stderr.strip()[:200])) for key in group)
            else:
                answers.update(dict.fromkeys(group, result))
        return answers

    async def _write_many(self, operation: str, targets: Sequence[str]) -> CommandResult:
        """One command that releases or cancels every identity-checked target (all
        numeric ids, or all SLUIDs). A cancel of numeric ids is restricted to our user
        (``scancel --user``): the per-job ``--name`` belt of ``_write`` takes one name."""
        for target in targets:
            if _SLUID.fullmatch(target) is None and not (target.isascii() and target.isdigit()):
                raise ErrInvalid(f"not a job id or SLUID: {target!r:.40}", field="target")
        match operation:
            case "release":
                argv = ["scontrol", "release", ",".join(targets)]
            case "cancel" if _SLUID.fullmatch(targets[0]) is not None:
                argv = ["scancel", *targets]
            case "cancel":
                argv = ["scancel", f"--user={self.user}", *targets]
            case _:
                raise ErrInvalid(f"no joined write {operation!r}", field="operation")
        self._guard_write()
        timeout = self._timeout + PER_JOB_RPC_S * (len(targets) - 1)
        return await self._runner.run(argv, timeout=timeout)

    async def stop(self, ref: ObjectRef) -> None:
        """Cancel ``ref``'s object by name AND id, then confirm it ended (~10 s).

        When the identity check fails (gone, id reused, not ours) nothing is cancelled and
        Stop succeeds. TransientError when the job is still running after the wait.
        Concurrent Stops share their identity read and their scancel.
        """
        await self._stop(ref, alone=False)

    async def _stop(self, ref: ObjectRef, *, alone: bool) -> None:
        try:
            job = await self._identified(ref, "stop")
        except ErrNotFound:
            log.info("stop: nothing to cancel", extra={"slurm_id": ref.id, "uid": ref.uid})
            return
        if self._observe(job).state is State.ENDED:
            return
        target = self._target(ref, job)
        if alone:
            await self._checked_write("cancel", target, uid=ref.uid, what="scancel")
        else:
            try:
                await self._joined_write("cancel", target, uid=ref.uid, what="scancel")
            except _Alone:
                await self._stop(ref, alone=True)
                return
        # bounded by the time slept, not by the clock: an injected clock may stand still
        waited = 0.0
        delay = 0.2
        while True:
            job_now = await self._read_ours(ref.id)
            if job_now is None or not self._same_object(ref, job_now) or _ending(
                    self._observe(job_now), job_now):
                return
            if waited >= self._stop_confirm_s:
                raise TransientError(f"stop: job {ref.id} ({ref.uid}) is still "
                                     f"{job_now.state_text} {self._stop_confirm_s:g}s after "
                                     "scancel", retry_after=self._stop_confirm_s)
            await self._sleep(delay)
            waited += delay
            delay = min(delay * 2, 2.0)

    async def hold(self, ref: ObjectRef, instance: int) -> None:
        """Hold a pending object with ``instance`` as a far-future start time (SPEC §5).

        ErrNotFound when the identity check fails; ErrConflict when the job is not
        pending, or when the hold does not read back as ``instance``.
        """
        holds.encode_hold(1, instance)  # refuses a bad instance before anything runs
        job = await self._identified(ref, "hold")
        obs = self._observe(job)
        if obs.state not in _NOT_STARTED:
            raise ErrConflict(f"hold: job {ref.id} is {obs.state} ({job.state_text}); only "
                              "a pending job can be held")
        if job.submit_time is None:
            raise ProtocolError(f"hold: job {ref.id} has no submit time")
        begin = holds.encode_hold(job.submit_time, instance)
        await self._checked_write("hold", self._target(ref, job), uid=ref.uid, begin=begin,
                                  what="scontrol update StartTime")
        after = await self._identified(ref, "hold")
        got = self._observe(after).hold_instance
        if got != instance:
            raise ErrConflict(
                f"hold: job {ref.id} reads back with hold instance {got} (begin "
                f"{after.eligible_time}, submit {after.submit_time}), not {instance}: the job "
                "changed under the hold (requeued or started); re-observe")

    async def release(self, ref: ObjectRef) -> None:
        """Open the gate (``scontrol release``) and/or lift a dispatch hold
        (``StartTime=now``). Idempotent; ErrNotFound when the identity check fails.
        Concurrent Releases share their identity read and their ``scontrol release``."""
        await self._release(ref, alone=False)

    async def _release(self, ref: ObjectRef, *, alone: bool) -> None:
        job = await self._identified(ref, "release")
        obs = self._observe(job)
        if obs.state not in _NOT_STARTED:
            return
        target = self._target(ref, job)
        if obs.hold_instance is not None:
            result = await self._write("start-now", target, uid=ref.uid)
            if not result.ok:
                error = slurm_failure(result, operation="scontrol update StartTime=now")
                if isinstance(error, ErrConflict):
                    return  # it started meanwhile: released
                raise error
        if job.reason == "JobHeldUser" and (job.restart_count or 0) == 0:
            if alone:
                await self._checked_write("release", target, uid=ref.uid,
                                          what="scontrol release")
                return
            try:
                await self._joined_write("release", target, uid=ref.uid,
                                         what="scontrol release")
            except _Alone:
                await self._release(ref, alone=True)

    async def requeue(self, ref: ObjectRef) -> None:
        """``scontrol requeue`` of ``ref``'s object. ErrConflict when it is pending;
        ErrUnsupported when requeue is disabled for it (``--no-requeue``)."""
        job = await self._identified(ref, "requeue")
        await self._checked_write("requeue", self._target(ref, job), uid=ref.uid,
                                  what="scontrol requeue")



def _ending(obs: ObjectObs, job: SlurmJob) -> bool:
    """Ended, or (after our scancel) COMPLETING: the text form prints a cancelled job
    that is still cleaning up as COMPLETING, hiding its CANCELLED base state."""
    return obs.state is State.ENDED or "COMPLETING" in job.flags
