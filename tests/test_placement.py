"""Placement over many clusters, in the pure planner (issue 12): which shard plans a job,
the refusal that moves a job to its next acceptable cluster, ``other_cluster_on``, and a
row naming a cluster the configuration does not know."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.errors import ErrInvalid
from controller.model.job import Current, Desired, JobState, Phase
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, Provenance, Source, State
from controller.model.spec import parse_job_document, spec_to_document
from controller.reconcile import placement
from controller.reconcile.placement import Clusters
from controller.reconcile.plan import Observed, Outcome, OutcomeKind, PlanContext, Submit, plan
from controller.reconcile.policy import parse_policy

JOB = "01JZ8Q2N5V0000000000000000"
NOW = 1_800_000_000
A, B, C = "cpu", "gpu", "new"


def spec(cluster: object = None) -> JobState:
    doc: dict[str, object] = {"command": ["true"], "workdir": "/tmp"}
    if cluster is not None:
        doc["cluster"] = cluster
    return JobState(job_id=JOB, generation=1, desired=Desired.RUN,
                    spec=parse_job_document(doc))


def ctx(here: str, names: tuple[str, ...] = (A, B)) -> PlanContext:
    return PlanContext(now=NOW, unknown_grace_s=300, adopt_window_s=120,
                       clusters=Clusters(names, here))


def ended(cause: CauseKind, cluster: str) -> ObjectObs:
    return ObjectObs(ref=ObjectRef(cluster, "dj-" + JOB, 100, NOW - 50), state=State.ENDED,
                     cause=Cause(cause, Provenance.SLURM, ""), submission=1, attempt=0,
                     foreign=False, restart_count=0, hold_instance=None, requeued=False,
                     exit_code=None, nodes=("n1",), reason="", submit=NOW - 50,
                     start=NOW - 40, end=NOW - 1, source=Source.LIVE, observed_at=NOW)


# ---------------------------------------------------------------- the document


@pytest.mark.parametrize(("value", "expected"), [
    ("gpu", ("gpu",)), (["gpu", "cpu"], ("gpu", "cpu")),
])
def test_the_document_names_a_cluster_or_a_list(value: object, expected: tuple[str, ...]) -> None:
    parsed = parse_job_document({"command": ["true"], "workdir": "/", "cluster": value})
    assert parsed.clusters == expected
    assert parse_job_document(spec_to_document(parsed)).clusters == expected


@pytest.mark.parametrize(("value", "field"), [
    ("", "cluster"), ([], "cluster"), (["a", "a"], "cluster[1]"), (["a", 3], "cluster[1]"),
    ("-x", "cluster"), ("a b", "cluster"), (7, "cluster"), (["x"] * 17, "cluster"),
])
def test_a_bad_cluster_names_the_field(value: object, field: str) -> None:
    with pytest.raises(ErrInvalid) as info:
        parse_job_document({"command": ["true"], "workdir": "/", "cluster": value})
    assert info.value.field == field


def test_other_cluster_on_is_a_list_of_causes() -> None:
    policy = parse_policy({"other_cluster_on": ["node-lost", "boot-failed"]})
    assert policy.other_cluster_on == {CauseKind.NODE_LOST, CauseKind.BOOT_FAILED}
    with pytest.raises(ErrInvalid) as info:
        parse_policy({"other_cluster_on": ["node-lost", "bogus"]})
    assert info.value.field == "policy.other_cluster_on[1]"


# ---------------------------------------------------------------- who plans a job


@pytest.mark.parametrize(("job", "owner"), [
    pytest.param(spec(), A, id="no-cluster: the default"),
    pytest.param(spec(B), B, id="named"),
    pytest.param(spec([B, A]), B, id="list: the first"),
    pytest.param(spec([B, C]), A, id="unknown in the list: the default reports it"),
    pytest.param(replace(spec([A, B]), cluster=B), B, id="placed: where it is"),
    pytest.param(replace(spec(), spec=None), A, id="invalid row: the default rejects it"),
])
def test_owner(job: JobState, owner: str) -> None:
    assert placement.owner(job, Clusters((A, B), A)) == owner


def test_the_first_plan_places_the_job_and_its_intent_names_the_cluster() -> None:
    p = plan(spec(B), Observed(), ctx(B))
    assert p.status.cluster == B
    (intent,) = p.submissions
    assert intent.cluster == B and intent.status == "intent"
    assert [type(a) for a in p.actions] == [Submit]


def test_without_clusters_the_planner_neither_reads_nor_writes_placement() -> None:
    p = plan(spec("anything"), Observed(), PlanContext(now=NOW))
    assert p.status.cluster is None and p.actions


# ---------------------------------------------------------------- an unknown cluster


def test_a_row_naming_an_unknown_cluster_waits_with_the_reason() -> None:
    p = plan(spec([B, C]), Observed(), ctx(A))
    assert not p.actions and not p.submissions
    assert p.status.cluster is None and p.status.phase == Phase.PENDING
    (cond,) = [c for c in p.status.conditions if c.type == "ClusterKnown"]
    assert not cond.status and "cluster new is not configured" in cond.message
    assert [e.kind for e in p.events] == ["Rejected"]
    again = plan(p.status, Observed(), ctx(A))  # said once, not every tick
    assert not again.events and not again.actions
    # the configuration gains the cluster: the job's own shard places and submits it
    later = plan(again.status, Observed(), ctx(B, (A, B, C)))
    assert later.status.cluster == B and [type(a) for a in later.actions] == [Submit]
    assert not any(c.type == "ClusterKnown" for c in later.status.conditions)


def test_a_stopped_row_naming_an_unknown_cluster_is_cancelled() -> None:
    p = plan(replace(spec(C), desired=Desired.STOPPED), Observed(), ctx(A))
    assert p.status.phase == Phase.CANCELLED and not p.actions


# ---------------------------------------------------------------- refusals and moves


def refused(job: JobState, here: str) -> JobState:
    first = plan(job, Observed(), ctx(here))
    outcome = Outcome(OutcomeKind.SUBMIT_REFUSED, 1, "Required partition not available")
    return plan(first.status, Observed(outcomes=(outcome,)), ctx(here)).status


def test_a_refusal_moves_the_job_to_its_next_acceptable_cluster() -> None:
    after = refused(spec([A, B]), A)
    assert after.cluster == B and after.phase == Phase.PENDING and after.current is None
    assert 1 in after.abandoned
    nxt = plan(after, Observed(), ctx(B))  # the next shard submits it, as submission 2
    (action,) = nxt.actions
    assert isinstance(action, Submit) and action.submission == 2
    assert nxt.submissions[-1].cluster == B


def test_a_deferral_moves_the_job_and_on_the_last_cluster_backs_off() -> None:
    first = plan(spec([A, B]), Observed(), ctx(A))
    outcome = Outcome(OutcomeKind.SUBMIT_DEFERRED, 1, "Required partition not available")
    moved = plan(first.status, Observed(outcomes=(outcome,)), ctx(A)).status
    assert moved.cluster == B and moved.phase == Phase.PENDING and moved.not_before is None
    on_b = plan(moved, Observed(), ctx(B))
    outcome = Outcome(OutcomeKind.SUBMIT_DEFERRED, 2, "Required partition not available")
    waits = plan(on_b.status, Observed(outcomes=(outcome,)), ctx(B)).status
    assert waits.cluster == B and waits.phase == Phase.PENDING and waits.current is None
    assert waits.not_before is not None and waits.not_before > NOW


def test_a_refusal_on_the_last_acceptable_cluster_fails_the_job() -> None:
    after = refused(replace(spec([A, B]), cluster=B), B)
    assert after.phase == Phase.FAILED and after.cause.kind == CauseKind.UNRUNNABLE
    assert after.cluster == B


def test_a_refusal_on_a_single_cluster_fails_the_job() -> None:
    assert refused(spec(), A).phase == Phase.FAILED


def running_on(cluster: str, policy: object = None) -> JobState:
    job = replace(spec([A, B]), cluster=cluster, submission=1,
                  current=Current(1, 0, NOW - 50, ObjectRef(cluster, "dj-" + JOB, 100,
                                                             NOW - 50)))
    return replace(job, policy=parse_policy(policy)) if policy is not None else job


def test_a_resubmission_stays_on_its_cluster_by_default() -> None:
    p = plan(running_on(A), Observed(live=(ended(CauseKind.NODE_LOST, A),)), ctx(A))
    assert p.status.phase == Phase.PENDING and p.status.cluster == A
    assert "Moved" not in [e.kind for e in p.events]


def test_other_cluster_on_moves_a_resubmission_to_the_next_cluster() -> None:
    job = running_on(B, {"other_cluster_on": ["node-lost"]})
    job = replace(job, excluded_nodes={"old": NOW + 100})
    p = plan(job, Observed(live=(ended(CauseKind.NODE_LOST, B),)), ctx(B))
    assert p.status.phase == Phase.PENDING and p.status.cluster == A  # wraps around
    assert p.status.attempt == 1 and not p.status.excluded_nodes  # B's nodes mean nothing
    assert [e.kind for e in p.events][-2:] == ["Resubmitting", "Moved"]
    # a cause the policy does not name stays
    q = plan(running_on(B, {"other_cluster_on": ["node-lost"]}),
             Observed(live=(ended(CauseKind.PREEMPTED, B),)), ctx(B))
    assert q.status.cluster == B


def test_a_resubmission_leaves_a_cluster_the_job_no_longer_accepts() -> None:
    job = replace(running_on(A), spec=parse_job_document(
        {"command": ["true"], "workdir": "/tmp", "cluster": [B]}))
    p = plan(job, Observed(live=(ended(CauseKind.NODE_LOST, A),)), ctx(A))
    assert p.status.cluster == B and p.status.phase == Phase.PENDING
