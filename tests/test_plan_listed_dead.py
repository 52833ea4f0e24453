"""The planner and an object the scheduler still lists running although it is dead
(seed 003; Grid Engine keeps ``r`` for the jobs of a host whose execd is gone, and the
adapter, having found the host unheard and none of the job's processes, reports it
running with cause node-lost): the object is deleted and finished as node-lost, so the
policy resubmits it away from that node. A scheduler that ends such jobs itself (Slurm's
NODE_FAIL) never reports this pair."""

from __future__ import annotations

from controller.model.job import Phase
from controller.model.obs import CauseKind, State
from controller.reconcile.plan import Cancel, Observed, Submit, plan
from tests.test_plan import CTX, NOW, obs, ref, running_job


def test_listed_running_but_node_lost_is_deleted_and_resubmitted() -> None:
    dead = obs(State.RUNNING, CauseKind.NODE_LOST, nodes=("vm",), start=NOW - 40)
    first = plan(running_job(), Observed(live=(dead,)), CTX)
    cancels = [a for a in first.actions if isinstance(a, Cancel)]
    assert [(c.ref, c.cause) for c in cancels] == [(ref(), CauseKind.NODE_LOST)]
    assert first.status.cause.kind is CauseKind.NODE_LOST
    assert first.status.phase is not Phase.RUNNING
    # the resubmission (now, or after the policy's backoff) excludes the lost node
    later = plan(first.status, Observed(live=(dead,)), replace_now(NOW + 60))
    submits = [a for a in (*first.actions, *later.actions) if isinstance(a, Submit)]
    assert submits and "vm" in submits[0].exclude


def replace_now(now: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace
    return replace(CTX, now=now)
