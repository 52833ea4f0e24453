"""SlurmJob → ObjectObs (SPEC §4): every table row, the sacct differences, identity, and
the recorded and hand-written text of the reader's formats giving the observations they
should."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest

from controller.errors import ErrInvalid, ProtocolError
from controller.model.obs import (
    CONTROLLER_ONLY_CAUSES,
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    State,
)
from controller.slurm.classify import (
    BASE_RULES,
    PENDING_RULES,
    UNKNOWN_RULE,
    UNRUNNABLE_REASONS,
    classify,
    matching_rule,
    valid_until,
)
from controller.slurm.dialects import parse_sacct_text, parse_squeue_text
from controller.slurm.holds import HOLD_BASE, MAX_HOLD_INSTANCE
from controller.slurm.record import SlurmJob

DATA = Path(__file__).resolve().parent.parent / "testdata" / "slurm"
R22 = DATA / "22.05"

T = 1_796_050_000
NOW = T + 4_000  # after every hand-written job has ended
ULID = "01JZ8Q2N5V0000000000000021"
NAME = "dj-" + ULID

BASE_JOB = SlurmJob(
    job_id=21, name=NAME, user="svc", base_state="PENDING", flags=(), reason="",
    description="", comment="dispatch:s=2;a=1", submit_time=T, eligible_time=T,
    start_time=None, end_time=None, preempt_time=None, restart_count=0, nodes=(),
    return_code=None, signal=None, time_limit_s=3600, requeue=True, cluster="lab",
    state_text="PENDING")


def job(**changes: Any) -> SlurmJob:
    """BASE_JOB with ``changes``; the state text follows the state unless given."""
    if "state_text" not in changes and ("base_state" in changes or "flags" in changes):
        words = [changes.get("base_state", BASE_JOB.base_state),
                 *changes.get("flags", BASE_JOB.flags)]
        changes["state_text"] = ",".join(word for word in words if word)
    return dataclasses.replace(BASE_JOB, **changes)


def hold_at(instance: int, submit: int = T) -> int:
    return submit + HOLD_BASE + instance


class Want(NamedTuple):
    state: State
    cause: CauseKind = CauseKind.NONE
    provenance: Provenance = Provenance.UNKNOWN
    detail: str = ""
    exit_code: int | None = None
    hold: int | None = None


RUNNING = {"base_state": "RUNNING", "start_time": T + 5, "nodes": ("node01",),
           "end_time": T + 3605}
ENDED = {"start_time": T + 5, "end_time": T + 60, "nodes": ("node01",)}
LIVE = "live"
ACCT = "accounting"

CASES = [
    # ---- SPEC §4.1: pending, first match wins ---------------------------------------
    pytest.param({"reason": "JobHeldUser"}, LIVE, Want(State.GATED), id="41-gate"),
    pytest.param({"reason": "JobHeldUser", "eligible_time": hold_at(9)}, LIVE,
                 Want(State.GATED, hold=9), id="41-gate-carrying-a-hold-shows-both"),
    pytest.param({"reason": "JobHoldMaxRequeue", "flags": ("REQUEUE_HOLD",), "restart_count": 5,
                  "description": "launch failure limit exceeded requeued held"}, LIVE,
                 Want(State.HELD, CauseKind.LAUNCH_FAILED, Provenance.SLURM,
                      "launch failure limit exceeded requeued held"),
                 id="41-launch-failed-max-requeue"),
    pytest.param({"reason": "JobHeldUser", "restart_count": 1,
                  "description": "launch failed requeued held"}, LIVE,
                 Want(State.HELD, CauseKind.LAUNCH_FAILED, Provenance.SLURM,
                      "launch failed requeued held"), id="41-launch-failed-description"),
    pytest.param({"reason": "JobHeldUser", "restart_count": 1}, LIVE,
                 Want(State.HELD, CauseKind.REQUEUED, Provenance.SLURM),
                 id="41-requeued-held-reason"),
    pytest.param({"reason": "", "description": "job requeued in held state", "restart_count": 2},
                 LIVE, Want(State.HELD, CauseKind.REQUEUED, Provenance.SLURM,
                            "job requeued in held state"), id="41-requeued-held-description"),
    pytest.param({"reason": "JobHeldUser", "restart_count": 1, "eligible_time": hold_at(4)},
                 LIVE, Want(State.HELD, CauseKind.REQUEUED, Provenance.SLURM, hold=4),
                 id="41-requeued-held-before-dispatch-hold"),
    pytest.param({"reason": "JobHeldAdmin"}, LIVE,
                 Want(State.HELD, CauseKind.ADMIN_HOLD, Provenance.ADMIN), id="41-admin-hold"),
    pytest.param({"reason": "JobHeldAdmin", "eligible_time": hold_at(5)}, LIVE,
                 Want(State.HELD, CauseKind.ADMIN_HOLD, Provenance.ADMIN, hold=5),
                 id="41-admin-hold-before-dispatch-hold"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(7)}, LIVE,
                 Want(State.HELD, provenance=Provenance.DISPATCH, hold=7),
                 id="41-dispatch-hold-begin-time"),
    pytest.param({"reason": "", "eligible_time": hold_at(7)}, LIVE,
                 Want(State.HELD, provenance=Provenance.DISPATCH, hold=7),
                 id="41-dispatch-hold-reason-none"),
    pytest.param({"reason": "BeginTime", "eligible_time": None, "start_time": hold_at(11)}, LIVE,
                 Want(State.HELD, provenance=Provenance.DISPATCH, hold=11),
                 id="41-dispatch-hold-from-start-time"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(1)}, LIVE,
                 Want(State.HELD, provenance=Provenance.DISPATCH, hold=1),
                 id="41-dispatch-hold-smallest"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(MAX_HOLD_INSTANCE)}, LIVE,
                 Want(State.HELD, provenance=Provenance.DISPATCH, hold=MAX_HOLD_INSTANCE),
                 id="41-dispatch-hold-largest"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(7), "restart_count": 1}, LIVE,
                 Want(State.HELD, provenance=Provenance.DISPATCH, hold=7),
                 id="41-dispatch-hold-before-requeue-delay"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(7), "submit_time": T + 500,
                  "restart_count": 1}, LIVE,
                 Want(State.PENDING, CauseKind.REQUEUED, Provenance.SLURM),
                 id="41-hold-decodes-against-current-submit"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(0)}, LIVE,
                 Want(State.PENDING), id="41-hold-instance-zero-is-no-hold"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(MAX_HOLD_INSTANCE + 1)}, LIVE,
                 Want(State.PENDING), id="41-hold-instance-too-large-is-no-hold"),
    pytest.param({"reason": "BeginTime", "eligible_time": T + 3600}, LIVE,
                 Want(State.PENDING), id="41-begin-time-not-a-hold"),
    pytest.param({"reason": "Priority", "eligible_time": hold_at(3)}, LIVE,
                 Want(State.PENDING, hold=3), id="41-hold-decoded-whatever-the-reason"),
    pytest.param({"reason": "BeginTime", "restart_count": 1}, LIVE,
                 Want(State.PENDING, CauseKind.REQUEUED, Provenance.SLURM),
                 id="41-requeue-delay"),
    *(pytest.param({"reason": reason}, LIVE,
                   Want(State.PENDING, CauseKind.UNRUNNABLE, Provenance.SLURM, reason),
                   id=f"41-unrunnable-{reason}") for reason in sorted(UNRUNNABLE_REASONS)),
    pytest.param({"reason": "PartitionConfig", "restart_count": 1}, LIVE,
                 Want(State.PENDING, CauseKind.UNRUNNABLE, Provenance.SLURM, "PartitionConfig"),
                 id="41-unrunnable-before-requeued"),
    pytest.param({"reason": "Priority"}, LIVE, Want(State.PENDING), id="41-else-priority"),
    pytest.param({"reason": "Resources"}, LIVE, Want(State.PENDING), id="41-else-resources"),
    pytest.param({"reason": "Dependency"}, LIVE, Want(State.PENDING), id="41-else-dependency"),
    pytest.param({"reason": "Priority", "restart_count": 2}, LIVE,
                 Want(State.PENDING, CauseKind.REQUEUED, Provenance.SLURM),
                 id="41-else-after-requeue"),
    pytest.param({"reason": "BeginTime", "restart_count": 1, "flags": ("COMPLETING",)}, LIVE,
                 Want(State.PENDING, CauseKind.REQUEUED, Provenance.SLURM),
                 id="41-pending-completing-flag-changes-nothing"),
    pytest.param({"reason": "Priority", "flags": ("EXPEDITING",)}, LIVE,
                 Want(State.PENDING), id="41-v0.0.44-flag-known"),
    pytest.param({"base_state": "", "flags": ("REQUEUE_HOLD",), "reason": "JobHoldMaxRequeue",
                  "restart_count": 5}, LIVE,
                 Want(State.HELD, CauseKind.LAUNCH_FAILED, Provenance.SLURM),
                 id="41-string-dialect-requeue-hold"),
    pytest.param({"base_state": "", "flags": ("SPECIAL_EXIT",), "reason": "JobHeldUser",
                  "restart_count": 1}, LIVE,
                 Want(State.HELD, CauseKind.REQUEUED, Provenance.SLURM),
                 id="41-string-dialect-special-exit"),
    # ---- SPEC §4.2: running and ended, live ------------------------------------------
    pytest.param(RUNNING, LIVE, Want(State.RUNNING), id="42-running"),
    pytest.param({**RUNNING, "preempt_time": T + 100}, LIVE,
                 Want(State.RUNNING, detail=f"preempt_time={T + 100}"),
                 id="42-running-preempt-time-set"),
    pytest.param({**RUNNING, "flags": ("CONFIGURING",)}, LIVE, Want(State.RUNNING),
                 id="42-running-configuring"),
    pytest.param({**RUNNING, "flags": ("LAUNCH_FAILED",)}, LIVE, Want(State.RUNNING),
                 id="42-launch-failed-flag-only-matters-under-failed"),
    pytest.param({**RUNNING, "base_state": "", "flags": ("COMPLETING",)}, LIVE,
                 Want(State.RUNNING, detail="COMPLETING: base state not reported"),
                 id="42-string-dialect-completing"),
    pytest.param({**RUNNING, "base_state": "", "flags": ("CONFIGURING",)}, LIVE,
                 Want(State.RUNNING, detail="CONFIGURING: base state not reported"),
                 id="42-string-dialect-configuring"),
    pytest.param({**RUNNING, "base_state": "SUSPENDED"}, LIVE, Want(State.SUSPENDED),
                 id="42-suspended"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "return_code": 0}, LIVE,
                 Want(State.ENDED, CauseKind.COMPLETED, Provenance.SLURM), id="42-completed"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "NonZeroExitCode",
                  "return_code": 3}, LIVE,
                 Want(State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM, exit_code=3),
                 id="42-failed-non-zero-exit"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "RaisedSignal", "signal": 9,
                  "description": "RaisedSignal:9(Killed)"}, LIVE,
                 Want(State.ENDED, CauseKind.SIGNALED, Provenance.SLURM, "signal 9"),
                 id="42-failed-raised-signal"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "RaisedSignal",
                  "description": "RaisedSignal:9(Killed)"}, LIVE,
                 Want(State.ENDED, CauseKind.SIGNALED, Provenance.SLURM,
                      "RaisedSignal:9(Killed)"), id="42-failed-raised-signal-no-exit-signal"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "JobLaunchFailure", "signal": 9},
                 LIVE, Want(State.ENDED, CauseKind.SIGNALED, Provenance.SLURM, "signal 9"),
                 id="42-failed-signal-in-exit-code-22.05"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "JobLaunchFailure",
                  "description": "prolog failed"}, LIVE,
                 Want(State.ENDED, CauseKind.LAUNCH_FAILED, Provenance.SLURM, "prolog failed"),
                 id="42-failed-job-launch-failure"),
    pytest.param({**ENDED, "base_state": "FAILED", "flags": ("LAUNCH_FAILED",), "reason": ""},
                 LIVE, Want(State.ENDED, CauseKind.LAUNCH_FAILED, Provenance.SLURM),
                 id="42-failed-launch-failed-flag"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "SystemFailure", "return_code": 1},
                 LIVE, Want(State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM,
                            "SystemFailure", exit_code=1), id="42-failed-other-reason"),
    pytest.param({**ENDED, "base_state": "TIMEOUT", "reason": "TimeLimit", "signal": 15}, LIVE,
                 Want(State.ENDED, CauseKind.TIMEOUT, Provenance.SLURM), id="42-timeout"),
    pytest.param({**ENDED, "base_state": "OUT_OF_MEMORY", "reason": "OutOfMemory",
                  "return_code": 0}, LIVE,
                 Want(State.ENDED, CauseKind.OUT_OF_MEMORY, Provenance.SLURM), id="42-oom"),
    pytest.param({**ENDED, "base_state": "NODE_FAIL", "reason": "NodeDown"}, LIVE,
                 Want(State.ENDED, CauseKind.NODE_LOST, Provenance.SLURM), id="42-node-fail"),
    pytest.param({**ENDED, "base_state": "BOOT_FAIL"}, LIVE,
                 Want(State.ENDED, CauseKind.BOOT_FAILED, Provenance.SLURM), id="42-boot-fail"),
    pytest.param({**ENDED, "base_state": "PREEMPTED"}, LIVE,
                 Want(State.ENDED, CauseKind.PREEMPTED, Provenance.SLURM), id="42-preempted"),
    pytest.param({**ENDED, "base_state": "PREEMPTED", "preempt_time": T + 30}, LIVE,
                 Want(State.ENDED, CauseKind.PREEMPTED, Provenance.SLURM),
                 id="42-preempted-grace-over"),
    pytest.param({**ENDED, "base_state": "PREEMPTED", "preempt_time": T + 30,
                  "end_time": NOW + 60}, LIVE,
                 Want(State.RUNNING, detail=f"preempted at {T + 30}, ends by {NOW + 60}"),
                 id="42-preempted-still-in-grace"),
    pytest.param({**ENDED, "base_state": "DEADLINE", "reason": "DeadLine"}, LIVE,
                 Want(State.ENDED, CauseKind.DEADLINE, Provenance.SLURM), id="42-deadline"),
    pytest.param({**ENDED, "base_state": "CANCELLED", "signal": 15}, LIVE,
                 Want(State.ENDED, CauseKind.CANCELLED, Provenance.USER), id="42-cancelled"),
    pytest.param({**ENDED, "base_state": "CANCELLED", "flags": ("COMPLETING",)}, LIVE,
                 Want(State.ENDED, CauseKind.CANCELLED, Provenance.USER),
                 id="42-cancelled-completing"),
    pytest.param({**ENDED, "base_state": "CANCELLED", "description": "Duplicate jobid"}, LIVE,
                 Want(State.ENDED, CauseKind.LOST, Provenance.SLURM,
                      "cancelled by Slurm: Duplicate jobid"), id="42-cancelled-by-slurm"),
    pytest.param({**ENDED, "base_state": "CANCELLED", "kill_request_user": "admin"}, LIVE,
                 Want(State.ENDED, CauseKind.CANCELLED, Provenance.USER),
                 id="42-live-cancel-names-no-requester"),
    pytest.param({**ENDED, "base_state": "WARPED"}, LIVE,
                 Want(State.ENDED, CauseKind.UNKNOWN, Provenance.UNKNOWN, "WARPED"),
                 id="42-unknown-base-state"),
    pytest.param({**RUNNING, "flags": ("FUTURE_FLAG",)}, LIVE,
                 Want(State.ENDED, CauseKind.UNKNOWN, Provenance.UNKNOWN, "RUNNING,FUTURE_FLAG"),
                 id="42-unknown-flag"),
    pytest.param({"reason": "BeginTime", "eligible_time": hold_at(7), "flags": ("NEW",)}, LIVE,
                 Want(State.ENDED, CauseKind.UNKNOWN, Provenance.UNKNOWN, "PENDING,NEW"),
                 id="42-unknown-flag-on-pending-job"),
    pytest.param({"base_state": "", "flags": ("REVOKED",)}, LIVE,
                 Want(State.ENDED, CauseKind.UNKNOWN, Provenance.UNKNOWN, "REVOKED"),
                 id="42-string-dialect-flag-with-no-known-base"),
    pytest.param({"base_state": "", "flags": ()}, LIVE,
                 Want(State.ENDED, CauseKind.UNKNOWN), id="42-no-state-at-all"),
    # ---- SPEC §4.3: sacct --------------------------------------------------------------
    pytest.param({**ENDED, "base_state": "COMPLETED", "restart_count": None}, ACCT,
                 Want(State.ENDED, CauseKind.COMPLETED, Provenance.SLURM),
                 id="43-completed"),
    pytest.param({**ENDED, "base_state": "FAILED", "return_code": 3}, ACCT,
                 Want(State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM, exit_code=3),
                 id="43-failed-reason-none-carries-exit-code"),
    pytest.param({**ENDED, "base_state": "FAILED", "return_code": 0}, ACCT,
                 Want(State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM, exit_code=0),
                 id="43-failed-exit-code-zero-included"),
    pytest.param({**ENDED, "base_state": "FAILED", "return_code": None}, ACCT,
                 Want(State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM),
                 id="43-failed-22.05-json-exit-code-unknown"),
    pytest.param({**ENDED, "base_state": "FAILED", "flags": ("LAUNCH_FAILED",),
                  "return_code": 1}, ACCT,
                 Want(State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM, exit_code=1),
                 id="43-launch-failure-reads-no-flags"),
    pytest.param({**ENDED, "base_state": "FAILED", "reason": "JobLaunchFailure"}, ACCT,
                 Want(State.ENDED, CauseKind.LAUNCH_FAILED, Provenance.SLURM),
                 id="43-launch-failure-reason"),
    pytest.param({**ENDED, "base_state": "FAILED", "signal": 9}, ACCT,
                 Want(State.ENDED, CauseKind.SIGNALED, Provenance.SLURM, "signal 9"),
                 id="43-signaled"),
    pytest.param({**ENDED, "base_state": "PREEMPTED"}, ACCT,
                 Want(State.ENDED, CauseKind.PREEMPTED, Provenance.SLURM), id="43-preempted"),
    pytest.param({**ENDED, "base_state": "PREEMPTED", "preempt_time": T + 30,
                  "end_time": NOW + 60}, ACCT,
                 Want(State.ENDED, CauseKind.PREEMPTED, Provenance.SLURM),
                 id="43-preempted-always-preempted"),
    pytest.param({**ENDED, "base_state": "CANCELLED", "kill_request_user": "svc"}, ACCT,
                 Want(State.ENDED, CauseKind.CANCELLED, Provenance.USER),
                 id="43-cancelled-by-owner"),
    pytest.param({**ENDED, "base_state": "CANCELLED", "kill_request_user": "admin"}, ACCT,
                 Want(State.ENDED, CauseKind.CANCELLED, Provenance.ADMIN, "cancelled by admin"),
                 id="43-cancelled-by-someone-else"),
    pytest.param({**ENDED, "base_state": "CANCELLED"}, ACCT,
                 Want(State.ENDED, CauseKind.CANCELLED, Provenance.USER),
                 id="43-cancelled-no-requester"),
    pytest.param({**ENDED, "base_state": "TIMEOUT"}, ACCT,
                 Want(State.ENDED, CauseKind.TIMEOUT, Provenance.SLURM), id="43-timeout"),
    pytest.param({**ENDED, "base_state": "OUT_OF_MEMORY"}, ACCT,
                 Want(State.ENDED, CauseKind.OUT_OF_MEMORY, Provenance.SLURM), id="43-oom"),
    pytest.param({**ENDED, "base_state": "NODE_FAIL"}, ACCT,
                 Want(State.ENDED, CauseKind.NODE_LOST, Provenance.SLURM), id="43-node-fail"),
    pytest.param({**ENDED, "base_state": "BOOT_FAIL"}, ACCT,
                 Want(State.ENDED, CauseKind.BOOT_FAILED, Provenance.SLURM), id="43-boot-fail"),
    pytest.param({**ENDED, "base_state": "DEADLINE"}, ACCT,
                 Want(State.ENDED, CauseKind.DEADLINE, Provenance.SLURM), id="43-deadline"),
    pytest.param({**ENDED, "base_state": "WARPED", "state_text": "WARPED by 5"}, ACCT,
                 Want(State.ENDED, CauseKind.UNKNOWN, Provenance.UNKNOWN, "WARPED by 5"),
                 id="43-state-with-no-row"),
]


@pytest.mark.parametrize(("changes", "source", "want"), CASES)
def test_table(changes: dict[str, Any], source: str, want: Want) -> None:
    obs = classify(job(**changes), source=source, now=NOW)
    got = Want(obs.state, obs.cause.kind, obs.cause.provenance, obs.cause.detail,
               obs.exit_code, obs.hold_instance)
    assert got == want
    assert obs.cause.kind not in CONTROLLER_ONLY_CAUSES
    assert obs.source is Source(source)
    if source == ACCT:
        assert (obs.restart_count, obs.hold_instance, obs.requeued) == (None, None, False)


def test_every_rule_is_a_table_case() -> None:
    """Each row of each table is hit by at least one case of CASES."""
    hit = {matching_rule(job(**cast(dict[str, Any], p.values[0])), source=cast(str, p.values[1]),
                         now=NOW).name for p in CASES}
    names = [rule.name for rules in BASE_RULES.values() for rule in rules] + [UNKNOWN_RULE.name]
    assert len(names) == len(set(names))
    assert set(names) - hit == set()


def test_no_rule_names_a_controller_only_cause() -> None:
    rules = [*PENDING_RULES, UNKNOWN_RULE, *(r for rs in BASE_RULES.values() for r in rs)]
    assert not {rule.cause for rule in rules} & CONTROLLER_ONLY_CAUSES


@pytest.mark.parametrize("changes", [
    pytest.param({"base_state": "PENDING"}, id="pending"),
    pytest.param({**RUNNING}, id="running"),
    pytest.param({**RUNNING, "base_state": "SUSPENDED"}, id="suspended"),
    pytest.param({"base_state": "PENDING", "flags": ("REQUEUED",)}, id="requeued-list"),
    pytest.param({"base_state": "", "flags": ("REQUEUED",)}, id="requeued-string"),
    pytest.param({"base_state": "", "flags": ("RESIZING",)}, id="resizing-string"),
    pytest.param({"base_state": "PENDING", "flags": ("RESIZING",)}, id="resizing-list"),
    pytest.param({**RUNNING, "flags": ("RESIZING",)}, id="running-resizing"),
])
def test_sacct_refuses_rows_still_in_flight(changes: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="accounting cannot tell"):
        classify(job(**changes), source=Source.ACCOUNTING, now=NOW)


# --------------------------------------------------------------------------------------
# identity: SPEC §2


@pytest.mark.parametrize(("changes", "source", "identity"), [
    pytest.param({}, LIVE, (2, 1, False), id="ours"),
    pytest.param({"comment": "dispatch:s=1;a=0"}, LIVE, (1, 0, False), id="attempt-zero"),
    pytest.param({"comment": "dispatch:s=01;a=0"}, LIVE, (None, None, True),
                 id="leading-zero-submission-is-foreign"),
    pytest.param({"comment": "dispatch:s=1;a=00"}, LIVE, (None, None, True),
                 id="leading-zero-attempt-is-foreign"),
    pytest.param({"comment": "dispatch:s=0;a=0"}, LIVE, (None, None, True),
                 id="submission-zero-is-foreign"),
    pytest.param({"comment": "dispatch:s=1;a=0 "}, LIVE, (None, None, True),
                 id="trailing-space-is-foreign"),
    pytest.param({"comment": None}, LIVE, (None, None, True), id="no-comment-live-is-foreign"),
    pytest.param({"comment": "my job"}, LIVE, (None, None, True), id="other-comment-foreign"),
    pytest.param({"name": "DJ-" + ULID}, LIVE, (None, None, True),
                 id="upper-case-prefix-is-not-ours"),
    pytest.param({"name": "dj-" + ULID.lower()}, LIVE, (None, None, True),
                 id="lower-case-ulid-is-not-ours"),
    pytest.param({"name": "dj-held"}, LIVE, (None, None, True), id="not-a-ulid-is-not-ours"),
    pytest.param({"name": NAME + "x"}, LIVE, (None, None, True), id="longer-name-not-ours"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "comment": None}, ACCT,
                 (None, None, False), id="sacct-without-job-comment-is-unknown"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "comment": ""}, ACCT,
                 (None, None, False), id="sacct-empty-comment-is-unknown"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "comment": "other"}, ACCT,
                 (None, None, True), id="sacct-other-comment-is-foreign"),
    pytest.param({**ENDED, "base_state": "COMPLETED"}, ACCT, (2, 1, False),
                 id="sacct-with-comment"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "name": "dj-x", "comment": None}, ACCT,
                 (None, None, True), id="sacct-not-our-name"),
])
def test_identity(changes: dict[str, Any], source: str,
                  identity: tuple[int | None, int | None, bool]) -> None:
    obs = classify(job(**changes), source=source, now=NOW)
    assert (obs.submission, obs.attempt, obs.foreign) == identity
    assert obs.ref.uid == changes.get("name", NAME)


def test_foreign_objects_keep_their_state_and_cause() -> None:
    obs = classify(job(**ENDED, base_state="FAILED", reason="NonZeroExitCode", return_code=2,
                       comment="hello"), now=NOW)
    assert obs.foreign and obs.state is State.ENDED
    assert (obs.cause.kind, obs.exit_code) == (CauseKind.NON_ZERO_EXIT, 2)


# --------------------------------------------------------------------------------------
# the other facts


@pytest.mark.parametrize(("changes", "now", "times"), [
    pytest.param({**ENDED, "base_state": "COMPLETED"}, NOW, (T, T + 5, T + 60),
                 id="ended-times-kept"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "end_time": NOW + 1}, NOW, (T, T + 5, None),
                 id="end-ahead-of-now-says-nothing"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "end_time": NOW}, NOW, (T, T + 5, NOW),
                 id="end-at-now-kept"),
    pytest.param({**ENDED, "base_state": "COMPLETED", "end_time": NOW + 1}, None,
                 (T, T + 5, NOW + 1), id="no-clock-keeps-end"),
    pytest.param(RUNNING, NOW, (T, T + 5, None), id="running-end-is-an-estimate"),
    pytest.param({**RUNNING, "start_time": NOW + 9}, NOW, (T, None, None),
                 id="start-ahead-of-now-says-nothing"),
    pytest.param({"start_time": T + 99, "end_time": 6091008437}, NOW, (T, None, None),
                 id="pending-start-and-end-are-estimates"),
    pytest.param({"submit_time": None}, NOW, (None, None, None), id="no-submit"),
])
def test_times(changes: dict[str, Any], now: int | None,
               times: tuple[int | None, int | None, int | None]) -> None:
    obs = classify(job(**changes), now=now)
    assert (obs.submit, obs.start, obs.end) == times


def test_exit_code_only_with_non_zero_exit() -> None:
    for base in ("COMPLETED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY"):
        for source in (LIVE, ACCT):
            obs = classify(job(**ENDED, base_state=base, return_code=7), source=source, now=NOW)
            assert obs.exit_code is None, (base, source)


def test_ref_observed_at_and_passthrough_facts() -> None:
    record = job(**RUNNING, restart_count=3, flags=("REQUEUED",), reason="Prolog",
                 time_limit_s=600, eligible_time=T + 2, submit_time=None)
    obs = classify(record, source=Source.LIVE, cluster="prod", now=NOW)
    assert obs.ref == ObjectRef(cluster="prod", uid=NAME, id=21, submit=0)
    assert (obs.restart_count, obs.requeued, obs.reason) == (3, True, "Prolog")
    assert (obs.time_limit_s, obs.eligible, obs.nodes, obs.observed_at) == (
        600, T + 2, ("node01",), NOW)
    assert classify(record).observed_at == 0
    assert classify(record).ref.cluster == "lab"
    assert classify(job(description="job requeued in held state")).reason == (
        "job requeued in held state")


def test_source_names() -> None:
    assert classify(job(**ENDED, base_state="COMPLETED"), source="accounting").source is (
        Source.ACCOUNTING)
    with pytest.raises(ErrInvalid):
        classify(job(), source="database")


# --------------------------------------------------------------------------------------
# recorded and hand-written text through classify


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def as_ours(record: SlurmJob) -> SlurmJob:
    """The recorded test jobs were named dj-fail, dj-held...: give them a real discovery
    name, the same for a recorded and a hand-written row, so comparisons cover identity."""
    return dataclasses.replace(record, name=f"dj-01JZ8Q2N5V{record.job_id:016d}")


def squeue_records() -> dict[int, SlurmJob]:
    """testdata/slurm/text/squeue.txt: hand-written rows in the reader's own format."""
    jobs = parse_squeue_text(read(DATA / "text" / "squeue.txt"))
    return {record.job_id: as_ours(record) for record in jobs}


