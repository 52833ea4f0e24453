"""The invariants, checked at the moment each could break (a Slurm write, a job starting
to run, a committed database write, the end of a tick) and at the end of every seed:

(a) no job runs twice: a second execution of one ``dj-<ULID>`` while the first runs, or
    after it ended, unless Slurm killed the first (node failure, preemption, requeue,
    state loss: the recovery policy may run it again) or a client wrote the row again
    after the first ended;
(b) a gate or hold is lifted (Release) only on the Slurm job the database records as the
    job's current object (unless a client deleted the row since that job was made);
(c) no write -- to Slurm, or a committed write to ``job_status``, ``submissions`` or
    ``events`` -- by a replica after the lease epoch its tick began under ended (the
    lease row has moved on, or expired);
(d) no write to a Slurm job this database does not own: another deployment's job, or a
    job of a ULID this database never had;
(e) once faults stop (the quiet phase), every job ends as its row asks and no job of the
    deployment is left running without a row;
and two liveness rules: a job whose row says stopped and whose Slurm job runs is
cancelled within ``STOP_TICKS`` clean ticks (each read Slurm, met no error), also while
new rows keep arriving; and once the world is quiet and settled, ``replan_soon`` turns
false within ``QUIET_TICKS`` ticks (else the shard ticks back to back forever).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tests.sim.cluster import SLURM_KILLS, Caller, Cluster, Execution, SimJob, Write
from tests.sim.world import Database, Replica, TickReport

STOP_TICKS = 4
QUIET_TICKS = 3
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str  # a, b, c, d, e, stop-liveness, replan-liveness, crash
    t: float
    text: str


@dataclass
class History:
    """What the clients did, by (deployment, job id): the ground truth of the rows, each
    write at its place in the order of events (``Scheduler.next_seq``)."""

    inserted: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    deleted: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    stopped: set[tuple[str, str]] = field(default_factory=set)  # ever asked to stop

    def known(self, deployment: str, job_id: str) -> bool:
        return (deployment, job_id) in self.inserted

    def inserts(self, deployment: str, job_id: str, after: int,
                before: float = float("inf")) -> list[int]:
        return [seq for seq in self.inserted.get((deployment, job_id), ()) if after < seq < before]

    def deleted_after(self, deployment: str, job_id: str, after: int) -> bool:
        return any(seq > after for seq in self.deleted.get((deployment, job_id), ()))


class Invariants:
    """Receives the world's events and keeps the violations found."""

    def __init__(self, cluster: Cluster, databases: dict[str, Database], history: History,
                 *, alias: Callable[[str], str]) -> None:
        self.cluster = cluster
        self.databases = databases
        self.history = history
        self.alias = alias
        self.found: list[Violation] = []
        # (deployment, job id) -> clean ticks that left its stopped job running
        self._stop_ticks: dict[tuple[str, str], int] = {}
        # replica name -> the stopped jobs with a running Slurm job when its tick began
        self._stopped_at_begin: dict[str, dict[str, list[int]]] = {}
        # (deployment, epoch) -> the replica that took it, as the driver saw it
        self.epochs: dict[tuple[str, int], str] = {}

    def note_epoch(self, deployment: str, epoch: int | None, holder: str) -> None:
        if epoch is not None:
            self.epochs.setdefault((deployment, epoch), holder)

    def _since(self, deployment: str, epoch: int | None) -> str:
        """Who took the epochs after ``epoch``."""
        later = sorted((e, holder) for (dep, e), holder in self.epochs.items()
                       if dep == deployment and epoch is not None and e > epoch)
        return "; since then " + ", ".join(f"{holder} took epoch {e}" for e, holder in later) \
            if later else ""

    def _violate(self, rule: str, text: str) -> None:
        self.found.append(Violation(rule, self.cluster.clock.t, self.alias(text)))

    # ------------------------------------------------------------ (b) (c) (d): writes

    def on_write(self, write: Write, caller: Caller) -> None:
        assert isinstance(caller, Replica)
        job_id = write.name[3:]
        what = f"{write.op} of Slurm job {write.slurm_id} ({write.name}, {write.owner}'s)"
        row = self.databases[write.deployment].lease()
        begun = caller.tick_epoch
        if row is None or begun is None or row.epoch != begun or row.holder != caller.name \
                or row.expires_at <= self.cluster.clock.wall():
            now = ("no lease row" if row is None else
                   f"the lease row is epoch {row.epoch} held by {row.holder}, expiring at "
                   f"t={row.expires_at - self.cluster.clock.wall() + self.cluster.clock.t:.1f}")
            self._violate("c", f"{caller.name} made a Slurm write ({what}) in a tick begun "
                               f"under epoch {begun}, holding epoch {caller.epoch}: {now}"
                               + self._since(write.deployment, begun))
        if write.owner != write.deployment or not self.history.known(write.deployment, job_id):
            self._violate("d", f"{caller.name} ({write.deployment}) made a Slurm write to a "
                               f"job its database does not own: {what}; "
                               + (f"the job belongs to deployment {write.owner}, "
                                  if write.owner != write.deployment else "")
                               + ("its database never had that ULID" if not
                                  self.history.known(write.deployment, job_id) else
                                  "though its database had that ULID"))
        if write.op == "release":
            self._check_release(write, caller, job_id, what)

    def _check_release(self, write: Write, caller: Replica, job_id: str, what: str) -> None:
        if self.history.deleted_after(write.deployment, job_id, write.made):
            return  # the row went after the job was made: the sweep's business, not (b)
        status = self.databases[write.deployment].statuses().get(job_id)
        recorded = None if status is None else (status.slurm_id, status.slurm_submit)
        if recorded != (write.slurm_id, write.ref_submit):
            self._violate("b", f"{caller.name} released a ref its database does not record: "
                               f"{what}, ref submit {write.ref_submit}; the status row "
                               + ("is missing" if status is None else
                                  f"records {recorded} (phase {status.phase})"))

    # ------------------------------------------------------------ (c): database writes

    def on_db_write(self, replica: Replica, writes: list[tuple[str, int | None]]) -> None:
        begun = replica.tick_epoch
        stale = [(table, epoch) for table, epoch in writes if begun is None or epoch != begun]
        if stale:
            tables = ", ".join(dict.fromkeys(table for table, _ in stale))
            row = self.databases[replica.deployment].lease()
            self._violate("c", f"{replica.name} committed a write to {tables} fenced with "
                               f"epoch {stale[0][1]}, in a tick begun under epoch {begun} "
                               "(the lease row: " + (f"epoch {row.epoch}, {row.holder})" if row
                                                     else "none)")
                          + self._since(replica.deployment, begun))

    # ------------------------------------------------------------ (a): executions

    def on_execution(self, execution: Execution, earlier: Sequence[Execution]) -> None:
        job_id = execution.name[3:]
        for other in earlier:
            if other.ended is None:
                self._violate("a", f"{execution.name} ({execution.deployment}'s) runs twice at "
                                   f"once: Slurm job {execution.slurm_id} (submission "
                                   f"{execution.submission}) starts while Slurm job "
                                   f"{other.slurm_id} (submission {other.submission}) runs"
                                   + self._rewritten(execution, other))
                return
        if not earlier:
            return
        last = max(earlier, key=lambda e: e.ended_seq)
        assert last.ended is not None
        if last.how in SLURM_KILLS:
            return
        dep = execution.deployment
        if self.history.inserts(dep, job_id, last.ended_seq):
            return  # the row was written again after that run: a new desire
        rewrites = self.history.inserts(dep, job_id, last.job.created, last.ended_seq)
        if rewrites and not self._seen_by_submitter(execution.job, last.job, rewrites[-1]):
            # written again while its job lived, and no tick that could have planned the
            # new row (one begun after its last writing: a tick between two rewrites
            # plans the row of the one between, which a later delete ended) saw that job
            # live before it submitted again: no read could have let it adopt that job
            return
        self._violate("a", f"{execution.name} ({execution.deployment}'s) runs again: Slurm job "
                           f"{execution.slurm_id} (submission {execution.submission}) starts "
                           f"after Slurm job {last.slurm_id} (submission {last.submission}) "
                           f"ended {last.how} at t={last.ended:.1f}; neither a Slurm kill nor "
                           "a new row allows a second run" + self._rewritten(execution, last))

    def _rewritten(self, execution: Execution, earlier: Execution) -> str:
        """A note when the row was deleted and written again between the two jobs."""
        dep, job_id = execution.deployment, execution.name[3:]
        first, second = sorted((earlier.job, execution.job), key=lambda job: job.created)
        between = self.history.inserts(dep, job_id, first.created, second.created)
        if not between or not self.history.deleted_after(dep, job_id, first.created):
            return ""
        return (f" (the row was deleted and written again after Slurm job {first.slurm_id} "
                f"was made, before Slurm job {second.slurm_id} was)")

    def _seen_by_submitter(self, job: SimJob, earlier: SimJob, since: int) -> bool:
        """Whether ``job``'s submitter, in a tick begun after event ``since`` (the row
        written again), read squeue before it made ``job`` (or in the tick that made it)
        and saw ``earlier`` running or queued."""
        return any(read.reader == job.submitter and read.tick_began > since
                   and (read.seq < job.created or read.tick == job.submitter_tick)
                   and id(earlier) in read.active for read in self.cluster.reads)

    # ------------------------------------------------------------ liveness: stops

    def _stopped_running(self, deployment: str) -> dict[str, list[int]]:
        rows = self.databases[deployment].rows()
        out: dict[str, list[int]] = {}
        for job in self.cluster.jobs:
            job_id = job.name[3:]
            if job.deployment == deployment and job.active and rows.get(job_id) == "stopped" \
                    and self.cluster.in_squeue(job):
                out.setdefault(job_id, []).append(job.slurm_id)
        return out

    def on_tick_begin(self, replica: Replica) -> None:
        self._stopped_at_begin[replica.name] = self._stopped_running(replica.deployment)

    def on_tick_end(self, replica: Replica, report: TickReport | None) -> None:
        if replica.ending.startswith("tick crashed"):
            self._violate("crash", f"{replica.name}: {replica.ending}")
        before = self._stopped_at_begin.pop(replica.name, {})
        if report is None or not report.slurm_ok or not report.accounting_ok \
                or report.errors:
            return
        now = self._stopped_running(replica.deployment)
        for key in list(self._stop_ticks):
            if key[0] == replica.deployment and key[1] not in now:
                del self._stop_ticks[key]
        for job_id, ids in before.items():
            still = [i for i in now.get(job_id, ()) if i in ids]
            if not still:
                continue
            key = (replica.deployment, job_id)
            count = self._stop_ticks[key] = self._stop_ticks.get(key, 0) + 1
            if count == STOP_TICKS:
                self._violate(
                    "stop-liveness",
                    f"{job_id} (desired stopped) leaves Slurm job {still[0]} queued or running: "
                    f"{count} clean ticks did not cancel it (the last, {replica.name}'s: "
                    f"planned {report.planned}, deferred {report.deferred}, read "
                    f"{report.timings.get('read', 0.0):.1f}s, budget "
                    f"{replica.reconciler.budget_s:.0f}s)")

    # ------------------------------------------------------------ (e): the end

    def unconverged(self, deployment: str) -> list[tuple[str, bool]]:
        """Why the jobs of ``deployment`` have not ended as their rows ask (empty: they
        have), each with whether it can never change any more (a terminal phase, no
        Slurm job left: only a client could move it)."""
        db = self.databases[deployment]
        rows = db.rows()
        statuses = db.statuses()
        live: dict[str, list[str]] = {}
        for job in self.cluster.jobs:
            if job.deployment == deployment and job.active:
                how = job.state.lower() if not job.gated else "gated"
                if job.state == "PENDING" and job.begin is not None:
                    how = "held"
                live.setdefault(job.name[3:], []).append(f"{job.slurm_id} {how}")
        out: list[tuple[str, bool]] = []
        for job_id, desired in rows.items():
            status = statuses.get(job_id)
            phase = status.phase if status is not None else "(no status)"
            objects = live.pop(job_id, [])
            ok = phase in TERMINAL and not objects
            if desired == "run" and phase == "cancelled" and \
                    (deployment, job_id) not in self.history.stopped:
                ok = False
            if desired == "held" and not ok:
                ok = phase in ("held", *TERMINAL) and len(objects) <= 1 and all(
                    o.endswith(("gated", "held")) for o in objects)
            if not ok:
                out.append((f"{job_id} desired {desired}, phase {phase}, live Slurm jobs "
                            f"{objects or 'none'}", phase in TERMINAL and not objects))
        for job_id, objects in sorted(live.items()):
            out.append((f"{job_id} has no row, yet its Slurm jobs {objects} live", False))
        return out

    def check_converged(self, deployment: str) -> None:
        for why, _ in self.unconverged(deployment)[:5]:
            self._violate("e", f"{deployment} never converged: {why}")

    def check_replan(self, replica: Replica, streak: int) -> None:
        self._violate("replan-liveness",
                      f"{replica.name}: replan_soon stayed true for {streak} ticks after every "
                      f"job settled (the shard ticks back to back); outcomes kept for jobs "
                      f"{replica.pending_outcomes()}")
