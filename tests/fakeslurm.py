"""A stateful fake of the SchedulerPort for reconciler unit tests (pure logic only; every
behaviour here is also proven end to end against the real cluster)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from controller.errors import ErrNotFound, TransientError
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    StartRequest,
    State,
)
from controller.reconcile.ports import ClusterStats
from controller.slurm.naming import discovery_name


@dataclass
class FakeJob:
    obs: ObjectObs
    ran: bool = False


class FakeSlurm:
    cluster = "lab"

    def __init__(self, clock: list[int]) -> None:
        self.clock = clock
        self.jobs: dict[int, FakeJob] = {}
        self.next_id = 1
        self.calls: list[str] = []
        self.fail_live = False
        self.fail_accounting = False
        self.crash_after_sbatch = False
        self.accounting: dict[int, ObjectObs] = {}
        self.started: set[int] = set()  # ids whose batch step started (an output file)
        self.markers: dict[str, str] = {}  # ownership markers, by deployment id

    def _obs(self, job_id: str, slurm_id: int, req: StartRequest) -> ObjectObs:
        now = self.clock[0]
        return ObjectObs(ref=ObjectRef(self.cluster, discovery_name(job_id), slurm_id, now),
                         state=State.GATED if req.gate else State.PENDING,
                         cause=Cause(), submission=req.submission, attempt=req.attempt,
                         foreign=False, restart_count=0, hold_instance=None, requeued=False,
                         exit_code=None, nodes=(), reason="JobHeldUser", submit=now, start=None,
                         end=None, source=Source.LIVE, observed_at=now)

    async def start(self, request: StartRequest) -> ObjectRef:
        self.calls.append("start")
        slurm_id = self.next_id
        self.next_id += 1
        obs = self._obs(request.job_id, slurm_id, request)
        self.jobs[slurm_id] = FakeJob(obs)
        if self.crash_after_sbatch:
            raise TransientError("connection dropped after sbatch")
        return obs.ref

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, list[ObjectObs]]:
        self.calls.append("find_many")
        if self.fail_live:
            raise TransientError("slurmctld unreachable")
        wanted = set(job_ids)
        out: dict[str, list[ObjectObs]] = {}
        for fj in self.jobs.values():
            jid = fj.obs.ref.uid[3:]
            if jid in wanted:
                out.setdefault(jid, []).append(fj.obs)
            elif strays is not None:
                strays.setdefault(jid, []).append(fj.obs)
        return out

    async def inspect_many(self, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]:
        self.calls.append("inspect_many")
        if self.fail_accounting:
            raise TransientError("slurmdbd down")
        return {r: self.accounting[r.id] for r in refs if r.id in self.accounting}

    def _get(self, ref: ObjectRef) -> FakeJob:
        fj = self.jobs.get(ref.id)
        if fj is None or fj.obs.ref != ref:
            raise ErrNotFound(str(ref))
        return fj

    async def stop(self, ref: ObjectRef) -> None:
        self.calls.append("stop")
        fj = self.jobs.get(ref.id)
        if fj is not None and fj.obs.ref == ref and fj.obs.state != State.ENDED:
            self.end(ref.id, CauseKind.CANCELLED)

    async def hold(self, ref: ObjectRef, instance: int) -> None:
        self.calls.append("hold")
        fj = self._get(ref)
        fj.obs = replace(fj.obs, state=State.HELD, hold_instance=instance,
                         cause=Cause(CauseKind.NONE, Provenance.DISPATCH))

    async def release(self, ref: ObjectRef) -> None:
        self.calls.append("release")
        fj = self._get(ref)
        if fj.obs.state in (State.GATED, State.HELD):
            fj.obs = replace(fj.obs, state=State.PENDING, hold_instance=None, cause=Cause())

    async def missing_paths(self, paths: Sequence[str]) -> list[str]:
        return []

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool:
        self.calls.append("started_evidence")
        return ref.id in self.started

    async def cluster_stats(self) -> ClusterStats:
        return ClusterStats(running=0, pending=0)

    async def owner_marker(self, deployment: str) -> str | None:
        return self.markers.get(deployment)

    async def set_owner_marker(self, deployment: str, token: str) -> None:
        self.calls.append("mark")
        self.markers[deployment] = token

    # ---- test controls
    def run(self, slurm_id: int) -> None:
        fj = self.jobs[slurm_id]
        assert fj.obs.state == State.PENDING, fj.obs.state
        fj.ran = True
        self.started.add(slurm_id)
        fj.obs = replace(fj.obs, state=State.RUNNING, nodes=("n1",), start=self.clock[0])

    def end(self, slurm_id: int, cause: CauseKind, exit_code: int | None = None) -> None:
        fj = self.jobs[slurm_id]
        fj.obs = replace(fj.obs, state=State.ENDED, cause=Cause(cause, Provenance.SLURM),
                         exit_code=exit_code, end=self.clock[0])

    def forget(self, slurm_id: int) -> None:
        """The job leaves squeue (MinJobAge passed)."""
        fj = self.jobs.pop(slurm_id)
        self.accounting[slurm_id] = replace(fj.obs, source=Source.ACCOUNTING)

    def lose(self, slurm_id: int, *, ran_unseen: bool = False) -> None:
        """slurmctld loses the job: gone from squeue, never reached accounting.
        ``ran_unseen``: it ran (its output file exists) between two reads."""
        self.jobs.pop(slurm_id)
        if ran_unseen:
            self.started.add(slurm_id)

    def run_all_pending(self) -> None:
        for sid, fj in self.jobs.items():
            if fj.obs.state == State.PENDING:
                self.run(sid)