# The -O columns of the recorded 22.05 squeue text (captures-22.05/INDEX.md).
CAPTURED_SQUEUE_COLUMNS = ("JobID", "Name", "StateCompact", "State", "Reason", "SubmitTime",
                           "StartTime", "EndTime", "Comment", "NodeList", "Requeue",
                           "RestartCnt")


def captured_row(capture: str) -> SlurmJob:
    """The one ``squeue -j <id> -O ...`` row of a recorded 22.05 capture."""
    lines = read(R22 / f"{capture}.squeue-text.txt").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and " -O " in line)
    [record] = parse_squeue_text(lines[start + 1] + "\n", columns=CAPTURED_SQUEUE_COLUMNS)
    return as_ours(record)


# (recorded capture, job id, the capture's clock): the hand-written rows mirror these jobs.
MIRRORED = [
    pytest.param("pending-held", 3, 1796041108, id="pending-held-gate"),
    pytest.param("running", 6, 1796041108, id="running"),
    pytest.param("failed-exit3", 9, 1796041117, id="failed-exit-3"),
    pytest.param("cancelled", 10, 1796041119, id="cancelled"),
    pytest.param("nodefail-norequeue", 13, 1796041192, id="node-fail"),
]


@pytest.mark.parametrize(("capture", "job_id", "now"), MIRRORED)
def test_hand_written_rows_observed_as_the_recorded_ones(capture: str, job_id: int,
                                                         now: int) -> None:
    """The recorded rows lack EligibleTime and exit_code (not asked for then); the rest of
    the observation is the same."""
    recorded = classify(captured_row(capture), cluster="lab", now=now)
    written = classify(squeue_records()[job_id], now=now)
    assert recorded == dataclasses.replace(written, eligible=None, exit_code=None)


