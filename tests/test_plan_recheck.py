"""``Plan.recheck_at``: before it, planning the same inputs again gives the same plan."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.model.job import Condition, Current, Desired, JobState, Phase
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, Provenance, Source, State
from controller.model.policy import parse_policy
from controller.model.spec import parse_job_document
from controller.reconcile.plan import Observed, Outcome, OutcomeKind, Plan, PlanContext, plan

JOB = "01JZ8Q2N5V0000000000000000"
UID = "dj-" + JOB
NOW = 1_800_000_000
SPEC = parse_job_document({"command": ["true"], "workdir": "/tmp",
                           "resources": {"time_limit_s": 600}})
POLICIES = [parse_policy(None),
            parse_policy({"expected_outputs": ["/o"], "on_exhausted": "warn",
                          "retry_exit_codes": [3], "unknown_grace_s": 50}),
            parse_policy({"causes": {"timeout": {"budget": 2, "time_factor": 2}},
                          "backoff": {"initial_s": 0}})]

times = st.integers(1, 2000).map(lambda ago: NOW - ago)  # (small values are drawn often)
later = st.integers(-2000, 4000).map(lambda ahead: NOW + ahead)


@st.composite
def observations(draw: st.DrawFn, *, submit: int) -> ObjectObs:
    state = draw(st.sampled_from([*State, State.RUNNING, State.RUNNING]))
    cause = draw(st.sampled_from([CauseKind.NONE, CauseKind.COMPLETED, CauseKind.NODE_LOST,
                                  CauseKind.TIMEOUT, CauseKind.NON_ZERO_EXIT, CauseKind.UNKNOWN,
                                  CauseKind.CANCELLED, CauseKind.LAUNCH_FAILED,
                                  CauseKind.ADMIN_HOLD, CauseKind.REQUEUED]))
    slurm_id = draw(st.sampled_from([100, 100, 100, 101, 102]))
    return ObjectObs(
        ref=ObjectRef("lab", UID, slurm_id, submit if slurm_id == 100 else submit + 1),
        state=state, cause=Cause(cause, draw(st.sampled_from(Provenance)), ""),
        submission=draw(st.sampled_from([None, 1, 1, 2, 3])), attempt=0,
        foreign=draw(st.booleans()), restart_count=draw(st.sampled_from([None, 0, 1])),
        hold_instance=draw(st.sampled_from([None, 1])), requeued=False,
        exit_code=3 if cause == CauseKind.NON_ZERO_EXIT else None,
        nodes=draw(st.sampled_from([(), ("n1",)])), reason="",
        submit=submit if slurm_id == 100 else submit + 1,
        start=draw(st.none() | times), end=draw(st.none() | times),
        source=draw(st.sampled_from(Source)), observed_at=NOW,
        time_limit_s=draw(st.none() | st.integers(1, 3000)))


@st.composite
def cases(draw: st.DrawFn) -> tuple[JobState, Observed, PlanContext]:
    submit = draw(times)
    current = draw(st.sampled_from(["none", "intent", "ref"]))
    cur = None
    if current != "none":
        cur = Current(draw(st.sampled_from([1, 2])), 0, draw(times),
                      ObjectRef("lab", UID, 100, submit) if current == "ref" else None)
    conditions = tuple(Condition(t, draw(st.booleans()), "r", "", draw(times), 1)
                       for t in draw(st.lists(st.sampled_from(
                           ["Observed", "Stale", "SubmitDeferred", "HoldIneffective"]),
                           unique=True, max_size=2)))
    job = JobState(
        job_id=JOB, generation=1, desired=draw(st.sampled_from(Desired)),
        spec=draw(st.sampled_from([SPEC, SPEC, None])), policy=draw(st.sampled_from(POLICIES)),
        phase=draw(st.sampled_from([Phase.PENDING, Phase.RUNNING, Phase.HELD])),
        submission=draw(st.sampled_from([0, 1, 2])), current=cur,
        object_state=draw(st.none() | st.sampled_from(State)),
        budgets_used=draw(st.sampled_from([{}, {"node-lost": 1}, {"timeout": 1},
                                           {"preempted": 5000}])),
        excluded_nodes=draw(st.dictionaries(st.sampled_from(["n1", "n2"]), later, max_size=2)),
        not_before=draw(st.none() | later), unknown_since=draw(st.none() | times),
        hold_instance=draw(st.integers(0, 2)), started_at=draw(st.none() | times),
        nodes=draw(st.sampled_from([(), ("n1",)])), conditions=conditions,
        abandoned=draw(st.sampled_from([frozenset(), frozenset({1})])))
    outcomes = tuple(Outcome(kind, draw(st.sampled_from([1, 2])), "x", ("/o",))
                     for kind in draw(st.lists(st.sampled_from(OutcomeKind), max_size=2)))
    observed = Observed(live=tuple(draw(st.lists(observations(submit=submit), max_size=3))),
                        accounting=draw(st.none() | observations(submit=submit)),
                        accounting_ok=draw(st.booleans()), outcomes=outcomes)
    ctx = PlanContext(now=NOW, unknown_grace_s=draw(st.sampled_from([30, 300])),
                      adopt_window_s=draw(st.sampled_from([60, 180])),
                      down_nodes=draw(st.sampled_from([frozenset(), frozenset({"n1"})])))
    return job, observed, ctx


def _decision(p: Plan, job: JobState, other: Plan) -> Any:
    """The plan without the clock values it writes (condition ``since``, new deadlines,
    event messages that quote durations): those are stamps, not decisions. A value is a
    stamp when either plan (``p`` or ``other``) writes it new: one of them may write, by
    chance, the value the job already had (a deferral's ``now + delay`` equal to the
    generated ``not_before``; found by this property)."""
    st_ = p.status
    ot = other.status

    def stamp(value: object, before: object, theirs: object) -> object:
        return value if value == before == theirs else "stamped"

    status = replace(
        st_, conditions=tuple(replace(c, since=0) for c in st_.conditions),
        current=None if st_.current is None else replace(
            st_.current, created_at=stamp(st_.current.created_at,  # type: ignore[arg-type]
                                          job.current.created_at if job.current else None,
                                          ot.current.created_at if ot.current else None)),
        not_before=stamp(st_.not_before, job.not_before, ot.not_before),
        unknown_since=stamp(st_.unknown_since, job.unknown_since, ot.unknown_since),
        excluded_nodes={n: stamp(t, job.excluded_nodes.get(n), ot.excluded_nodes.get(n))
                        for n, t in st_.excluded_nodes.items()})
    return (p.actions, p.submissions, [e.kind for e in p.events], status)


def _quiet(p: Plan, job: JobState) -> bool:
    return not (p.actions or p.submissions or p.events) and p.status == replace(
        job, observed_generation=p.status.observed_generation)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 10_000))
def test_plan_holds_until_recheck_at(case: tuple[JobState, Observed, PlanContext],
                                     offset: int) -> None:
    job, observed, ctx = case
    first = plan(job, observed, ctx)
    recheck = first.recheck_at
    if recheck is not None:
        assert recheck > ctx.now
        offset = offset % (recheck - ctx.now)
    again = plan(job, observed, replace(ctx, now=ctx.now + offset))
    if _quiet(first, job):  # what the tick's skip memo relies on: exactly the same plan
        assert again == first
    assert _decision(again, job, first) == _decision(first, job, again)
    if recheck is not None:  # and the decision point itself is honest: the plan there is
        at = plan(job, observed, replace(ctx, now=recheck))  # made (it may or may not differ)
        assert at.recheck_at is None or at.recheck_at > recheck


def test_recheck_at_is_the_backoff_deadline() -> None:
    job = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC,
                   not_before=NOW + 30)
    p = plan(job, Observed(), PlanContext(now=NOW))
    assert p.actions == () and p.recheck_at == NOW + 30
    assert plan(job, Observed(), PlanContext(now=NOW + 30)).actions  # submits then


def test_recheck_at_is_the_end_of_the_unknown_grace() -> None:
    job = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC, submission=1,
                   current=Current(1, 0, NOW - 100, ObjectRef("lab", UID, 100, NOW - 100)),
                   unknown_since=NOW - 10)
    p = plan(job, Observed(), PlanContext(now=NOW, unknown_grace_s=60))
    assert p.recheck_at == NOW + 50


def test_recheck_at_is_when_a_running_job_turns_stale() -> None:
    ref = ObjectRef("lab", UID, 100, NOW - 100)
    job = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=SPEC, submission=1,
                   current=Current(1, 0, NOW - 100, ref), object_state=State.RUNNING,
                   nodes=("n1",), started_at=NOW - 90, phase=Phase.RUNNING)
    running = ObjectObs(ref=ref, state=State.RUNNING, cause=Cause(), submission=1, attempt=0,
                        foreign=False, restart_count=0, hold_instance=None, requeued=False,
                        exit_code=None, nodes=("n1",), reason="", submit=NOW - 100,
                        start=NOW - 90, end=None, source=Source.LIVE, observed_at=NOW,
                        time_limit_s=60)
    p = plan(job, Observed(live=(running,)), PlanContext(now=NOW))
    assert p.recheck_at == NOW - 90 + 60 + 300 + 1
