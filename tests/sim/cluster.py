"""A model of slurmctld (and slurmdbd) that fails on purpose, behind the ``SchedulerPort``
the reconciler calls, and the ground truth of what really happened on it.

One ``Cluster`` is shared by every replica of every deployment (they are one Slurm user:
their jobs are all ``dj-<ULID>`` with the same comment format). Each replica talks to it
through its own ``Port``, which knows who is calling and the production write guard of
that replica (``Lease.guard``, as the daemon wires ``SlurmAdapter(write_guard=...)``).

What the model does that ``tests/fakeslurm.py`` does not:

* every call is suspended at scheduler points (``tests.sim.sched``): a read takes its
  snapshot when its first point proceeds and answers at its second, so writes of other
  coroutines fall between the two; a slow read moves virtual time on;
* sbatch refused for a limit (``ErrBackPressure``: nothing created), lost (nothing
  created), acknowledged late, or acknowledged never (the job exists, the caller gets a
  ``TransientError``); a new job that squeue shows only later; a requeue that moves the
  submit time; slurmctld losing its state (newer jobs vanish, running ones are killed,
  job ids are handed out again); accounting records that appear late; ended jobs that
  leave squeue after ``MinJobAge``;
* every write (Stop, Hold, Release) re-checks identity as the adapter does (the job read
  now has the ref's id, name and submit time -- ``controller.model.identity`` -- and our
  comment): a write to a ref that no longer matches acts on nothing (Stop) or raises
  ``ErrNotFound`` (Hold, Release). Observations are made by the production classifier
  (``controller.slurm.classify``) from ``SlurmJob`` records, as the adapter makes them.

The ground truth: ``executions`` (each time a job really started running: which
``dj-<ULID>``, submission, deployment, Slurm job, and how it ended) and ``writes`` (each
write that acted: who wrote, to which Slurm job, of which deployment). The model calls
its ``Observer`` at each, so the invariants are checked at the very moment they could
break.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.errors import ErrBackPressure, ErrConflict, ErrNotFound, TransientError
from controller.model.identity import same_object
from controller.model.obs import ObjectObs, ObjectRef, Source, StartRequest
from controller.reconcile.ports import ClusterStats
from controller.slurm.classify import classify
from controller.slurm.holds import decode_hold, encode_hold
from controller.slurm.naming import discovery_name, format_comment, parse_comment
from controller.slurm.record import SlurmJob
from tests.sim.sched import Scheduler, VirtualClock

CLUSTER = "sim"
USER = "dispatch"  # the one Slurm user of every deployment
NODES = ("n1", "n2", "n3", "n4")
ACTIVE = frozenset({"PENDING", "RUNNING"})
# how an execution may end for the policy to run the job again: Slurm killed it
SLURM_KILLS = frozenset({"NODE_FAIL", "PREEMPTED", "REQUEUED", "LOST"})


@dataclass(frozen=True, slots=True)
class Faults:
    """How often each fault happens (probabilities per call) and how long delays are."""

    read_fail: float = 0.0  # squeue fails: slurmctld unreachable
    read_slow: float = 0.0  # squeue takes read_slow_s (virtual)
    read_slow_s: tuple[float, float] = (11.0, 16.0)
    read_s: tuple[float, float] = (0.1, 1.0)  # an ordinary squeue
    acct_fail: float = 0.0  # sacct fails: slurmdbd down
    acct_lag_s: tuple[float, float] = (0.0, 30.0)  # an ended job reaches sacct after
    sbatch_refused: float = 0.0  # ErrBackPressure: a submit limit, nothing created
    sbatch_lost: float = 0.0  # TransientError, nothing created
    ack_lost: float = 0.0  # the job is created, the caller gets TransientError
    ack_late: float = 0.0  # the job is created, the answer comes ack_late_s later
    ack_late_s: tuple[float, float] = (20.0, 90.0)
    visible_late: float = 0.0  # a new job shows in squeue only visible_late_s later
    visible_late_s: tuple[float, float] = (5.0, 40.0)
    write_fail: float = 0.0  # scancel/scontrol: TransientError, nothing done
    min_job_age_s: float = 60.0  # an ended job leaves squeue this long after its end


QUIET = Faults(acct_lag_s=(0.0, 5.0))  # the end of every seed: nothing fails


@dataclass(eq=False)
class SimJob:
    """One Slurm job as slurmctld holds it, plus what only the ground truth knows
    (``deployment``, ``submitter``)."""

    slurm_id: int
    name: str
    comment: str
    submission: int
    attempt: int
    deployment: str
    submitter: str
    submitter_tick: int  # which of the submitter's ticks
    submit: int
    created: int  # the sbatch's place in the order of events (``Scheduler.next_seq``)
    gated: bool
    visible_at: float
    state: str = "PENDING"  # Slurm's base state
    begin: int | None = None  # eligible (begin) time: a dispatch hold is far ahead
    restart: int = 0
    start: int | None = None
    end: int | None = None
    ended_at: float | None = None  # virtual time of the end
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    killed_by: str | None = None  # the requester of a cancel (sacct)
    lost: bool = False  # slurmctld lost it: gone from squeue
    flushed: bool = False  # ... and slurmdbd's flush recorded it cancelled, no requester
    acct_at: float | None = None  # its accounting record is readable from then on
    ran: bool = False  # its batch step started (its output file exists)
    execution: Execution | None = None  # the execution in progress

    @property
    def active(self) -> bool:
        return self.state in ACTIVE and not self.lost

    def record(self, *, accounting: bool) -> SlurmJob:
        """The job as squeue (or sacct) prints it, for the production classifier."""
        if self.state == "PENDING":
            reason = ("JobHeldUser" if self.gated else
                      "BeginTime" if self.begin is not None else "Priority")
        elif self.state == "FAILED":
            reason = "NonZeroExitCode"
        else:
            reason = "None"
        flushed = accounting and self.flushed
        return SlurmJob(
            job_id=self.slurm_id, name=self.name, user=USER,
            base_state="CANCELLED" if flushed else self.state, flags=(), reason=reason,
            description="", comment=self.comment, submit_time=self.submit,
            eligible_time=self.begin if self.begin is not None else self.submit,
            start_time=self.start, end_time=self.end, preempt_time=None,
            restart_count=None if accounting else self.restart, nodes=self.nodes,
            return_code=self.exit_code, signal=None, time_limit_s=3600, requeue=False,
            cluster=CLUSTER, kill_request_user=None if flushed else self.killed_by,
            requester_recorded=accounting, state_text=self.state)


@dataclass(eq=False)
class Execution:
    """A job that really ran: from the moment Slurm started it to its end."""

    name: str  # dj-<ULID>
    deployment: str
    job: SimJob = field(repr=False)
    started: float
    ended: float | None = None
    ended_seq: int = 0  # its end's place in the order of events
    how: str | None = None  # the base state it ended in (or REQUEUED, LOST)

    @property
    def slurm_id(self) -> int:
        return self.job.slurm_id

    @property
    def submission(self) -> int:
        return self.job.submission


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one squeue read saw: the jobs (by ``id()``) that were running or queued."""

    seq: int
    reader: str
    tick: int  # which of the reader's ticks
    tick_began: int  # when that tick began
    active: frozenset[int]