def test_failed_exit3_observation_literal() -> None:
    recorded = squeue_records()[9]
    assert classify(recorded, now=1796041117) == ObjectObs(
        ref=ObjectRef(cluster="lab", uid="dj-01JZ8Q2N5V0000000000000009", id=9,
                      submit=1796041112),
        state=State.ENDED, cause=Cause(CauseKind.NON_ZERO_EXIT, Provenance.SLURM, ""),
        submission=9, attempt=0, foreign=False, restart_count=0, hold_instance=None,
        requeued=False, exit_code=3, nodes=("vm",), reason="NonZeroExitCode",
        submit=1796041112, start=1796041113, end=1796041113, source=Source.LIVE,
        observed_at=1796041117, time_limit_s=None, eligible=1796041112)


def test_recorded_names_are_never_ours() -> None:
    """The hand-written rows keep the recorded 22.05 names, which (but job 1's) are not
    discovery names: never ours, still classified."""
    jobs = {j.job_id: j for j in parse_squeue_text(read(DATA / "text" / "squeue.txt"))}
    gate = classify(jobs[3], now=1796041108)
    assert (gate.state, gate.foreign, gate.hold_instance) == (State.GATED, True, None)
    # --begin exactly ten calendar years on = ten Julian years + 12 h: decodes as hold 43200
    far = classify(jobs[5], now=1796041108)
    assert (far.state, far.cause.provenance, far.hold_instance) == (
        State.HELD, Provenance.DISPATCH, 43200)
    requeued = classify(jobs[1], now=1796041108)
    assert (requeued.state, requeued.cause.kind, requeued.foreign, requeued.submission) == (
        State.PENDING, CauseKind.REQUEUED, False, 1)


