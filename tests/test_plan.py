"""Table-driven tests of the pure planner: desired + observed -> status + actions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.model.job import Current, Desired, JobState, Phase
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, Provenance, Source, State
from controller.model.spec import parse_job_document
from controller.reconcile.plan import (
    Cancel,
    Hold,
    Observed,
    PlanContext,
    Release,
    Submit,
    VerifyOutputs,
    plan,
)
from controller.reconcile.policy import parse_policy

JOB = "01JZ8Q2N5V0000000000000000"
UID = "dj-" + JOB
NOW = 1_800_000_000
SPEC = parse_job_document({"command": ["true"], "workdir": "/tmp"})


def ref(slurm_id: int = 100, submit: int = NOW - 50) -> ObjectRef:
    return ObjectRef("lab", UID, slurm_id, submit)


def obs(state: State, cause: CauseKind = CauseKind.NONE, *, slurm_id: int = 100,
        submission: int | None = 1, attempt: int | None = 0, foreign: bool = False,
        hold: int | None = None, exit_code: int | None = None, nodes: tuple[str, ...] = ("n1",),
        restart: int = 0, submit: int = NOW - 50, provenance: Provenance = Provenance.SLURM,
        start: int | None = None, time_limit_s: int | None = None) -> ObjectObs:
    return ObjectObs(ref=ObjectRef("lab", UID, slurm_id, submit), state=state,
                     cause=Cause(cause, provenance, ""), submission=submission, attempt=attempt,
                     foreign=foreign, restart_count=restart, hold_instance=hold, requeued=False,
                     exit_code=exit_code, nodes=nodes, reason="", submit=submit, start=start,
                     end=None, source=Source.LIVE, observed_at=NOW, time_limit_s=time_limit_s)


def job(**kw: object) -> JobState:
    base = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC)
    return replace(base, **kw)  # type: ignore[arg-type]


def running_job(**kw: object) -> JobState:
    return job(submission=1, current=Current(1, 0, NOW - 50, ref()), **kw)


CTX = PlanContext(now=NOW, unknown_grace_s=300, adopt_window_s=120)


def kinds(actions: tuple[object, ...]) -> list[str]:
    return [type(a).__name__ for a in actions]


@pytest.mark.parametrize(("state", "observed", "want_actions", "want_phase"), [
    pytest.param(job(), Observed(), ["Submit"], Phase.PENDING, id="new-job-submits"),
    pytest.param(job(desired=Desired.HELD), Observed(), ["Submit"], Phase.HELD,
                 id="new-held-job-submits-gated-and-stays"),
    pytest.param(job(desired=Desired.STOPPED), Observed(), [], Phase.CANCELLED,
                 id="stopped-before-submit"),
    pytest.param(running_job(), Observed(live=(obs(State.GATED),)), ["Release"], Phase.PENDING,
                 id="gated-current-is-released"),
    pytest.param(running_job(desired=Desired.HELD), Observed(live=(obs(State.GATED),)), [],
                 Phase.HELD, id="gated-current-stays-when-held"),
    pytest.param(running_job(desired=Desired.HELD), Observed(live=(obs(State.PENDING),)),
                 ["Hold"], Phase.HELD, id="pending-current-is-held"),
    pytest.param(running_job(), Observed(live=(obs(State.HELD, hold=1,
                                                   provenance=Provenance.DISPATCH),)),
                 ["Release"], Phase.PENDING, id="our-hold-released-when-run"),
    pytest.param(running_job(), Observed(live=(obs(State.HELD, CauseKind.ADMIN_HOLD,
                                                   provenance=Provenance.ADMIN),)),
                 [], Phase.HELD, id="admin-hold-never-released"),
    pytest.param(running_job(), Observed(live=(obs(State.RUNNING),)), [], Phase.RUNNING,
                 id="running"),
    pytest.param(running_job(desired=Desired.STOPPED), Observed(live=(obs(State.RUNNING),)),
                 ["Cancel"], Phase.RUNNING, id="stop-running-cancels"),
    pytest.param(running_job(), Observed(live=(obs(State.ENDED, CauseKind.COMPLETED),)), [],
                 Phase.SUCCEEDED, id="completed-succeeds"),
    pytest.param(running_job(), Observed(live=(obs(State.ENDED, CauseKind.NON_ZERO_EXIT,
                                                   exit_code=3),)), [], Phase.FAILED,
                 id="non-zero-exit-fails-by-default"),
    pytest.param(running_job(), Observed(live=(obs(State.ENDED, CauseKind.NODE_LOST),)), [],
                 Phase.PENDING, id="node-lost-resubmits-after-backoff"),
    pytest.param(running_job(), Observed(live=(obs(State.ENDED, CauseKind.CANCELLED,
                                                   provenance=Provenance.USER),)), [],
                 Phase.CANCELLED, id="cancelled-by-someone-else-never-resubmitted"),
    pytest.param(running_job(desired=Desired.STOPPED),
                 Observed(live=(obs(State.ENDED, CauseKind.CANCELLED),)), [], Phase.CANCELLED,
                 id="cancelled-by-us"),
    pytest.param(running_job(), Observed(live=(obs(State.RUNNING),
                                               obs(State.PENDING, slurm_id=101, submission=2))),
                 ["Cancel"], Phase.RUNNING, id="duplicate-cancelled"),
    pytest.param(running_job(), Observed(live=(obs(State.RUNNING),
                                               obs(State.PENDING, slurm_id=7, foreign=True,
                                                   submission=None))),
                 [], Phase.RUNNING, id="foreign-never-touched"),
    pytest.param(running_job(), Observed(), [], Phase.PENDING, id="missing-is-unknown-not-done"),
    pytest.param(running_job(unknown_since=NOW - 400), Observed(accounting_ok=False), [],
                 Phase.FAILED, id="unknown-past-grace-without-accounting-ends-unknown"),
    pytest.param(running_job(unknown_since=NOW - 400), Observed(), ["CheckStarted"],
                 Phase.PENDING, id="absent-past-grace-with-accounting-asks-if-it-started"),
    pytest.param(running_job(), Observed(accounting_ok=False), [], Phase.PENDING,
                 id="accounting-down-stays-unknown"),
])
def test_plan_table(state: JobState, observed: Observed, want_actions: list[str],
                    want_phase: Phase) -> None:
    p = plan(state, observed, CTX)
    assert kinds(p.actions) == want_actions
    assert p.status.phase == want_phase


def test_submit_writes_intent_with_next_submission_number() -> None:
    p = plan(job(submission=4, attempt=2), Observed(), CTX)
    (submit,) = p.actions
    assert isinstance(submit, Submit)
    assert (submit.submission, submit.attempt, submit.release) == (5, 2, True)
    assert p.status.current is not None and p.status.current.ref is None
    assert [(u.submission, u.status) for u in p.submissions] == [(5, "intent")]


def test_intent_is_adopted_by_submission_number_before_any_new_submit() -> None:
    state = job(submission=1, current=Current(1, 0, NOW - 5, None))
    p = plan(state, Observed(live=(obs(State.GATED),)), CTX)
    assert p.status.current is not None and p.status.current.ref == ref()
    assert kinds(p.actions) == ["Release"]


def test_intent_waits_then_is_abandoned_and_resubmitted_with_a_new_number() -> None:
    state = job(submission=1, current=Current(1, 0, NOW - 5, None))
    assert kinds(plan(state, Observed(), CTX).actions) == []
    late = replace(state, current=Current(1, 0, NOW - 500, None))
    p = plan(late, Observed(), CTX)
    assert [(u.submission, u.status) for u in p.submissions] == [(1, "abandoned"), (2, "intent")]
    assert kinds(p.actions) == ["Submit"]
    assert isinstance(p.actions[0], Submit) and p.actions[0].submission == 2


def test_late_orphan_of_abandoned_intent_is_cancelled_as_duplicate() -> None:
    state = job(submission=2, current=Current(2, 0, NOW - 5, ref(200)))
    p = plan(state, Observed(live=(obs(State.PENDING, slurm_id=200, submission=2),
                                   obs(State.GATED, slurm_id=150, submission=1))), CTX)
    cancels = [a for a in p.actions if isinstance(a, Cancel)]
    assert [(c.ref.id, c.cause) for c in cancels] == [(150, CauseKind.DUPLICATE)]


def test_live_object_adopted_when_status_lost() -> None:
    p = plan(job(), Observed(live=(obs(State.RUNNING, submission=3, attempt=1),)), CTX)
    assert kinds(p.actions) == []
    assert p.status.current is not None and p.status.current.submission == 3
    assert p.status.submission == 3 and p.status.phase == Phase.RUNNING


def test_node_lost_resubmits_with_node_excluded_and_budget_spent() -> None:
    p = plan(running_job(), Observed(live=(obs(State.ENDED, CauseKind.NODE_LOST,
                                               nodes=("n7",)),)), CTX)
    st = p.status
    assert st.current is None and st.attempt == 1
    assert st.budgets_used == {"node-lost": 1}
    assert st.excluded_nodes == {"n7": NOW + 3600}
    assert st.not_before == NOW + 10
    later = plan(st, Observed(), replace(CTX, now=NOW + 11))
    (submit,) = later.actions
    assert isinstance(submit, Submit)
    assert submit.exclude == ("n7",) and submit.attempt == 1 and submit.submission == 2


def test_budget_exhausted_fails_with_last_cause() -> None:
    state = running_job(budgets_used={"node-lost": 3})
    p = plan(state, Observed(live=(obs(State.ENDED, CauseKind.NODE_LOST),)), CTX)
    assert p.status.phase == Phase.FAILED
    assert p.status.cause.kind == CauseKind.NODE_LOST
    assert any(c.type == "RetriesExhausted" for c in p.status.conditions)


def test_exit_code_list_resubmits_only_listed_codes() -> None:
    policy = parse_policy({"retry_exit_codes": [3]})
    three = plan(running_job(policy=policy),
                 Observed(live=(obs(State.ENDED, CauseKind.NON_ZERO_EXIT, exit_code=3),)), CTX)
    four = plan(running_job(policy=policy),
                Observed(live=(obs(State.ENDED, CauseKind.NON_ZERO_EXIT, exit_code=4),)), CTX)
    assert three.status.phase == Phase.PENDING and three.status.attempt == 1
    assert four.status.phase == Phase.FAILED


def test_timeout_resubmits_with_more_time_when_asked() -> None:
    spec = parse_job_document({"command": ["true"], "workdir": "/tmp",
                               "resources": {"time_limit_s": 600}})
    policy = parse_policy({"causes": {"timeout": {"action": "resubmit", "budget": 1,
                                                   "time_factor": 2}}})
    p = plan(running_job(policy=policy, spec=spec),
             Observed(live=(obs(State.ENDED, CauseKind.TIMEOUT),)), CTX)
    assert p.status.spec == spec  # the status keeps the client's spec
    assert p.status.not_before is not None
    (submit,) = plan(p.status, Observed(), replace(CTX, now=p.status.not_before)).actions
    assert isinstance(submit, Submit) and submit.spec.resources.time_limit_s == 1200


def test_expected_outputs_verified_before_success() -> None:
    policy = parse_policy({"expected_outputs": ["/data/out.txt"]})
    p = plan(running_job(policy=policy),
             Observed(live=(obs(State.ENDED, CauseKind.COMPLETED),)), CTX)
    assert kinds(p.actions) == ["VerifyOutputs"]
    assert isinstance(p.actions[0], VerifyOutputs) and p.status.phase == Phase.RUNNING
    done = plan(replace(p.status, outputs_verified=True),
                Observed(live=(obs(State.ENDED, CauseKind.COMPLETED),)), CTX)
    assert done.status.phase == Phase.SUCCEEDED


def test_stale_running_sets_condition() -> None:
    p = plan(running_job(), Observed(live=(obs(State.RUNNING, start=NOW - 4000,
                                               time_limit_s=600),)), CTX)
    assert [c.reason for c in p.status.conditions if c.type == "Stale"] == ["PastTimeLimit"]
    down = plan(running_job(), Observed(live=(obs(State.RUNNING, nodes=("n3",)),)),
                replace(CTX, down_nodes=frozenset({"n3"})))
    assert [c.reason for c in down.status.conditions if c.type == "Stale"] == ["NodeDown"]


def test_requeued_object_is_followed_with_moved_submit_time() -> None:
    moved = obs(State.PENDING, CauseKind.REQUEUED, restart=1, submit=NOW - 10)
    p = plan(running_job(), Observed(live=(moved,)), CTX)
    assert kinds(p.actions) == [] and p.status.phase == Phase.PENDING
    assert p.status.cause.kind == CauseKind.REQUEUED


def test_reused_id_with_other_submit_time_is_not_current() -> None:
    reused = obs(State.RUNNING, submit=NOW - 5, submission=2)
    p = plan(running_job(), Observed(live=(reused,)), CTX)
    assert kinds(p.actions) == ["Cancel"]  # an extra object of ours, not the current one
    assert p.status.phase == Phase.PENDING  # current unseen -> unknown, not running


def test_hold_instance_increments_each_hold() -> None:
    p = plan(running_job(desired=Desired.HELD, hold_instance=4),
             Observed(live=(obs(State.PENDING),)), CTX)
    (hold,) = p.actions
    assert isinstance(hold, Hold) and hold.instance == 5


def test_release_is_not_issued_for_foreign_object() -> None:
    p = plan(running_job(), Observed(live=(obs(State.GATED, foreign=True, submission=None),)),
             CTX)
    assert not any(isinstance(a, Release) for a in p.actions)


def test_conditions_keep_transition_time_until_flip() -> None:
    first = plan(running_job(), Observed(), CTX).status
    (cond,) = [c for c in first.conditions if c.type == "Observed"]
    again = plan(first, Observed(), replace(CTX, now=NOW + 5)).status
    (cond2,) = [c for c in again.conditions if c.type == "Observed"]
    assert cond2.since == cond.since == NOW