@dataclass(frozen=True, slots=True)
class Write:
    """A Slurm write that acted (or an sbatch that created a job)."""

    t: float
    writer: str
    deployment: str
    op: str  # sbatch, cancel, hold, release
    slurm_id: int
    name: str
    owner: str  # the deployment the written job belongs to
    ref_submit: int  # the submit time of the ref written to
    made: int  # when the written job was made (``SimJob.created``)


class Caller(Protocol):
    """A replica as the model sees it."""

    name: str
    deployment: str
    ticks: int  # ticks begun: the tick in flight is the last
    tick_began: int  # when the last tick began (``Scheduler.next_seq``)

    def guard(self) -> None:
        """The production write guard (``Lease.guard``): raises ``LeaseLost``."""


class Observer(Protocol):
    """Told of every write and every execution as it happens (the invariants)."""

    def on_write(self, write: Write, caller: Caller) -> None: ...

    def on_execution(self, execution: Execution, earlier: Sequence[Execution]) -> None: ...


@dataclass
class _Checkpoint:
    next_id: int
    jobs: int  # how many jobs had been made (the later ones are not in the state saved)


@dataclass
class Cluster:
    """slurmctld and slurmdbd of one cluster (module docstring)."""

    sched: Scheduler
    clock: VirtualClock
    rng: random.Random
    faults: Faults
    observer: Observer | None = None
    jobs: list[SimJob] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    reads: list[Snapshot] = field(default_factory=list)
    # ownership markers on the Slurm host's file system, by deployment id
    markers: dict[str, str] = field(default_factory=dict)
    next_id: int = 1
    checkpoint: _Checkpoint = field(default_factory=lambda: _Checkpoint(1, 0))

    # ------------------------------------------------------------ what slurmctld holds

    def now(self) -> int:
        return int(self.clock.wall())

    def in_squeue(self, job: SimJob) -> bool:
        if job.lost or job.visible_at > self.clock.t:
            return False
        return job.state in ACTIVE or (
            job.ended_at is not None and self.clock.t < job.ended_at + self.faults.min_job_age_s)

    def current(self, slurm_id: int) -> SimJob | None:
        """The job slurmctld knows by this id now (ids are reused after a state loss)."""
        for job in reversed(self.jobs):
            if job.slurm_id == slurm_id and not job.lost:
                return job if self.in_squeue(job) else None
        return None

    def live(self) -> list[SimJob]:
        """Every job squeue shows now."""
        return [job for job in self.jobs if self.in_squeue(job)]

    def _chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    def _span(self, bounds: tuple[float, float]) -> float:
        return self.rng.uniform(*bounds)

    # ------------------------------------------------------------ reads

    async def find_many(self, who: Caller, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None) -> dict[str, list[ObjectObs]]:
        await self.sched.point(who.name, "squeue")
        now = self.now()
        live = self.live()
        seen = [classify(job.record(accounting=False), source=Source.LIVE, cluster=CLUSTER,
                         now=now) for job in live]
        snapshot = Snapshot(self.sched.next_seq(), who.name, who.ticks, who.tick_began,
                            frozenset(id(job) for job in live if job.active))
        slow = self._chance(self.faults.read_slow)
        took = self._span(self.faults.read_slow_s if slow else self.faults.read_s)
        fail = self._chance(self.faults.read_fail)
        self.sched.log(who.name, f"squeue snapshot: {len(seen)} jobs"
                       + (f", slow ({took:.0f}s)" if slow else "") + (", fails" if fail else ""))
        await self.sched.point(who.name, "squeue answer")
        self.clock.advance(took)
        if fail:
            raise TransientError("squeue: slurmctld unreachable (sim)")
        self.reads.append(snapshot)  # (what the reader learnt)
        found: dict[str, list[ObjectObs]] = {job_id: [] for job_id in job_ids}
        for obs in seen:
            job_id = obs.ref.uid[3:]
            if job_id in found:
                found[job_id].append(obs)
            elif strays is not None:
                strays.setdefault(job_id, []).append(obs)
        return found

    async def inspect_many(self, who: Caller, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]:
        await self.sched.point(who.name, "sacct")
        now = self.now()
        out: dict[ObjectRef, ObjectObs] = {}
        for ref in refs:
            for job in reversed(self.jobs):
                if (job.acct_at is None or job.acct_at > self.clock.t
                        or not same_object(ref, job_id=job.slurm_id, name=job.name,
                                           submit=job.submit, restart_count=None)):
                    continue
                if job.end is None or job.end < since:
                    break
                obs = _accounting(job, now)
                if obs is not None:
                    out[ref] = obs
                break
        fail = self._chance(self.faults.acct_fail)
        await self.sched.point(who.name, "sacct answer")
        self.clock.advance(self._span(self.faults.read_s))
        if fail:
            raise TransientError("sacct: slurmdbd unreachable (sim)")
        return out

    async def started_evidence(self, who: Caller, ref: ObjectRef, submission: int) -> bool:
        await self.sched.point(who.name, "output file")
        return any(job.name == ref.uid and job.submission == submission and job.ran
                   for job in self.jobs)

    async def missing_paths(self, who: Caller, paths: Sequence[str]) -> list[str]:
        await self.sched.point(who.name, "outputs")
        return []

    async def cluster_stats(self, who: Caller) -> ClusterStats:
        await self.sched.point(who.name, "stats")
        live = self.live()
        return ClusterStats(running=sum(1 for job in live if job.state == "RUNNING"),
                            pending=sum(1 for job in live if job.state == "PENDING"))

    async def owner_marker(self, who: Caller, deployment: str) -> str | None:
        """The deployment's ownership marker on the Slurm host's file system."""
        await self.sched.point(who.name, "read the ownership marker")
        return self.markers.get(deployment)

    async def set_owner_marker(self, who: Caller, deployment: str, token: str) -> None:
        await self.sched.point(who.name, "write the ownership marker")
        who.guard()
        self.markers[deployment] = token

    # ------------------------------------------------------------ writes

    async def start(self, who: Caller, request: StartRequest) -> ObjectRef:
        name = discovery_name(request.job_id)
        await self.sched.point(who.name, f"sbatch {name} s={request.submission}")
        if self._chance(self.faults.sbatch_refused):
            self.sched.log(who.name, f"sbatch {name} s={request.submission}: refused "
                                     "(QOSMaxSubmitJobPerUserLimit)")
            raise ErrBackPressure("sbatch: QOSMaxSubmitJobPerUserLimit (sim)")
        if self._chance(self.faults.sbatch_lost):
            self.sched.log(who.name, f"sbatch {name} s={request.submission}: lost, nothing made")
            raise TransientError("sbatch: connection reset before the job was made (sim)")
        who.guard()  # the adapter's write guard: the last moment to refuse
        late = self._span(self.faults.visible_late_s) if self._chance(
            self.faults.visible_late) else 0.0
        job = SimJob(slurm_id=self.next_id, name=name,
                     comment=format_comment(request.submission, request.attempt),
                     submission=request.submission, attempt=request.attempt,
                     deployment=who.deployment, submitter=who.name,
                     submitter_tick=who.ticks, submit=self.now(),
                     created=self.sched.next_seq(), gated=request.gate,
                     visible_at=self.clock.t + late)
        self.next_id += 1
        self.jobs.append(job)
        lost = self._chance(self.faults.ack_lost)
        slow = self._span(self.faults.ack_late_s) if self._chance(self.faults.ack_late) else 0.0
        self.sched.log(who.name, f"sbatch {name} s={request.submission}: Slurm job "
                                 f"{job.slurm_id}" + (" gated" if job.gated else "")
                       + (f", squeue shows it in {late:.0f}s" if late else "")
                       + (", the answer is lost" if lost else "")
                       + (f", answered in {slow:.0f}s" if slow else ""))
        self._wrote(who, "sbatch", job)
        await self.sched.point(who.name, f"sbatch answer {job.slurm_id}")
        self.clock.advance(slow)
        if lost:
            raise TransientError("sbatch: connection dropped after sbatch (sim)")
        return ObjectRef(CLUSTER, name, job.slurm_id, job.submit)

    def _identified(self, ref: ObjectRef, op: str) -> SimJob | None:
        """The adapter's identity check: the job read now is ``ref``'s object, ours."""
        job = self.current(ref.id) if ref.cluster == CLUSTER else None
        if job is None or not same_object(ref, job_id=job.slurm_id, name=job.name,
                                          submit=job.submit, restart_count=job.restart):
            return None
        if parse_comment(job.comment) is None:
            return None
        return job

    def _wrote(self, who: Caller, op: str, job: SimJob, ref: ObjectRef | None = None) -> None:
        write = Write(self.clock.t, who.name, who.deployment, op, job.slurm_id, job.name,
                      job.deployment, job.submit if ref is None else ref.submit, job.created)
        self.writes.append(write)
        if self.observer is not None:
            self.observer.on_write(write, who)

    async def stop(self, who: Caller, ref: ObjectRef) -> None:
        await self.sched.point(who.name, f"scancel {ref.id}")
        job = self._identified(ref, "stop")
        if job is None:
            self.sched.log(who.name, f"scancel {ref.id} ({ref.uid}): identity fails, nothing done")
            return
        if not job.active:
            return
        if self._chance(self.faults.write_fail):
            raise TransientError(f"scancel {ref.id}: slurmctld unreachable (sim)")
        who.guard()
        self.sched.log(who.name, f"scancel {ref.id} ({ref.uid}, {job.deployment}'s)")
        self._wrote(who, "cancel", job, ref)
        self.end(job, "CANCELLED", killed_by=USER)
        await self.sched.point(who.name, f"scancel confirm {ref.id}")

    async def hold(self, who: Caller, ref: ObjectRef, instance: int) -> None:
        await self.sched.point(who.name, f"hold {ref.id}")
        job = self._identified(ref, "hold")
        if job is None:
            raise ErrNotFound(f"hold: no job {ref.id} named {ref.uid} submitted at {ref.submit}")
        if job.state != "PENDING":
            raise ErrConflict(f"hold: job {ref.id} is {job.state}; only a pending job can be "
                              "held")
        if self._chance(self.faults.write_fail):
            raise TransientError(f"hold {ref.id}: slurmctld unreachable (sim)")
        who.guard()
        self.sched.log(who.name, f"hold {ref.id} ({ref.uid}) instance {instance}")
        self._wrote(who, "hold", job, ref)
        job.begin = encode_hold(job.submit, instance)
        await self.sched.point(who.name, f"hold confirm {ref.id}")

    async def release(self, who: Caller, ref: ObjectRef) -> None:
        await self.sched.point(who.name, f"release {ref.id}")
        job = self._identified(ref, "release")
        if job is None:
            raise ErrNotFound(f"release: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit}")
        if job.state != "PENDING":
            return
        held = job.begin is not None and decode_hold(job.begin, job.submit) is not None
        if not held and not (job.gated and job.restart == 0):
            return
        if self._chance(self.faults.write_fail):
            raise TransientError(f"release {ref.id}: slurmctld unreachable (sim)")
        who.guard()
        self.sched.log(who.name, f"release {ref.id} ({ref.uid})")
        self._wrote(who, "release", job, ref)
        job.begin = None
        job.gated = False
        await self.sched.point(who.name, f"release confirm {ref.id}")

    # ------------------------------------------------------------ the cluster itself

    def runnable(self) -> list[SimJob]:
        return [job for job in self.jobs if job.state == "PENDING" and not job.lost
                and not job.gated and job.begin is None and self.in_squeue(job)]

    def running(self) -> list[SimJob]:
        return [job for job in self.jobs if job.state == "RUNNING" and not job.lost]

    def run(self, job: SimJob) -> None:
        """Slurm starts a pending job: an execution begins."""
        job.state = "RUNNING"
        job.start = self.now()
        job.nodes = (NODES[job.slurm_id % len(NODES)],)
        job.ran = True
        earlier = [e for e in self.executions
                   if e.name == job.name and e.deployment == job.deployment]
        execution = Execution(job.name, job.deployment, job, self.clock.t)
        job.execution = execution
        self.executions.append(execution)
        self.sched.log("slurm", f"job {job.slurm_id} ({job.name}, {job.deployment}'s, "
                                f"s={job.submission}) starts running")
        if self.observer is not None:
            self.observer.on_execution(execution, earlier)

    def end(self, job: SimJob, state: str, *, exit_code: int | None = None,
            killed_by: str | None = None) -> None:
        job.state = state
        job.end = self.now()
        job.ended_at = self.clock.t
        job.exit_code = exit_code
        job.killed_by = killed_by
        job.acct_at = self.clock.t + self._span(self.faults.acct_lag_s)
        self._finish(job, state)

    def _finish(self, job: SimJob, how: str) -> None:
        execution = job.execution
        if execution is not None:
            execution.ended = self.clock.t
            execution.ended_seq = self.sched.next_seq()
            execution.how = how
            job.execution = None

    def requeue(self, job: SimJob) -> None:
        """Slurm requeues a running job (node failure with --requeue, or an admin): the
        same job pending again, a new submit time, one more restart."""
        self._finish(job, "REQUEUED")
        job.state = "PENDING"
        job.restart += 1
        job.submit = self.now()
        job.start = None
        job.nodes = ()
        self.sched.log("slurm", f"job {job.slurm_id} ({job.name}) requeued "
                                f"(restart {job.restart})")

    def save_state(self) -> None:
        self.checkpoint = _Checkpoint(self.next_id, len(self.jobs))

    def lose_state(self) -> None:
        """slurmctld restarts from its last state save: the jobs made since are gone
        (the running ones killed), their ids handed out again."""
        gone = [job for job in self.jobs[self.checkpoint.jobs:] if not job.lost]
        for job in gone:
            job.lost = True
            if job.state in ACTIVE:
                job.flushed = self.rng.random() < 0.5
                if job.flushed:
                    job.end = self.now()
                    job.acct_at = self.clock.t + self._span(self.faults.acct_lag_s)
                self._finish(job, "LOST")
        self.next_id = self.checkpoint.next_id
        self.sched.log("slurm", "slurmctld lost its state: jobs "
                       + (",".join(str(job.slurm_id) for job in gone) or "none")
                       + f" gone; the next job id is {self.next_id} again")