@pytest.mark.parametrize(("job_id", "want"), [
    pytest.param(21, (State.RUNNING, CauseKind.NONE, False), id="running-preempt-time"),
    pytest.param(22, (State.ENDED, CauseKind.SIGNALED, False), id="raised-signal"),
    pytest.param(23, (State.HELD, CauseKind.NONE, False), id="dispatch-hold"),
    pytest.param(24, (State.GATED, CauseKind.NONE, False), id="gate-with-hold"),
    pytest.param(26, (State.HELD, CauseKind.LAUNCH_FAILED, False), id="max-requeue"),
    pytest.param(28, (State.ENDED, CauseKind.OUT_OF_MEMORY, False), id="oom"),
    pytest.param(29, (State.ENDED, CauseKind.COMPLETED, True), id="leading-zero-comment"),
    pytest.param(30, (State.PENDING, CauseKind.UNRUNNABLE, False), id="unrunnable"),
])
def test_dispatch_jobs_observed(job_id: int, want: tuple[State, CauseKind, bool]) -> None:
    obs = classify(squeue_records()[job_id], now=NOW)
    assert (obs.state, obs.cause.kind, obs.foreign) == want


def test_hold_instance_from_text() -> None:
    records = squeue_records()
    assert classify(records[23], now=NOW).hold_instance == 7
    assert classify(records[24], now=NOW).hold_instance == 9


