"""The planner defects of issue 9, one test each (each failed before its fix)."""

from __future__ import annotations

import json
from dataclasses import replace

from sqlalchemy import text

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
    Release,
    Submit,
    plan,
)
from controller.store import repo
from controller.store.db import Store

JOB = "01JZ8Q2N5V0000000000000000"
UID = "dj-" + JOB
NOW = 1_800_000_000
SPEC = parse_job_document({"command": ["true"], "workdir": "/tmp",
                           "resources": {"time_limit_s": 600, "memory_mb": 1000}})
CTX = PlanContext(now=NOW, unknown_grace_s=300, adopt_window_s=120)


def ref(slurm_id: int = 100, submit: int = NOW - 50) -> ObjectRef:
    return ObjectRef("lab", UID, slurm_id, submit)


def obs(state: State, cause: CauseKind = CauseKind.NONE, *, slurm_id: int = 100,
        submission: int | None = 1, nodes: tuple[str, ...] = ("n1",),
        restart: int | None = 0, submit: int = NOW - 50,
        provenance: Provenance = Provenance.SLURM, source: Source = Source.LIVE,
        start: int | None = None, end: int | None = None, detail: str = "") -> ObjectObs:
    return ObjectObs(ref=ObjectRef("lab", UID, slurm_id, submit), state=state,
                     cause=Cause(cause, provenance, detail), submission=submission, attempt=0,
                     foreign=False, restart_count=restart, hold_instance=None, requeued=False,
                     exit_code=3 if cause == CauseKind.NON_ZERO_EXIT else None, nodes=nodes,
                     reason="", submit=submit, start=start, end=end, source=source,
                     observed_at=NOW)


def job(**kw: object) -> JobState:
    return replace(JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC),
                   **kw)  # type: ignore[arg-type]


def running_job(**kw: object) -> JobState:
    return job(submission=1, current=Current(1, 0, NOW - 50, ref()), **kw)


def ended(cause: CauseKind, **kw: object) -> Observed:
    return Observed(live=(obs(State.ENDED, cause, **kw),))  # type: ignore[arg-type]


# a. the factors reach sbatch on the resubmission, from persisted state


def test_time_and_memory_factors_reach_the_resubmission_after_a_reload() -> None:
    policy = parse_policy({"causes": {"timeout": {"action": "resubmit", "budget": 2,
                                                   "time_factor": 2, "memory_factor": 1.5}}})
    first = plan(running_job(policy=policy), ended(CauseKind.TIMEOUT), CTX).status
    assert first.budgets_used == {"timeout": 1}
    reloaded = replace(first, spec=SPEC)  # what load_tracked gives the next tick
    assert first.not_before is not None
    (submit,) = plan(reloaded, Observed(), replace(CTX, now=first.not_before)).actions
    assert isinstance(submit, Submit)
    assert submit.spec.resources.time_limit_s == 1200
    assert submit.spec.resources.memory_mb == 1500
    again = replace(reloaded, budgets_used={"timeout": 2}, not_before=None)
    (submit2,) = plan(again, Observed(), CTX).actions
    assert isinstance(submit2, Submit) and submit2.spec.resources.time_limit_s == 2400


# b. backoff overflow


def test_backoff_is_capped_for_any_number_of_resubmissions() -> None:
    p = plan(running_job(budgets_used={"preempted": 5000}), ended(CauseKind.NODE_LOST), CTX)
    assert p.status.phase == Phase.PENDING
    assert p.status.not_before == NOW + 3600


# c. policy


def test_non_zero_exit_budget_without_action_is_honoured() -> None:
    policy = parse_policy({"causes": {"non-zero-exit": {"budget": 2}},
                           "retry_exit_codes": [3]})
    spent = plan(running_job(policy=policy, budgets_used={"non-zero-exit": 2}),
                 ended(CauseKind.NON_ZERO_EXIT), CTX)
    assert spent.status.phase == Phase.FAILED
    fresh = plan(running_job(policy=policy, budgets_used={"non-zero-exit": 1}),
                 ended(CauseKind.NON_ZERO_EXIT), CTX)
    assert fresh.status.phase == Phase.PENDING


def test_explicit_fail_wins_over_retry_exit_codes() -> None:
    policy = parse_policy({"causes": {"non-zero-exit": {"action": "fail"}},
                           "retry_exit_codes": [3]})
    p = plan(running_job(policy=policy), ended(CauseKind.NON_ZERO_EXIT), CTX)
    assert p.status.phase == Phase.FAILED


def test_on_exhausted_warn_is_a_distinct_outcome() -> None:
    warn = parse_policy({"on_exhausted": "warn"})
    fail = parse_policy({"on_exhausted": "fail"})
    spent = {"node-lost": 3}
    w = plan(running_job(policy=warn, budgets_used=spent), ended(CauseKind.NODE_LOST), CTX)
    f = plan(running_job(policy=fail, budgets_used=spent), ended(CauseKind.NODE_LOST), CTX)
    assert w.status.phase == f.status.phase == Phase.FAILED
    assert [(c.type, c.status) for c in w.status.conditions if c.type == "Warning"] == [
        ("Warning", True)]
    assert not [c for c in f.status.conditions if c.type == "Warning"]