def _accounting(job: SimJob, now: int) -> ObjectObs | None:
    """sacct's observation of an ended job, or None when it cannot be classified yet
    (what the adapter leaves out)."""
    if job.state in ACTIVE and not job.flushed:
        return None
    record = job.record(accounting=True)
    try:
        return classify(record, source=Source.ACCOUNTING, cluster=CLUSTER, now=now)
    except Exception:  # ProtocolError: not classifiable yet, as the adapter logs it
        return None


@dataclass
class Port:
    """The ``SchedulerPort`` of one replica: the shared cluster, called as ``who``."""

    model: Cluster
    who: Caller
    cluster: str = CLUSTER

    async def start(self, request: StartRequest) -> ObjectRef:
        return await self.model.start(self.who, request)

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, list[ObjectObs]]:
        return await self.model.find_many(self.who, job_ids, strays=strays)

    async def inspect_many(self, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]:
        return await self.model.inspect_many(self.who, refs, since=since)

    async def stop(self, ref: ObjectRef) -> None:
        await self.model.stop(self.who, ref)

    async def hold(self, ref: ObjectRef, instance: int) -> None:
        await self.model.hold(self.who, ref, instance)

    async def release(self, ref: ObjectRef) -> None:
        await self.model.release(self.who, ref)

    async def missing_paths(self, paths: Sequence[str]) -> list[str]:
        return await self.model.missing_paths(self.who, paths)

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool:
        return await self.model.started_evidence(self.who, ref, submission)

    async def cluster_stats(self) -> ClusterStats:
        return await self.model.cluster_stats(self.who)

    async def owner_marker(self, deployment: str) -> str | None:
        return await self.model.owner_marker(self.who, deployment)

    async def set_owner_marker(self, deployment: str, token: str) -> None:
        await self.model.set_owner_marker(self.who, deployment, token)