def test_a_flag_in_place_of_the_base_state() -> None:
    """CANCELLED+COMPLETING prints as COMPLETING in the text: it stays running (on its
    nodes) until Slurm prints the final state."""
    records = squeue_records()
    obs = classify(records[25], now=NOW)
    assert (obs.state, obs.cause.kind) == (State.RUNNING, CauseKind.NONE)
    configuring = classify(records[27], now=NOW)
    assert (configuring.state, configuring.cause.detail) == (
        State.RUNNING, "CONFIGURING: base state not reported")


def test_requeue_hold_in_flight_22_05() -> None:
    """22.05 printed COMPLETING for a job being requeued-held; a moment later PENDING."""
    during = text_row("COMPLETING", "CG", restart=1)
    obs = classify(during, now=NOW)
    assert (obs.state, obs.cause.detail, obs.restart_count) == (
        State.RUNNING, "COMPLETING: base state not reported", 1)
    text = read(R22 / "requeuehold-running.squeue-text.txt").splitlines()
    line = next(row for row in text if row.startswith("6|dj-running|PD|"))
    [after] = parse_squeue_text(line + "\n", columns=CAPTURED_SQUEUE_COLUMNS)
    obs = classify(as_ours(after), now=1796041129)
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == (
        State.HELD, CauseKind.REQUEUED, Provenance.SLURM)