def test_warning_shows_in_the_json_view() -> None:
    cond = {"type": "Warning", "status": True, "reason": "RetriesExhausted", "message": "",
            "since": 1, "observed_generation": 1}
    view = repo.JobView(id=JOB, desired="run", generation=1, labels={}, phase="failed",
                        attempt=3, submission=4, slurm_job_id=None, cause="node-lost",
                        cause_detail="", exit_code=None, object_state="ended", reason="",
                        nodes="", conditions=[cond], created_at=1, updated_at=2)
    assert view.to_json()["warning"] is True
    assert replace(view, conditions=[]).to_json()["warning"] is False


# d. node exclusion after a held launch failure


def test_held_launch_failure_excludes_the_node_it_ran_on() -> None:
    p = plan(running_job(nodes=("n5",)),
             Observed(live=(obs(State.HELD, CauseKind.LAUNCH_FAILED, nodes=()),)), CTX)
    assert any(isinstance(a, Cancel) for a in p.actions)
    assert set(p.status.excluded_nodes) == {"n5"}


# e. a live object in a state we cannot classify is never counted as ended


def test_duplicate_in_unknown_state_is_cancelled() -> None:
    odd = obs(State.ENDED, CauseKind.UNKNOWN, slurm_id=101, submission=2, detail="WEIRD")
    p = plan(running_job(), Observed(live=(obs(State.RUNNING), odd)), CTX)
    assert [(a.ref.id, a.cause) for a in p.actions if isinstance(a, Cancel)] == [
        (101, CauseKind.DUPLICATE)]


def test_stop_cancels_current_in_unknown_state() -> None:
    odd = obs(State.ENDED, CauseKind.UNKNOWN, detail="WEIRD")
    p = plan(running_job(desired=Desired.STOPPED), Observed(live=(odd,)), CTX)
    assert [(a.ref.id, a.cause) for a in p.actions if isinstance(a, Cancel)] == [
        (100, CauseKind.CANCELLED)]


# f. rejecting a row never forgets its live Slurm job


def test_rejected_row_keeps_its_ref_and_cancels_its_live_object() -> None:
    bad = running_job(spec=None, phase=Phase.REJECTED)
    p = plan(bad, Observed(live=(obs(State.RUNNING),)), CTX)
    assert p.status.phase == Phase.REJECTED
    assert p.status.current is not None and p.status.current.ref == ref()
    assert [(a.ref.id, a.cause) for a in p.actions if isinstance(a, Cancel)] == [
        (100, CauseKind.CANCELLED)]


def test_load_tracked_keeps_status_of_a_rejected_row(sqlite_store: Store) -> None:
    with sqlite_store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document={"command": ["true"], "workdir": "/tmp"},
                        now=NOW)
    with sqlite_store.transaction() as tx:
        (loaded,) = repo.load_tracked(tx, "lab")
        state = replace(loaded.state, submission=1, phase=Phase.RUNNING,
                        current=Current(1, 0, NOW - 50, ref()))
        repo.save_status(tx, state, exists=False, now=NOW)
    with sqlite_store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET spec = :spec"),
                     {"spec": json.dumps({"command": ["x"], "workdir": "relative"})})
    with sqlite_store.transaction() as tx:
        (rejected,) = repo.load_tracked(tx, "lab")
    assert rejected.state.spec is None and rejected.reject_reason
    assert rejected.state.current is not None and rejected.state.current.ref == ref()
    assert rejected.state.submission == 1


# g. jobs the cluster lost


def test_absent_from_squeue_and_sacct_is_lost_and_resubmitted_free_if_never_started() -> None:
    state = running_job(unknown_since=NOW - 400, object_state=State.PENDING)
    first = plan(state, Observed(accounting_ok=True), CTX)
    # never seen running: first look for its Slurm output file (it may have run unseen)
    assert [type(a).__name__ for a in first.actions] == ["CheckStarted"]
    assert first.status.current is not None and first.events == ()
    p = plan(first.status, Observed(accounting_ok=True, outcomes=(
        Outcome(OutcomeKind.NOT_STARTED, 1),)), CTX)
    assert p.status.cause.kind == CauseKind.LOST
    assert p.status.phase == Phase.PENDING and p.status.current is None
    assert p.status.budgets_used == {}


def test_lost_with_an_output_file_spends_the_budget() -> None:
    """It was never seen running, but its Slurm output file exists: it ran between two
    reads, so it is resubmitted under the policy's budget, like node-lost."""
    state = running_job(unknown_since=NOW - 400, object_state=State.PENDING)
    first = plan(state, Observed(accounting_ok=True), CTX)
    p = plan(first.status, Observed(accounting_ok=True, outcomes=(
        Outcome(OutcomeKind.STARTED, 1),)), CTX)
    assert p.status.cause.kind == CauseKind.LOST and p.status.phase == Phase.PENDING
    assert p.status.budgets_used == {"lost": 1}


