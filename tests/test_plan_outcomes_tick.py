"""The tick notes action outcomes and gives them to the next plan (it writes no status)."""

from __future__ import annotations

import json

import pytest

from controller.errors import DispatchError, ErrBackPressure, ErrInvalid
from controller.metrics import Metrics
from controller.model.obs import CauseKind, ObjectRef, StartRequest
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeSlurm

JOB = "01JZ8Q2N5V0000000000000000"
DOC = {"command": ["true"], "workdir": "/tmp"}


class RefusingSlurm(FakeSlurm):
    def __init__(self, clock: list[int], error: DispatchError) -> None:
        super().__init__(clock)
        self.error: DispatchError | None = error
        self.missing: list[str] = []

    async def start(self, request: StartRequest) -> ObjectRef:
        if self.error is not None:
            self.calls.append("start-refused")
            raise self.error
        return await super().start(request)

    async def missing_paths(self, paths: object) -> list[str]:
        return list(self.missing)


def setup(store: Store, error: DispatchError, policy: dict[str, object] | None = None
          ) -> tuple[Reconciler, RefusingSlurm, list[int]]:
    clock = [1_800_000_000]
    fake = RefusingSlurm(clock, error)
    rec = Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                     settings=TickSettings(unknown_grace_s=100, adopt_window_s=60))
    with store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document=DOC, policy=policy, now=1)
    return rec, fake, clock


def view(store: Store) -> repo.JobView:
    with store.transaction() as tx:
        (v,) = repo.list_jobs(tx, job_id=JOB)
    return v


async def test_refused_submission_fails_on_the_next_plan(sqlite_store: Store) -> None:
    rec, _, _ = setup(sqlite_store, ErrInvalid("invalid partition"))
    report = await rec.tick()
    assert report.replan_soon
    assert view(sqlite_store).phase == "pending"  # the tick wrote no status itself
    report = await rec.tick()
    v = view(sqlite_store)
    assert (v.phase, v.cause) == ("failed", "unrunnable") and not report.replan_soon


async def test_back_pressure_defers_and_submits_when_room_appears(sqlite_store: Store) -> None:
    rec, fake, clock = setup(sqlite_store, ErrBackPressure("QOSMaxSubmitJobPerUserLimit"))
    await rec.tick()
    await rec.tick()
    v = view(sqlite_store)
    assert v.phase == "pending" and v.cause != CauseKind.UNRUNNABLE.value
    assert any(c["type"] == "SubmitDeferred" for c in v.conditions)
    fake.error = None
    clock[0] += 10
    await rec.tick()
    assert fake.calls.count("start") == 1 and len(fake.jobs) == 1
    with sqlite_store.transaction() as tx:
        statuses = [s.status for s in repo.list_submissions(tx, JOB)]
    assert statuses[0] == "abandoned" and len(statuses) == 2


@pytest.mark.parametrize(("missing", "want"), [([], "succeeded"), (["/o"], "pending")])
async def test_outputs_are_checked_then_decided_by_the_plan(sqlite_store: Store,
                                                            missing: list[str],
                                                            want: str) -> None:
    rec, fake, _ = setup(sqlite_store, ErrInvalid("unused"), {"expected_outputs": ["/o"]})
    fake.error = None
    fake.missing = missing
    await rec.tick()
    (sid,) = fake.jobs
    fake.run(sid)
    await rec.tick()
    fake.end(sid, CauseKind.COMPLETED)
    await rec.tick()  # plans VerifyOutputs; the tick checks
    assert view(sqlite_store).phase == "running"
    await rec.tick()  # the plan decides from the outcome
    v = view(sqlite_store)
    assert v.phase == want
    if missing:
        assert v.cause == "missing-output"
    assert json.dumps(v.to_json())