def sacct_records() -> dict[int, SlurmJob]:
    """testdata/slurm/text/sacct.txt: hand-written rows in the reader's own format."""
    jobs = parse_sacct_text(read(DATA / "text" / "sacct.txt"))
    return {record.job_id: as_ours(record) for record in jobs}


@pytest.mark.parametrize(("job_id", "want"), [
    pytest.param(10, (CauseKind.COMPLETED, Provenance.SLURM, None), id="completed"),
    pytest.param(11, (CauseKind.NON_ZERO_EXIT, Provenance.SLURM, 3), id="failed-exit-3"),
    pytest.param(12, (CauseKind.CANCELLED, Provenance.USER, None), id="cancelled-by-owner"),
    pytest.param(15, (CauseKind.NODE_LOST, Provenance.SLURM, None), id="node-fail"),
    pytest.param(41, (CauseKind.CANCELLED, Provenance.ADMIN, None), id="cancelled-by-admin"),
    pytest.param(42, (CauseKind.PREEMPTED, Provenance.SLURM, None), id="preempted"),
    pytest.param(43, (CauseKind.TIMEOUT, Provenance.SLURM, None), id="timeout-no-comment"),
    pytest.param(45, (CauseKind.LAUNCH_FAILED, Provenance.SLURM, None), id="launch-failure"),
    pytest.param(46, (CauseKind.BOOT_FAILED, Provenance.SLURM, None), id="boot-fail"),
    pytest.param(47, (CauseKind.DEADLINE, Provenance.SLURM, None), id="deadline"),
])
def test_sacct_text_observations(job_id: int,
                                 want: tuple[CauseKind, Provenance, int | None]) -> None:
    obs = classify(sacct_records()[job_id], source=ACCT, now=NOW)
    assert (obs.cause.kind, obs.cause.provenance, obs.exit_code) == want
    assert obs.state is State.ENDED and not obs.foreign
    assert (obs.submission is None) == (job_id == 43)  # 43 has no job_comment


