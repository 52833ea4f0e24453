"""Action outcomes come back as observations: the planner, not the tick, decides from them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.model.job import Current, Desired, JobState, Phase
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, Provenance, Source, State
from controller.model.policy import parse_policy
from controller.model.spec import parse_job_document
from controller.reconcile.plan import (
    Cancel,
    Observed,
    Outcome,
    OutcomeKind,
    PlanContext,
    Submit,
    VerifyOutputs,
    no_object_yet,
    plan,
    sweep,
)

JOB = "01JZ8Q2N5V0000000000000000"
OTHER = "01JZ8Q2N5V0000000000000001"
NOW = 1_800_000_000
SPEC = parse_job_document({"command": ["true"], "workdir": "/tmp"})
CTX = PlanContext(now=NOW)


def obs(job_id: str, state: State, *, slurm_id: int = 100, foreign: bool = False,
        cause: CauseKind = CauseKind.NONE) -> ObjectObs:
    ref = ObjectRef("lab", "dj-" + job_id, slurm_id, NOW - 50)
    return ObjectObs(ref=ref, state=state, cause=Cause(cause, Provenance.SLURM, ""),
                     submission=1, attempt=0, foreign=foreign, restart_count=0,
                     hold_instance=None, requeued=False, exit_code=None, nodes=("n1",),
                     reason="", submit=NOW - 50, start=None, end=None, source=Source.LIVE,
                     observed_at=NOW)


def intent(**kw: object) -> JobState:
    base = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC, submission=1,
                    current=Current(1, 0, NOW - 5, None))
    return replace(base, **kw)  # type: ignore[arg-type]


def test_refused_submission_fails_the_job_unrunnable() -> None:
    p = plan(intent(), Observed(outcomes=(Outcome(OutcomeKind.SUBMIT_REFUSED, 1, "bad"),)),
             CTX)
    assert p.status.phase == Phase.FAILED and p.status.current is None
    assert p.status.cause.kind == CauseKind.UNRUNNABLE
    assert [(u.submission, u.status) for u in p.submissions] == [(1, "abandoned")]
    assert p.actions == ()


@pytest.mark.parametrize("desired", [Desired.RUN, Desired.HELD])
def test_deferred_submission_backs_off_without_spending_budget(desired: Desired) -> None:
    p = plan(intent(desired=desired),
             Observed(outcomes=(Outcome(OutcomeKind.SUBMIT_DEFERRED, 1, "limit"),)), CTX)
    st = p.status
    assert st.phase in (Phase.PENDING, Phase.HELD) and st.phase != Phase.FAILED
    assert st.current is None and st.budgets_used == {} and st.attempt == 0
    assert st.not_before == NOW + 10
    assert [e.kind for e in p.events] == ["SubmitDeferred"]
    assert [(u.submission, u.status) for u in p.submissions] == [(1, "abandoned")]
    # at the deadline it submits again, with the next submission number
    (submit,) = plan(st, Observed(), replace(CTX, now=NOW + 10)).actions
    assert isinstance(submit, Submit) and submit.submission == 2


def test_deferral_backoff_grows_with_the_streak_and_is_capped() -> None:
    first = plan(intent(), Observed(outcomes=(Outcome(OutcomeKind.SUBMIT_DEFERRED, 1),)),
                 CTX).status
    again = replace(first, submission=2, current=Current(2, 0, NOW + 590, None))
    p = plan(again, Observed(outcomes=(Outcome(OutcomeKind.SUBMIT_DEFERRED, 2),)),
             replace(CTX, now=NOW + 600))
    assert p.status.not_before == NOW + 600 + 600
    long_ago = replace(again, conditions=tuple(replace(c, since=NOW - 10**9)
                                               for c in again.conditions))
    capped = plan(long_ago, Observed(outcomes=(Outcome(OutcomeKind.SUBMIT_DEFERRED, 2),)),
                  replace(CTX, now=NOW + 600))
    assert capped.status.not_before == NOW + 600 + 3600


def test_outcome_of_another_submission_is_ignored() -> None:
    p = plan(intent(), Observed(outcomes=(Outcome(OutcomeKind.SUBMIT_REFUSED, 7, "old"),)),
             CTX)
    assert p.status.phase == Phase.PENDING and p.status.current is not None


def _completed(job: JobState, *outcomes: Outcome) -> JobState:
    return plan(job, Observed(live=(obs(JOB, State.ENDED, cause=CauseKind.COMPLETED),),
                              outcomes=outcomes), CTX).status


def test_outputs_checked_by_the_tick_then_decided_by_the_plan() -> None:
    policy = parse_policy({"expected_outputs": ["/data/out"]})
    running = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC, policy=policy,
                       submission=1, current=Current(1, 0, NOW - 50, obs(JOB, State.RUNNING).ref))
    done = Observed(live=(obs(JOB, State.ENDED, cause=CauseKind.COMPLETED),))
    first = plan(running, done, CTX)
    assert [type(a) for a in first.actions] == [VerifyOutputs]
    present = plan(first.status, replace(done, outcomes=(
        Outcome(OutcomeKind.OUTPUTS_PRESENT, 1),)), CTX)
    assert present.status.phase == Phase.SUCCEEDED and present.status.outputs_verified
    missing = plan(first.status, replace(done, outcomes=(
        Outcome(OutcomeKind.OUTPUTS_MISSING, 1, paths=("/data/out",)),)), CTX)
    assert missing.status.cause.kind == CauseKind.MISSING_OUTPUT
    assert missing.status.phase == Phase.PENDING  # missing-output resubmits once by default
    assert missing.status.budgets_used == {"missing-output": 1}


@pytest.mark.parametrize(("tracked", "known", "cancelled", "unowned", "again"), [
    pytest.param(set(), {OTHER}, [7], [], [], id="known-finished-or-deleted-cancelled"),
    pytest.param(set(), set(), [], [7], [], id="never-ours-a-neighbours-untouched"),
    pytest.param({OTHER}, {OTHER}, [], [], [OTHER], id="tracked-again-left-to-its-plan"),
])
def test_the_sweep_writes_only_what_this_database_knows(
        tracked: set[str], known: set[str], cancelled: list[int], unowned: list[int],
        again: list[str]) -> None:
    strays = {OTHER: [obs(OTHER, State.GATED, slurm_id=7),
                      obs(OTHER, State.RUNNING, slurm_id=8, foreign=True),
                      obs(OTHER, State.ENDED, slurm_id=9, cause=CauseKind.COMPLETED)]}
    decided = sweep(strays, tracked=tracked, known=known)
    assert [c.ref.id for c in decided.cancels] == cancelled
    assert all(isinstance(c, Cancel) and c.cause == CauseKind.DUPLICATE
               for c in decided.cancels)
    assert [o.ref.id for o in decided.unowned] == unowned
    assert list(decided.tracked) == again


@pytest.mark.parametrize(("kwargs", "expected"), [
    pytest.param({}, True, id="unseen-new-row"),
    pytest.param({"has_status": True}, False, id="has-a-status"),
    pytest.param({"last_read": None}, False, id="nothing-read-yet"),
    pytest.param({"last_read": {JOB}}, False, id="seen-in-the-last-read"),
    pytest.param({"started_since_read": {JOB}}, False, id="started-since-that-read-began"),
    pytest.param({"tombstoned": {JOB}}, False, id="written-again-after-a-delete"),
])
def test_which_new_jobs_can_have_no_object_yet(kwargs: dict[str, object],
                                               expected: bool) -> None:
    args: dict[str, object] = {"has_status": False, "last_read": set(),
                               "started_since_read": set(), "tombstoned": set(), **kwargs}
    assert no_object_yet(JOB, **args) is expected  # type: ignore[arg-type]