def test_lost_that_started_fails_once_its_budget_is_spent() -> None:
    state = running_job(unknown_since=NOW - 400, object_state=State.RUNNING,
                        started_at=NOW - 40, budgets_used={"lost": 3})
    p = plan(state, Observed(accounting_ok=True), CTX)
    assert (p.status.phase, p.status.cause.kind) == (Phase.FAILED, CauseKind.LOST)


def test_lost_after_it_may_have_started_spends_the_budget() -> None:
    p = plan(running_job(unknown_since=NOW - 400, object_state=State.RUNNING,
                         started_at=NOW - 40), Observed(accounting_ok=True), CTX)
    assert p.status.cause.kind == CauseKind.LOST and p.status.phase == Phase.PENDING
    assert p.status.budgets_used == {"lost": 1}


def test_absent_while_accounting_is_down_stays_unknown() -> None:
    p = plan(running_job(unknown_since=NOW - 400), Observed(accounting_ok=False), CTX)
    assert p.status.cause.kind == CauseKind.UNKNOWN and p.status.phase == Phase.FAILED


def test_cancel_made_by_slurm_itself_is_lost_not_a_users_cancel() -> None:
    observed = ended(CauseKind.CANCELLED, provenance=Provenance.SLURM)
    first = plan(running_job(object_state=State.PENDING), observed, CTX)
    assert first.status.phase != Phase.CANCELLED
    assert [type(a).__name__ for a in first.actions] == ["CheckStarted"]
    p = plan(first.status, replace(observed, outcomes=(Outcome(OutcomeKind.NOT_STARTED, 1),)),
             CTX)
    assert p.status.cause.kind == CauseKind.LOST and p.status.phase == Phase.PENDING


def test_requeued_job_that_left_squeue_is_matched_in_accounting() -> None:
    record = obs(State.ENDED, CauseKind.COMPLETED, restart=None, submit=NOW - 20,
                 source=Source.ACCOUNTING, start=NOW - 15, end=NOW - 5)
    p = plan(running_job(object_state=State.PENDING), Observed(accounting=record), CTX)
    assert p.status.phase == Phase.SUCCEEDED


# h. a late object of an abandoned intent is never adopted nor released


def test_late_object_of_abandoned_intent_is_cancelled_during_backoff() -> None:
    state = job(submission=2, attempt=1, not_before=NOW + 100)
    p = plan(state, Observed(live=(obs(State.GATED, slurm_id=300, submission=2),)), CTX)
    assert not any(isinstance(a, Release) for a in p.actions)
    assert [(a.ref.id, a.cause) for a in p.actions if isinstance(a, Cancel)] == [
        (300, CauseKind.DUPLICATE)]
    assert p.status.current is None


# a CANCELLED read live does not say who cancelled: the accounting record decides


def test_live_cancel_waits_for_the_accounting_record() -> None:
    live = obs(State.ENDED, CauseKind.CANCELLED, provenance=Provenance.USER, end=NOW - 5,
               start=NOW - 30)
    first = plan(running_job(object_state=State.RUNNING), Observed(live=(live,)), CTX)
    assert first.status.phase == Phase.PENDING and first.actions == ()  # not ended yet
    assert first.recheck_at == NOW - 5 + CTX.unknown_grace_s
    # sacct names no requester: Slurm killed it itself ("Duplicate jobid"): lost
    slurms = obs(State.ENDED, CauseKind.CANCELLED, provenance=Provenance.SLURM, end=NOW - 5,
                 start=NOW - 30, source=Source.ACCOUNTING)
    p = plan(first.status, Observed(live=(live,), accounting=slurms), CTX)
    assert (p.status.phase, p.status.cause.kind) == (Phase.PENDING, CauseKind.LOST)
    # sacct names a user: a user's cancel, never resubmitted
    users = replace(slurms, cause=Cause(CauseKind.CANCELLED, Provenance.USER, "by 1001"))
    p = plan(first.status, Observed(live=(live,), accounting=users), CTX)
    assert p.status.phase == Phase.CANCELLED


def test_live_cancel_without_accounting_ends_cancelled_after_the_grace() -> None:
    live = obs(State.ENDED, CauseKind.CANCELLED, provenance=Provenance.USER,
               end=NOW - CTX.unknown_grace_s - 1)
    p = plan(running_job(), Observed(live=(live,), accounting_ok=False), CTX)
    assert p.status.phase == Phase.CANCELLED


def test_our_own_cancel_ends_at_once() -> None:
    live = obs(State.ENDED, CauseKind.CANCELLED, provenance=Provenance.USER, end=NOW - 1)
    p = plan(running_job(desired=Desired.STOPPED), Observed(live=(live,)), CTX)
    assert p.status.phase == Phase.CANCELLED