def test_sacct_requeued_row_refused() -> None:
    with pytest.raises(ProtocolError):
        classify(sacct_records()[44], source=ACCT, now=NOW)


def captured_sacct_rows() -> list[SlurmJob]:
    """The ``sacct -D`` rows of the recorded 22.05 capture, in order."""
    lines = read(R22 / "sacct-text.txt").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$ sacct -D"))
    body = []
    for line in lines[start + 2:]:  # skip the command and sacct's header
        if not line or line.startswith(("$", "#", "rc=")):
            break
        body.append(line)
    return parse_sacct_text("\n".join(body), columns=(
        "JobID", "JobName", "State", "ExitCode", "Comment", "Submit", "Start", "End",
        "NodeList", "Reason"))


@pytest.mark.parametrize(("job_id", "want"), [
    pytest.param(10, (CauseKind.COMPLETED, None), id="completed"),
    pytest.param(11, (CauseKind.NON_ZERO_EXIT, 3), id="failed-exit-3"),
    pytest.param(12, (CauseKind.CANCELLED, None), id="cancelled"),
    pytest.param(15, (CauseKind.NODE_LOST, None), id="node-fail"),
    pytest.param(16, (CauseKind.CANCELLED, None), id="cancelled-held"),
])
def test_22_05_recorded_sacct_text(job_id: int, want: tuple[CauseKind, int | None]) -> None:
    """The text keeps a failed job's return code (22.05's sacct JSON reported 0)."""
    [record] = [r for r in captured_sacct_rows() if r.job_id == job_id]
    obs = classify(record, source=ACCT, cluster="lab", now=NOW)
    assert obs.state is State.ENDED
    assert (obs.cause.kind, obs.exit_code) == want


def test_22_05_sacct_requeued_rows_refused() -> None:
    rows = [record for record in captured_sacct_rows() if record.job_id == 18]
    assert [record.state_text for record in rows] == ["REQUEUED", "PENDING"]
    for record in rows:
        with pytest.raises(ProtocolError, match="accounting cannot tell"):
            classify(record, source=ACCT, now=NOW)


def test_recorded_probe_jobs_observed() -> None:
    """Recorded on the 22.05 lab cluster with the reader's own text format."""
    now = 1796043187
    seen = []
    for job in parse_squeue_text(read(R22 / "probe.squeue-text.txt")):
        obs = classify(as_ours(job), now=now)
        seen.append((obs.state, obs.cause.kind, obs.exit_code, obs.submission))
    assert seen == [(State.ENDED, CauseKind.NON_ZERO_EXIT, 3, 1),
                    (State.GATED, CauseKind.NONE, None, 2),
                    (State.RUNNING, CauseKind.NONE, None, 3)]


# --------------------------------------------------------------------------------------
# whole observations of every recorded and hand-written input, pinned in golden files
# (testdata/golden/obs; ``pytest --update-golden`` rewrites them, review the diff)

GOLDEN = DATA.parent / "golden" / "obs"
GOLDEN_INPUTS = [
    ("22.05/probe.squeue-text.txt", "squeue-text", 1796043187),
    ("22.05/probe-after-cancel.squeue-text.txt", "squeue-text", 1796043190),
    ("22.05/probe.sacct-text.txt", "sacct-text", 1796043197),
    ("text/squeue.txt", "squeue-text", NOW),
    ("text/sacct.txt", "sacct-text", NOW),
]
PARSE = {"squeue-text": parse_squeue_text, "sacct-text": parse_sacct_text}


def obs_document(obs: ObjectObs) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        return value.value if isinstance(value, State | CauseKind | Provenance | Source) else value
    document: dict[str, Any] = plain(dataclasses.asdict(obs))
    if document["ref"]["sluid"] is None:  # none of these captures asked for the SLUID
        del document["ref"]["sluid"]
    return document


