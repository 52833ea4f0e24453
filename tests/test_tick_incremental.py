"""The incremental tick never hides a change: whatever a steady tick skips (rows whose
versions did not move, jobs whose last plan was quiet, squeue rows byte-identical to the
last read) comes back the tick after anything it depends on changes -- in Slurm, in a
client's row (through the CLI's functions or plain SQL), or with the clock -- and a new
reconciler (a new leader) reads and plans everything."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from sqlalchemy import text

from controller.metrics import Metrics
from controller.model.job import Desired, JobState, Phase
from controller.model.obs import CauseKind, Source, State
from controller.reconcile.ports import ClusterStats
from controller.reconcile.tick import Reconciler, TickReport, TickSettings
from controller.runner.base import CommandResult
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.script import StartSettings
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000


def ids(n: int, base: int = 0) -> list[str]:
    return [f"01JZ8Q2N5V00000000000000{i:02d}" for i in range(base, base + n)]


@pytest.fixture
def clock() -> list[int]:
    return [NOW]


def make(store: Store, clock: list[int], fake: FakeSlurm | None = None,
         **settings: int) -> tuple[Reconciler, FakeSlurm]:
    fake = fake or FakeSlurm(clock)
    rec = Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                     settings=TickSettings(**{"unknown_grace_s": 100, "adopt_window_s": 60,
                                              **settings}))
    return rec, fake


def add(store: Store, job_ids: Sequence[str], *, desired: str = "run",
        policy: Mapping[str, object] | None = None) -> None:
    with store.transaction() as tx:
        for jid in job_ids:
            repo.insert_job(tx, job_id=jid, document=DOC, desired=desired, policy=policy,
                            now=1)


def views(store: Store) -> dict[str, repo.JobView]:
    with store.transaction() as tx:
        return {v.id: v for v in repo.list_jobs(tx)}


def phases(store: Store) -> dict[str, str]:
    return {k: v.phase for k, v in views(store).items()}


def status_versions(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return dict(conn.execute(text("SELECT job_id, version FROM job_status")).all())


def event_count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM events")).scalar() or 0)


async def quiet(rec: Reconciler) -> TickReport:
    """Tick until a tick plans nothing."""
    for _ in range(5):
        report = await rec.tick()
        if report.planned == 0:
            return report
    raise AssertionError("never settled")


async def settle(rec: Reconciler, fake: FakeSlurm) -> TickReport:
    """Submit, run every job, and tick until a tick plans nothing."""
    await rec.tick()
    fake.run_all_pending()
    return await quiet(rec)


async def test_steady_tick_plans_nothing_writes_nothing_reads_once(
        any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    add(any_store, ids(20))
    await settle(rec, fake)
    before = (status_versions(any_store), event_count(any_store), phases(any_store))
    fake.calls.clear()
    clock[0] += 10
    report = await rec.tick()
    assert (report.tracked, report.planned, report.skipped, report.reloaded) == (20, 0, 20, 0)
    assert not report.full_load and fake.calls == ["find_many"]
    assert (status_versions(any_store), event_count(any_store), phases(any_store)) == before
    assert set(before[2].values()) == {"running"}


async def test_status_change_in_slurm_is_acted_on_next_tick(any_store: Store,
                                                            clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    a, b = ids(2)
    add(any_store, [a, b])
    await settle(rec, fake)
    sid_a = next(s for s, fj in fake.jobs.items() if fj.obs.ref.uid == "dj-" + a)
    fake.end(sid_a, CauseKind.COMPLETED)
    report = await rec.tick()
    assert report.planned == 1 and report.skipped == 1
    assert phases(any_store) == {a: "succeeded", b: "running"}
    report = await rec.tick()
    assert report.tracked == 1 and report.planned == 0  # a finished: no longer tracked


async def test_desired_state_change_by_a_client_is_acted_on(any_store: Store,
                                                            clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    a, b = ids(2)
    add(any_store, [a, b])
    await rec.tick()  # submitted, released: pending in Slurm
    await quiet(rec)
    with any_store.transaction() as tx:
        repo.set_desired(tx, [a], Desired.HELD, now=2)
    fake.calls.clear()
    await rec.tick()
    assert fake.calls.count("hold") == 1
    await rec.tick()
    assert phases(any_store)[a] == "held"
    # plain SQL, no other column touched: the version trigger still moves
    with any_store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET desired = 'stopped' WHERE id = :id"), {"id": b})
    await rec.tick()
    assert "stop" in fake.calls
    await rec.tick()
    assert phases(any_store)[b] == "cancelled"


async def test_spec_change_by_plain_sql_is_seen(any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    (a,) = ids(1)
    add(any_store, [a])
    await settle(rec, fake)
    # same length, nothing else changes: only the version tells
    with any_store.engine.begin() as conn:
        old = conn.execute(text("SELECT spec FROM jobs WHERE id = :id"), {"id": a}).scalar()
        new = str(old).replace('"/tmp"', '"tmp/"')
        assert len(new) == len(str(old)) and new != old
        conn.execute(text("UPDATE jobs SET spec = :s WHERE id = :id"), {"s": new, "id": a})
    report = await rec.tick()
    assert report.reloaded == 1 and report.planned == 1
    view = views(any_store)[a]
    assert view.phase == "rejected" and "workdir" in view.cause_detail


async def test_spec_change_is_used_by_the_resubmission_after_backoff(
        sqlite_store: Store, clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (a,) = ids(1)
    add(sqlite_store, [a])
    await settle(rec, fake)
    (sid,) = fake.jobs
    fake.end(sid, CauseKind.NODE_LOST)
    await rec.tick()  # resubmission decided, backoff 10 s
    requests = []
    original = fake.start

    async def start(request):  # type: ignore[no-untyped-def]
        requests.append(request)
        return await original(request)

    fake.start = start  # type: ignore[method-assign]
    clock[0] += 1
    await quiet(rec)  # waiting out the backoff: quiet, skipped
    with sqlite_store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET spec = :s WHERE id = :id"),
                     {"s": json.dumps({**DOC, "command": ["echo", "again"]}), "id": a})
    clock[0] += 1
    report = await rec.tick()
    assert report.planned == 1 and not requests  # the new spec is loaded; backoff holds
    clock[0] += 60
    await rec.tick()
    (request,) = requests
    assert request.spec.command == ("echo", "again") and request.attempt == 1


async def test_policy_change_by_plain_sql_is_used(any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    (a,) = ids(1)
    add(any_store, [a])
    await settle(rec, fake)
    (sid,) = fake.jobs
    fake.jobs.pop(sid)  # gone from squeue, and sacct knows nothing of it
    await rec.tick()
    clock[0] += 10
    await rec.tick()
    view = views(any_store)[a]  # unknown, not ended: the default grace is 100 s
    assert view.phase == "running" and view.conditions[0]["reason"] == "Unknown"
    with any_store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET policy = :p WHERE id = :id"),
                     {"p": json.dumps({"unknown_grace_s": 5}), "id": a})
    await rec.tick()
    view = views(any_store)[a]
    # absent from squeue and sacct while both answer: lost (never started: resubmitted)
    assert (view.phase, view.cause) == ("pending", "lost")


async def test_rows_inserted_by_plain_sql_are_picked_up_and_validated(
        any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    add(any_store, ids(3))
    await settle(rec, fake)
    good, bad = ids(2, base=10)
    with any_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": good, "spec": json.dumps(DOC)})
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": bad, "spec": json.dumps({"command": ["x"], "workdir": "rel"})})
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES ('not-a-ulid', :spec)"),
                     {"spec": json.dumps(DOC)})
    fake.calls.clear()
    report = await rec.tick()
    assert (report.tracked, report.planned, report.skipped) == (6, 3, 3)
    assert fake.calls.count("start") == 1 and fake.calls.count("find_many") == 1
    got = views(any_store)
    assert got[good].phase == "pending" and got[good].submission == 1
    assert got[bad].phase == "rejected" and "workdir" in got[bad].cause_detail
    assert got["not-a-ulid"].phase == "rejected" and "id" in got["not-a-ulid"].cause_detail
    report = await rec.tick()
    assert report.tracked == 4


async def test_rows_rejected_even_when_slurm_is_down(sqlite_store: Store,
                                                      clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    add(sqlite_store, ids(2))
    await settle(rec, fake)
    (bad,) = ids(1, base=10)
    with sqlite_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, '{not json')"), {"id": bad})
    fake.fail_live = True
    report = await rec.tick()
    assert not report.slurm_ok and phases(sqlite_store)[bad] == "rejected"


async def test_backoff_expiry_is_acted_on_while_the_job_is_skipped(
        any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    (a,) = ids(1)
    add(any_store, [a])
    await settle(rec, fake)
    (sid,) = fake.jobs
    fake.end(sid, CauseKind.NODE_LOST)
    await rec.tick()
    with any_store.transaction() as tx:
        (loaded,) = repo.load_tracked(tx, "lab")
    not_before = loaded.state.not_before
    assert not_before is not None and not_before > clock[0] + 2
    await quiet(rec)
    while clock[0] + 1 < not_before:
        clock[0] += 1
        report = await rec.tick()
        assert report.planned == 0 and fake.calls.count("start") == 1
    clock[0] = not_before
    report = await rec.tick()
    assert report.planned == 1 and fake.calls.count("start") == 2


async def test_unknown_grace_passing_is_acted_on(any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    (a,) = ids(1)
    add(any_store, [a])
    await settle(rec, fake)
    (sid,) = fake.jobs
    fake.jobs.pop(sid)
    fake.fail_accounting = True
    await rec.tick()
    assert phases(any_store)[a] == "running"  # unknown, not ended
    clock[0] += 99
    await rec.tick()
    assert phases(any_store)[a] == "running"
    clock[0] += 2
    await rec.tick()
    view = views(any_store)[a]
    assert (view.phase, view.cause) == ("failed", "unknown")


async def test_intent_is_abandoned_after_the_adopt_window(sqlite_store: Store,
                                                          clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (a,) = ids(1)
    add(sqlite_store, [a])
    fake.crash_after_sbatch = True
    await rec.tick()  # intent committed; the Slurm job vanishes before anyone saw it
    fake.crash_after_sbatch = False
    fake.jobs.clear()
    for _ in range(3):
        clock[0] += 10
        await rec.tick()
    assert fake.calls.count("start") == 1
    clock[0] += 40  # 70 s after the intent: past the 60 s window
    await rec.tick()
    assert fake.calls.count("start") == 2
    with sqlite_store.transaction() as tx:
        assert [s.status for s in repo.list_submissions(tx, a)] == ["abandoned", "submitted"]


async def test_stale_running_job_is_flagged_when_its_time_limit_passes(
        sqlite_store: Store, clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (a,) = ids(1)
    add(sqlite_store, [a], policy={"stale_grace_s": 30})
    await rec.tick()
    (sid,) = fake.jobs
    fake.run(sid)
    fake.jobs[sid].obs = replace(fake.jobs[sid].obs, time_limit_s=60)
    await quiet(rec)
    stale = rec.metrics.stale
    while clock[0] + 5 <= NOW + 90:  # stale once past start + limit + grace
        clock[0] += 5
        assert (await rec.tick()).planned == 0
        assert stale._value.get() == 0
    clock[0] += 5
    assert (await rec.tick()).planned == 1
    assert stale._value.get() == 1
    await quiet(rec)
    assert stale._value.get() == 1
    (view,) = views(sqlite_store).values()
    assert any(c["type"] == "Stale" and c["status"] for c in view.conditions)


async def test_down_nodes_change_replans_running_jobs(sqlite_store: Store,
                                                      clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    add(sqlite_store, ids(2))
    await settle(rec, fake)
    rec.cluster_stats = ClusterStats(running=2, pending=0, down_nodes=frozenset({"n1"}))
    report = await rec.tick()
    assert report.planned == 2 and rec.metrics.stale._value.get() == 2
    await quiet(rec)
    assert rec.metrics.stale._value.get() == 2
    rec.cluster_stats = ClusterStats(running=2, pending=0)
    assert (await rec.tick()).planned == 2
    await quiet(rec)
    assert rec.metrics.stale._value.get() == 0


async def test_replan_safety_net(sqlite_store: Store, clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock, replan_s=100)
    add(sqlite_store, ids(4))
    await settle(rec, fake)
    planned = 0
    for _ in range(20):
        clock[0] += 10
        planned += (await rec.tick()).planned
    assert planned >= 4  # each job planned again within 2 * replan_s, nothing hidden


async def test_a_new_reconciler_reads_and_plans_everything(any_store: Store,
                                                           clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    add(any_store, ids(5))
    await settle(rec, fake)
    rec2, _ = make(any_store, clock, fake=fake)
    report = await rec2.tick()
    assert report.full_load and (report.tracked, report.planned) == (5, 5)
    assert report.reloaded == 5
    assert (await rec2.tick()).planned == 0
    rec2.forget()
    assert (await rec2.tick()).planned == 5


async def test_another_writer_of_a_status_row_is_noticed(any_store: Store,
                                                         clock: list[int]) -> None:
    """Another leader (or an operator) wrote a status: the version moved, it is reread."""
    rec, fake = make(any_store, clock)
    a, b = ids(2)
    add(any_store, [a, b])
    await settle(rec, fake)
    with any_store.engine.begin() as conn:
        conn.execute(text("UPDATE job_status SET reason = 'edited' WHERE job_id = :id"),
                     {"id": a})
    report = await rec.tick()
    assert (report.reloaded, report.planned, report.skipped) == (1, 1, 1)
    assert views(any_store)[a].reason != "edited"  # planned again from the world


async def test_deleted_job_is_forgotten(any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    a, b = ids(2)
    add(any_store, [a, b])
    await settle(rec, fake)
    with any_store.engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": a})
    report = await rec.tick()
    assert report.tracked == 1 and rec.metrics.tracked._value.get() == 1
    assert phases(any_store) == {b: "running"}


async def test_without_version_triggers_every_job_is_planned(sqlite_store: Store,
                                                             clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    add(sqlite_store, ids(3))
    await settle(rec, fake)
    with sqlite_store.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER jobs_version_update"))
    report = await rec.tick()
    assert report.full_load and report.planned == 3
    assert (await rec.tick()).planned == 3


async def test_small_plan_chunks_give_the_same_outcome(sqlite_store: Store,
                                                       clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock, plan_chunk=3)
    add(sqlite_store, ids(10))
    report = await rec.tick()
    assert report.planned == 10 and fake.calls.count("start") == 10
    assert fake.calls.count("find_many") == 1
    fake.run_all_pending()
    await rec.tick()
    assert set(phases(sqlite_store).values()) == {"running"}
    for sid in list(fake.jobs)[:4]:
        fake.jobs.pop(sid)  # four leave squeue: one accounting read for all of them
    fake.calls.clear()
    await rec.tick()
    assert fake.calls == ["find_many", "inspect_many"]


def gauges(metrics: Metrics) -> list[str]:
    names = ("dispatch_jobs{", "dispatch_job_objects{", "dispatch_jobs_stale{",
             "dispatch_oldest_pending_seconds{", "dispatch_tracked_jobs{")
    return sorted(line for line in generate_latest(metrics.registry).decode().splitlines()
                  if line.startswith(names))


async def test_gauges_after_skipped_ticks_match_a_full_tick(sqlite_store: Store,
                                                            clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    jobs = ids(6)
    add(sqlite_store, jobs[:4])
    add(sqlite_store, jobs[4:], desired="held")
    await rec.tick()
    sids = sorted(fake.jobs)
    fake.run(sids[0])
    fake.run(sids[1])
    fake.end(sids[1], CauseKind.COMPLETED)
    for _ in range(3):
        clock[0] += 30
        await rec.tick()
    assert (await rec.tick()).planned == 0
    fresh, _ = make(sqlite_store, clock, fake=fake)
    await fresh.tick()
    assert gauges(rec.metrics) == gauges(fresh.metrics)
    assert any(line.startswith("dispatch_oldest_pending_seconds{") and not line.endswith(" 0.0")
               for line in gauges(rec.metrics))


def test_phase_counts_match_the_join(any_store: Store) -> None:
    with any_store.transaction() as tx:
        for jid in ids(5):
            repo.insert_job(tx, job_id=jid, document=DOC, now=1)
    with any_store.transaction() as tx:
        for job, phase in zip(repo.load_tracked(tx, "lab")[:3],
                              (Phase.RUNNING, Phase.FAILED, Phase.RUNNING), strict=True):
            repo.save_status(tx, replace(job.state, phase=phase), exists=False, now=2)
    with any_store.transaction() as tx:
        assert repo.phase_counts(tx) == {"running": 2, "failed": 1, "pending": 2}


def test_a_job_deleted_without_foreign_keys_leaves_no_status(sqlite_store: Store) -> None:
    (a,) = ids(1)
    with sqlite_store.transaction() as tx:
        repo.insert_job(tx, job_id=a, document=DOC, now=1)
    with sqlite_store.transaction() as tx:
        (job,) = repo.load_tracked(tx, "lab")
        repo.save_status(tx, job.state, exists=False, now=2)
    with sqlite_store.engine.begin() as conn:
        conn.execute(text("PRAGMA foreign_keys=OFF"))
        conn.execute(text("DELETE FROM jobs"))
    with sqlite_store.transaction() as tx:
        assert repo.phase_counts(tx) == {}
    with sqlite_store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_status")).scalar() == 0


def test_versions_move_on_every_write_and_are_fresh_on_insert(any_store: Store) -> None:
    (a,) = ids(1)
    with any_store.transaction() as tx:
        repo.insert_job(tx, job_id=a, document=DOC, now=1)
    with any_store.transaction() as tx:
        ((_, v1, s1),) = repo.tracked_versions(tx)
        assert s1 is None and repo.row_versions_maintained(tx)
    with any_store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET labels = labels WHERE id = :id"), {"id": a})
    with any_store.transaction() as tx:
        ((_, v2, _),) = repo.tracked_versions(tx)
    assert v2 != v1
    with any_store.engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs"))
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, '{}')"), {"id": a})
    with any_store.transaction() as tx:
        ((_, v3, _),) = repo.tracked_versions(tx)
    assert v3 not in (v1, v2)


def test_saved_columns_are_the_status_values_in_order() -> None:
    state = JobState(job_id=ids(1)[0], generation=1, desired=Desired.RUN, spec=None)
    assert tuple(repo.status_row_values(state)) == repo.SAVED_COLUMNS


# ---------------------------------------------------------------- the adapter's row cache


class QueueRunner:
    """squeue answers from a settable text; counts commands."""

    def __init__(self) -> None:
        self.text = ""
        self.calls = 0

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        self.calls += 1
        return CommandResult(argv=tuple(argv), returncode=0, stdout=self.text, stderr="",
                             duration_s=0.0)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        raise AssertionError("no scripts")

    async def close(self) -> None:
        return None


def row(slurm_id: int, job_id: str, *, state: str = "RUNNING", end: str = "N/A",
        user: str = "dispatch", comment: str = "dispatch:s=1;a=0") -> str:
    short = {"RUNNING": "R", "COMPLETED": "CD", "PENDING": "PD"}[state]
    return (f"{slurm_id}|dj-{job_id}|{user}|{short}|{state}|None|2027-01-15T08:00:00|"
            f"2027-01-15T08:00:00|2027-01-15T08:00:10|{end}|N/A|1:00:00|0|0|0|node1|lab|"
            f"{comment}|")


def test_the_row_cache_never_hides_a_change() -> None:
    clock = [1_800_000_000.0]
    runner = QueueRunner()
    adapter = SlurmAdapter(runner, cluster="lab", user="dispatch",  # type: ignore[arg-type]
                           settings=StartSettings(output_dir="/tmp/out"),
                           clock=lambda: clock[0])
    a, b = ids(2)
    first = row(11, a) + "\n" + row(12, b) + "\n"
    runner.text = first

    def find() -> dict[str, Sequence[object]]:
        return dict(asyncio.run(adapter.find_many([a, b])))

    (obs_a,), (obs_b,) = find().values()
    again = find()
    assert again[a][0] is obs_a and again[b][0] is obs_b  # byte-identical: same objects
    # b's row changes: a new observation; a's does not move
    runner.text = row(11, a) + "\n" + row(12, b, state="COMPLETED") + "\n"
    changed = find()
    assert changed[a][0] is obs_a
    assert changed[b][0].state is State.ENDED and changed[b][0].cause.kind is CauseKind.COMPLETED
    # a row whose end time is ahead: reclassified once the clock passes it
    end = "2027-01-15T09:00:00"
    runner.text = row(11, a, state="COMPLETED", end=end) + "\n"
    (early,) = find()[a]
    assert early.end is None  # an end ahead of now says nothing
    clock[0] = 1_800_000_000 + 10 * 365 * 24 * 3600.0
    (late,) = find()[a]
    assert late is not early and late.end is not None
    # another user's row, a foreign comment: never returned / flagged, cached or not
    runner.text = row(11, a, user="mallory") + "\n" + row(12, b, comment="theirs") + "\n"
    for _ in range(2):
        got = find()
        assert not got[a] and got[b][0].foreign
    # only the last read's rows are kept
    assert len(adapter._live_rows) == 2
    runner.text = ""
    assert find() == {a: (), b: ()} and adapter._live_rows == {}
    assert runner.calls == 8
    assert all(o.source is Source.LIVE for o in changed[b])