def observe_all(kind: str, text: str, now: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    source = Source.ACCOUNTING if kind.startswith("sacct") else Source.LIVE
    for record in PARSE[kind](text):
        try:
            out.append(obs_document(classify(record, source=source, now=now)))
        except ProtocolError as exc:
            out.append({"job_id": record.job_id, "refused": str(exc)})
    return out


@pytest.mark.parametrize(("relative", "kind", "now"),
                         [pytest.param(*case, id=case[0]) for case in GOLDEN_INPUTS])
def test_observations_match_golden(relative: str, kind: str, now: int) -> None:
    got = observe_all(kind, read(DATA / relative), now)
    golden = GOLDEN / (relative.replace("/", "--").rsplit(".", 1)[0] + ".json")
    rendered = json.dumps({"input": f"testdata/slurm/{relative}", "now": now,
                           "observations": got}, indent=1) + "\n"
    if os.environ.get("UPDATE_GOLDEN", "") not in ("", "0"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
    assert golden.exists(), f"{golden} missing; run pytest --update-golden and review it"
    assert rendered == golden.read_text(encoding="utf-8")


def test_every_golden_has_an_input() -> None:
    expected = {relative.replace("/", "--").rsplit(".", 1)[0] + ".json"
                for relative, _, _ in GOLDEN_INPUTS}
    assert {path.name for path in GOLDEN.glob("*.json")} == expected


# --------------------------------------------------------------------------------------
# issue 9: compound state words, launch-failed holds, and cancels Slurm made itself

TEXT_COLUMNS = ("JobID", "Name", "UserName", "StateCompact", "State", "Reason", "SubmitTime",
                "StartTime", "EndTime", "RestartCnt", "NodeList", "Comment")


def text_row(state: str, compact: str, *, reason: str = "None", restart: int = 0,
             start: str = "2026-12-01T00:00:05", end: str = "2026-12-01T00:00:09",
             nodes: str = "node01") -> SlurmJob:
    line = (f"21|{NAME}|svc|{compact}|{state}|{reason}|2026-12-01T00:00:00|{start}|{end}|"
            f"{restart}|{nodes}|dispatch:s=2;a=1|\n")
    [record] = parse_squeue_text(line, columns=TEXT_COLUMNS)
    return record


@pytest.mark.parametrize(("state", "compact", "restart", "want"), [
    pytest.param("CANCELLED,COMPLETING", "CG", 0,
                 (State.ENDED, CauseKind.CANCELLED, Provenance.USER), id="cancelled-completing"),
    pytest.param("CANCELLED,COMPLETING", "CA", 0,
                 (State.ENDED, CauseKind.CANCELLED, Provenance.USER),
                 id="cancelled-completing-compact-base"),
    pytest.param("TIMEOUT,COMPLETING", "CG", 0,
                 (State.ENDED, CauseKind.TIMEOUT, Provenance.SLURM), id="timeout-completing"),
    pytest.param("COMPLETED,COMPLETING", "CG", 0,
                 (State.ENDED, CauseKind.COMPLETED, Provenance.SLURM), id="completed-completing"),
    pytest.param("RUNNING,CONFIGURING", "CF", 0, (State.RUNNING, CauseKind.NONE,
                                                  Provenance.UNKNOWN), id="running-configuring"),
    pytest.param("PENDING,COMPLETING", "CG", 1,
                 (State.PENDING, CauseKind.REQUEUED, Provenance.SLURM), id="pending-completing"),
])
def test_text_reader_compound_state_words(state: str, compact: str, restart: int,
                                          want: tuple[State, CauseKind, Provenance]) -> None:
    """SPEC §4.2: flags change nothing; a ``X,COMPLETING`` text row is its base state."""
    obs = classify(text_row(state, compact, restart=restart,
                            reason="BeginTime" if state.startswith("PENDING") else "None"),
                   now=NOW)
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == want


@pytest.mark.parametrize("description", [
    "launch failed requeued held",
    "user env retrieval failed requeued held",
])
def test_launch_failure_holds_are_launch_failed(description: str) -> None:
    """Both of Slurm's launch-failure hold descriptions (slurm-reference §3) are
    launch-failed, not requeued; from the text reader too."""
    obs = classify(job(reason="JobHeldUser", restart_count=1, description=description),
                   now=NOW)
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == (
        State.HELD, CauseKind.LAUNCH_FAILED, Provenance.SLURM)
    row = text_row("PENDING", "PD", reason=description, restart=1, start="N/A", end="N/A",
                   nodes="")
    assert classify(row, now=NOW).cause.kind is CauseKind.LAUNCH_FAILED


SACCT_COLUMNS = ("JobIDRaw", "JobName", "User", "UID", "State", "Reason", "Submit", "Start",
                 "End", "ExitCode", "NodeList", "Comment")


def sacct_row(state: str, *, user: str = "svc", uid: int = 1001, reason: str = "None",
              start: str = "2026-12-01T00:00:05", end: str = "2026-12-01T00:00:09") -> SlurmJob:
    line = (f"21|{NAME}|{user}|{uid}|{state}|{reason}|2026-12-01T00:00:00|{start}|"
            f"{end}|0:0|node01|dispatch:s=2;a=1\n")
    [record] = parse_sacct_text(line, columns=SACCT_COLUMNS)
    return record


LOST = (State.ENDED, CauseKind.LOST, Provenance.SLURM)


@pytest.mark.parametrize(("record", "source", "want"), [
    pytest.param(sacct_row("CANCELLED by 1001"), ACCT,
                 (State.ENDED, CauseKind.CANCELLED, Provenance.USER), id="by-the-owner"),
    pytest.param(sacct_row("CANCELLED by 1002"), ACCT,
                 (State.ENDED, CauseKind.CANCELLED, Provenance.ADMIN), id="by-another-user"),
    pytest.param(sacct_row("CANCELLED by 0"), ACCT, LOST, id="by-uid-0"),
    pytest.param(sacct_row("CANCELLED by 0", user="root", uid=0), ACCT,
                 (State.ENDED, CauseKind.CANCELLED, Provenance.USER), id="root-job-by-root"),
    pytest.param(sacct_row("CANCELLED"), ACCT, LOST, id="state-loss-flush-no-requester"),
    pytest.param(sacct_row("CANCELLED", start="Unknown"), ACCT, LOST,
                 id="state-loss-flush-pending"),
    pytest.param(job(**ENDED, base_state="CANCELLED", description="Duplicate jobid"), LIVE,
                 LOST, id="live-duplicate-jobid"),
    pytest.param(job(**ENDED, base_state="CANCELLED", reason="Duplicate jobid on nodes node01"),
                 LIVE, LOST, id="live-duplicate-jobid-reason"),
])
def test_cancels_slurm_made_itself_are_lost(record: SlurmJob, source: str,
                                            want: tuple[State, CauseKind, Provenance]) -> None:
    """Issue 9: a cancel Slurm made itself (state-loss flush, "Duplicate jobid", uid 0 or
    the Slurm user) is never a user's cancel: cause lost, provenance slurm."""
    obs = classify(record, source=source, now=SACCT_NOW)
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == want


SACCT_NOW = 1_796_083_209 + 3600  # an hour after sacct_row's end (2026-12-01T00:00:09)


def test_cancel_with_no_requester_yet_is_refused_for_a_minute() -> None:
    """A user's scancel was once seen without its requester 4 s later (probe.when.txt):
    until REQUESTER_SETTLE_S after the end the record is not classifiable yet."""
    record = sacct_row("CANCELLED")
    end = 1_796_083_209
    assert record.end_time == end
    with pytest.raises(ProtocolError, match="no requester"):
        classify(record, source=ACCT, now=end + 4)
    assert classify(record, source=ACCT, now=end + 60).cause.kind is CauseKind.LOST
    assert valid_until(record, now=end + 4, source=Source.ACCOUNTING) == end + 60
    assert valid_until(record, now=end + 4) is None


def test_slurm_user_cancel_is_lost() -> None:
    """With SlurmUser=slurm(64030), a cancel by uid 64030 is Slurm's own."""
    record = sacct_row("CANCELLED by 64030")
    assert classify(record, source=ACCT, now=SACCT_NOW).cause.kind is CauseKind.CANCELLED
    obs = classify(record, source=ACCT, now=SACCT_NOW, slurm_uids=frozenset({0, 64030}))
    assert (obs.cause.kind, obs.cause.provenance) == (CauseKind.LOST, Provenance.SLURM)
