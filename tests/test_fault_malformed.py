"""Fault 5: malformed Slurm output fed through the REAL parsing path.

The real ``SlurmAdapter`` (and, for the tick, the real ``Reconciler`` on a real SQLite
store) reads canned squeue/sacct output from a runner that answers like Slurm would --
but with the row of our job damaged: truncated, an unknown base state, an odd node
list, an impossible time, a shifted column, a comment with a leading zero, a name in
the wrong case. Every command the adapter runs is recorded. Each case must end in a
clear error (ProtocolError: the tick changes no job) or a foreign/unknown observation,
and never in a Slurm write (scancel, scontrol update/release/...) nor an sbatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.client import Client
from controller.errors import ErrConflict, ErrNotFound, ProtocolError
from controller.metrics import Metrics
from controller.model.job import Current, Desired, JobState, Phase
from controller.model.obs import CauseKind, ObjectRef, State
from controller.model.policy import parse_policy
from controller.model.spec import parse_job_document
from controller.reconcile.tick import Reconciler, TickSettings
from controller.runner.base import CommandResult, Runner
from controller.runner.local import LocalRunner
from controller.slurm import dialects
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.script import StartSettings
from controller.store import repo
from controller.store.db import Store
from tests.daemon_harness import ran
from tests.fault_support import (
    OUTPUT_DIR,
    TERMINAL,
    FaultRow,
    ListSink,
    RecordingRunner,
    cancel_user_jobs,
    emit,
    record_row,
    recorded_executions,
    slurm_up,
    status_snapshot,
    submissions_per_job,
    tally,
    views,
    wait_for,
    wrong_writes,
)

JOB = "01JZ8Q2N5V00000000000000AA"
NAME = "dj-" + JOB
SLURM_ID = 4101
SUBMIT_TEXT = "2026-11-30T12:00:00"
SUBMIT = dialects.parse_text_time(SUBMIT_TEXT)
assert SUBMIT is not None
NOW = SUBMIT + 120
REF = ObjectRef("lab", NAME, SLURM_ID, SUBMIT)
DOC = {"command": ["sleep", "100"], "workdir": "/tmp"}


FIELDS = {
    "JobID": str(SLURM_ID), "Name": NAME, "UserName": "dispatch", "StateCompact": "R",
    "State": "RUNNING", "Reason": "None", "SubmitTime": SUBMIT_TEXT,
    "EligibleTime": SUBMIT_TEXT, "StartTime": "2026-11-30T12:00:01", "EndTime": "NONE",
    "PreemptTime": "N/A", "TimeLimit": "UNLIMITED", "Requeue": "0", "RestartCnt": "0",
    "exit_code": "0", "NodeList": "vm", "Cluster": "lab", "Comment": "dispatch:s=1;a=0",
}


def join_row(fields: Mapping[str, str]) -> str:
    return "".join(fields[c] + "|" for c in dialects.SQUEUE_TEXT_COLUMNS)


def squeue_row(**over: str) -> str:
    """One ``squeue -O <SQUEUE_TEXT_FORMAT>`` row of our running job, fields overridable."""
    return join_row({**FIELDS, **over})


# A damage: the row Slurm printed (its fields) -> the row the adapter reads instead. The
# same damage is applied to the canned row of ``FIELDS`` and to real rows on the cluster.
Damage = Callable[[Mapping[str, str]], str]


def override(**over: str) -> Damage:
    """Fields replaced; ``{ulid}``/``{lower}`` in a value stand for the row's own ULID."""
    def damage(fields: Mapping[str, str]) -> str:
        ulid = fields["Name"][len("dj-"):]
        return join_row({**fields, **{k: v.format(ulid=ulid, lower=ulid.lower())
                                      for k, v in over.items()}})
    return damage


def cut(at: Callable[[str], int]) -> Damage:
    """The row truncated at ``at(row)``."""
    def damage(fields: Mapping[str, str]) -> str:
        row = join_row(fields)
        return row[:at(row)]
    return damage


GOOD = squeue_row()
OTHER_JOB = "01JZ8Q2N5V00000000000000BB"  # another job of ours, in the same output
OTHER_REF = ObjectRef("lab", "dj-" + OTHER_JOB, 4102, SUBMIT)
OTHER = squeue_row(JobID="4102", Name="dj-" + OTHER_JOB, Comment="dispatch:s=1;a=0")


class CannedSlurm:
    """A runner answering as Slurm would from canned squeue text (sacct: no rows)."""

    def __init__(self, live: str) -> None:
        self.live = live

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None, env: Any = None) -> CommandResult:
        args = tuple(argv)
        if args[0] == "squeue" and "-j" in args:
            wanted = args[args.index("-j") + 1]
            rows = [line for line in self.live.splitlines()
                    if line.split("|", 1)[0] == wanted]
            if not rows:
                return CommandResult(args, 1, "", "slurm_load_jobs error: Invalid job id "
                                     "specified\n", 0.01)
            return CommandResult(args, 0, "\n".join(rows) + "\n", "", 0.01)
        if args[0] == "squeue":
            return CommandResult(args, 0, self.live, "", 0.01)
        if args[0] == "sacct":
            return CommandResult(args, 0, "", "", 0.01)
        return CommandResult(args, 0, "", "", 0.01)  # a write: recorded, must never happen

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        if "/.owners/" in script:  # the ownership marker (read, or written): no damage here
            return CommandResult(("/bin/sh", "-s"), 0, "", "", 0.01)
        return CommandResult(("/bin/sh", "-s"), 1, "", "refused by the test\n", 0.01)

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class Case:
    name: str
    damage: Damage  # our job's row as Slurm printed it, damaged
    outcome: str  # "error" | "foreign" | "unknown" | "unknown-state"

    @property
    def row(self) -> str:
        """The damaged row of the canned job."""
        return self.damage(FIELDS)


CASES = [
    Case("truncated-row", cut(lambda row: len(row) // 2 + 40), "error"),
    Case("truncated-no-final-bar", cut(lambda row: -1), "error"),
    Case("truncated-inside-name", cut(lambda row: row.index("|") + 16), "unknown"),
    Case("unknown-base-state", override(State="TELEPORTING", StateCompact="TP"),
         "unknown-state"),
    Case("unknown-flag-as-state", override(State="RECONFIGURING_FED", StateCompact="RF2"),
         "unknown-state"),
    Case("state-disagrees-with-compact", override(State="RUNNING", StateCompact="PD"),
         "error"),
    Case("odd-node-list-open", override(NodeList="vm[1-"), "error"),
    Case("odd-node-list-reversed", override(NodeList="vm[3-1]"), "error"),
    Case("odd-node-list-nested", override(NodeList="vm[1-[2]]"), "error"),
    Case("odd-node-list-garbage", override(NodeList="vm,,x"), "error"),
    Case("impossible-submit-time", override(SubmitTime="2026-02-30T00:00:00"), "error"),
    Case("garbage-restart-count", override(RestartCnt="-1"), "error"),
    Case("comment-leading-zero", override(Comment="dispatch:s=01;a=0"), "foreign"),
    Case("comment-leading-zero-attempt", override(Comment="dispatch:s=1;a=00"), "foreign"),
    Case("name-upper-case-prefix", override(Name="DJ-{ulid}"), "unknown"),
    Case("name-lower-case-ulid", override(Name="dj-{lower}"), "unknown"),
    Case("other-user-same-name", override(UserName="dispatch-other"), "unknown"),
]


def _store(tmp: Path, *, policy: dict[str, Any] | None = None, other: bool = True) -> Store:
    store = Store(f"sqlite:///{tmp}/malformed.db")
    store.migrate()
    spec = parse_job_document(DOC)
    # OTHER's job is tracked too: a dj- job of ours that no record owns is swept (cancelled)
    for job_id, ref in ((JOB, REF), (OTHER_JOB, OTHER_REF))[:2 if other else 1]:
        state = JobState(job_id=job_id, generation=1, desired=Desired.RUN, spec=spec,
                         policy=parse_policy(policy), phase=Phase.RUNNING, submission=1,
                         attempt=0, current=Current(1, 0, SUBMIT, ref),
                         object_state=State.RUNNING, started_at=SUBMIT + 1, nodes=("vm",),
                         observed_generation=1)
        with store.transaction() as tx:
            repo.insert_job(tx, job_id=job_id, document=DOC, policy=policy, now=SUBMIT)
            repo.save_status(tx, state, exists=False, now=SUBMIT)
            repo.record_submitted(tx, job_id, 1, ref)
    return store


def _adapter(live: str) -> tuple[SlurmAdapter, ListSink]:
    sink = ListSink()
    runner = RecordingRunner(CannedSlurm(live), sink)
    adapter = SlurmAdapter(runner, cluster="lab", settings=StartSettings(
        output_dir="/tmp/dispatch-fault-output"), user="dispatch", clock=lambda: NOW,
        stop_confirm_s=0.1)
    return adapter, sink


def _status(store: Store) -> dict[str, Any]:
    with store.transaction() as tx:
        (view,) = repo.list_jobs(tx, job_id=JOB)
    return view.to_json()


@dataclass(frozen=True)
class CaseResult:
    outcome: str  # what the read gave: the case's outcome, or "error: <message>"
    writes: int  # Slurm writes the adapter or the tick issued
    sbatches: int  # sbatch commands (a second object of a job that has a live one)
    changed: bool  # an unreadable read changed the job's status row
    lost: bool  # the job left "running" or its Slurm job, or was cancelled by us
    duplicates: int  # sbatches + submissions beyond the job's one


RESULTS: dict[str, CaseResult] = {}
EXTRA: dict[str, int] = {"unknown_state_duplicates": 0}


def _case_figures(case: Case, read_error: ProtocolError | None, sink: ListSink,
                  before: dict[str, Any], after: dict[str, Any], url: str) -> CaseResult:
    """A case's figures, from the store (the job's status and submissions after the
    tick) and every command the adapter ran."""
    cancelled = [w for w in sink.writes() if os.path.basename(w[0]) == "scancel"]
    lost = (after["phase"] != "running" or after["slurm_job_id"] != SLURM_ID
            or after["submission"] != before["submission"] or bool(cancelled))
    extra_submissions = max(0, submissions_per_job(url).get(JOB, 0) - 1)
    return CaseResult(
        outcome=(case.outcome if read_error is None else f"error: {str(read_error)[:60]}"),
        writes=len(sink.writes()), sbatches=sink.sbatches(),
        changed=case.outcome == "error" and after != before, lost=lost,
        duplicates=sink.sbatches() + extra_submissions)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_malformed_live_row(case: Case, tmp_path: Path) -> None:
    live = OTHER + "\n" + case.row + "\n"
    adapter, sink = _adapter(live)

    # 1. the batched live read: a clear error, or our job absent/foreign/unknown
    try:
        found = await adapter.find_many([JOB])
        read_error = None
    except ProtocolError as exc:
        found, read_error = {}, exc
    if case.outcome == "error":
        assert read_error is not None, found
        assert str(read_error)  # says what is wrong
    else:
        assert read_error is None
        ours = found[JOB]
        if case.outcome == "unknown":
            assert not ours
        elif case.outcome == "foreign":
            assert [o.foreign for o in ours] == [True]
        else:
            assert [(o.state, o.cause.kind) for o in ours] == [(State.ENDED, CauseKind.UNKNOWN)]

    # 2. every write, aimed straight at the ref: nothing is written
    for operation in (adapter.stop(REF), adapter.hold(REF, 1), adapter.release(REF)):
        with contextlib.suppress(ErrNotFound, ErrConflict, ProtocolError):
            await operation

    # 3. a whole tick of the real reconciler on a real store
    store = _store(tmp_path)
    before = _status(store)
    reconciler = Reconciler(store, adapter, metrics=Metrics(), clock=lambda: NOW,
                            settings=TickSettings(unknown_grace_s=600))
    report = await reconciler.tick()
    after = _status(store)
    store.dispose()
    RESULTS[case.name] = result = _case_figures(case, read_error, sink, before, after,
                                                f"sqlite:///{tmp_path}/malformed.db")
    assert not result.lost and result.duplicates == 0, result
    assert sink.writes() == [], sink.writes()
    assert sink.sbatches() == 0
    if case.outcome == "error":
        assert not report.slurm_ok
        assert after == before  # no job changed on data that could not be read
    elif case.outcome in ("unknown", "foreign"):
        assert report.slurm_ok
        assert after["phase"] == "running" and after["slurm_job_id"] == SLURM_ID
        observed = {c["type"]: c for c in after["conditions"]}
        assert observed["Observed"]["status"] is False
        if case.outcome == "foreign":
            assert observed["ForeignObjects"]["status"] is True
    else:  # a live row in a state nobody knows: never guessed, never finished on
        assert (after["phase"], after["cause"]) == ("running", "none")
        observed = {c["type"]: c for c in after["conditions"]}
        assert (observed["Observed"]["status"], observed["Observed"]["reason"]) == (
            False, "UnknownState")


async def test_live_unknown_state_is_not_resubmitted_while_in_squeue(tmp_path: Path) -> None:
    live = squeue_row(State="TELEPORTING", StateCompact="TP") + "\n"
    adapter, sink = _adapter(live)
    store = _store(tmp_path, policy={"causes": {"unknown": {"action": "resubmit",
                                                            "budget": 1}},
                                     "backoff": {"initial_s": 0}}, other=False)
    reconciler = Reconciler(store, adapter, metrics=Metrics(), clock=lambda: NOW)
    await reconciler.tick()
    await reconciler.tick()
    store.dispose()
    EXTRA["unknown_state_duplicates"] = sink.sbatches() + max(
        0, submissions_per_job(f"sqlite:///{tmp_path}/malformed.db").get(JOB, 0) - 1)
    assert sink.sbatches() == 0


# ---------------------------------------------------------------- the real cluster

REAL_JOBS = 3  # real jobs in flight while each case damages their rows
DAMAGED_TICKS = 2  # ticks of the real reconciler on each case's damaged output
# slurmctld states of an object that is no longer (or soon no longer) a running job
ENDED = frozenset({"COMPLETED", "COMPLETING", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED",
                   "SPECIAL_EXIT"})
REAL: dict[str, Any] = {}  # the figures of test_malformed_output_on_the_cluster


class DamagingRunner:
    """The real runner; while ``case`` is set, every squeue row of a job named in
    ``names`` is replaced by ``case.damage`` of that row (every other byte of the output
    is what Slurm printed). Scripts (Start, with its read-back) are not touched."""

    def __init__(self, inner: Runner, names: set[str]) -> None:
        self.inner = inner
        self.names = names
        self.case: Case | None = None
        self.damaged = 0

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        result = await self.inner.run(argv, stdin=stdin, timeout=timeout, env=env)
        case = self.case
        if case is None or not argv or os.path.basename(argv[0]) != "squeue":
            return result
        lines = []
        for printed in result.stdout.splitlines():
            fields = printed.split("|")
            if (len(fields) == len(dialects.SQUEUE_TEXT_COLUMNS) + 1
                    and fields[1] in self.names):
                lines.append(case.damage(dict(zip(dialects.SQUEUE_TEXT_COLUMNS, fields[:-1],
                                                  strict=True))))
                self.damaged += 1
            else:
                lines.append(printed)
        return dataclasses.replace(result, stdout="".join(line + "\n" for line in lines))

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        return await self.inner.run_script(script, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


def slurm_objects(names: Collection[str]) -> dict[str, list[tuple[int, str]]]:
    """Every object slurmctld holds of ``names``, of any user: name -> [(id, state)]."""
    out = subprocess.run(["squeue", "-h", "-a", "--states=all", "--name", ",".join(names),
                          "-o", "%i|%j|%T"], capture_output=True, text=True, check=True,
                         timeout=60)
    found: dict[str, list[tuple[int, str]]] = {name: [] for name in names}
    for line in out.stdout.splitlines():
        slurm_id, name, state = line.split("|")
        if name in found:
            found[name].append((int(slurm_id), state))
    return found


@pytest.mark.slurm
@pytest.mark.slow
def test_malformed_output_on_the_cluster(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Every case's damage on the real cluster: ``REAL_JOBS`` real jobs, submitted and
    running through the real adapter and reconciler, have their rows damaged in every
    squeue answer for ``DAMAGED_TICKS`` ticks per case, then are let finish.

    *lost*: a job whose status left "running" or its Slurm job, whose Slurm object
    vanished or ended while the damaged output was read, or that did not end succeeded
    with a started sacct record; *duplicates*: Slurm objects of a job beyond its one (live
    in squeue during a case, or started in sacct); *wrong writes*: any Slurm write or
    sbatch made on damaged output, a status row changed by a tick whose read failed,
    and every other write that ``fault_support.wrong_writes`` judges wrong."""
    env = slurm_up()
    cancel_user_jobs()
    gate = Path(tempfile.mkdtemp(prefix="dispatch-fault-malformed-"))
    gate.chmod(0o755)
    release = gate / "release"  # the jobs run until it exists
    url = f"sqlite:///{tmp_path}/cluster.db"
    store = Store(url)
    store.migrate()
    client = Client(url)
    ids = [client.submit({"command": ["/bin/sh", "-c",
                                      f"while [ ! -e {release} ]; do sleep 0.2; done"],
                          "workdir": "/tmp"}) for _ in range(REAL_JOBS)]
    names = {"dj-" + job_id for job_id in ids}
    sink = ListSink()
    damaging = DamagingRunner(LocalRunner(run_as=env["SUBMIT_USER"], default_timeout=60),
                              names)
    runner = RecordingRunner(damaging, sink)
    adapter = SlurmAdapter(runner, cluster=env["CLUSTER"], settings=StartSettings(
        output_dir=OUTPUT_DIR), user=env["SUBMIT_USER"], command_timeout=60)
    reconciler = Reconciler(store, adapter, metrics=Metrics(),
                            settings=TickSettings(unknown_grace_s=600))
    lost: set[str] = set()
    objects: dict[str, set[int]] = {job_id: set() for job_id in ids}
    damaged_seqs: set[int] = set()
    damaged_writes: list[str] = []
    changed = 0
    per_case: dict[str, str] = {}
    started = time.monotonic()
    done = False
    with asyncio.Runner() as loop:
        def ticked(check: Callable[[dict[str, dict[str, Any]]], bool]) -> bool:
            loop.run(reconciler.tick())
            return check(views(client, ids))

        try:
            wait_for(lambda: ticked(lambda v: all(j["phase"] == "running"
                                                  for j in v.values())),
                     timeout=90, interval=0.5, what="the real jobs to run")
            recorded = {j: v["slurm_job_id"] for j, v in views(client, ids).items()}
            for job_id, slurm_id in recorded.items():
                objects[job_id].add(slurm_id)
            for case in CASES:
                loop.run(reconciler.tick())  # undamaged: each case starts from the truth
                before = status_snapshot(url)
                first = len(sink.entries)
                damaging.case = case
                try:
                    reports = [loop.run(reconciler.tick()) for _ in range(DAMAGED_TICKS)]
                finally:
                    damaging.case = None
                after = status_snapshot(url)
                during = sink.entries[first:]
                damaged_seqs.update(e["seq"] for e in during)
                damaged_writes += [
                    f"{case.name}: " + (" ".join(e["argv"]) if e["kind"] == "run"
                                        else f"script with {e['sbatch']} sbatch")
                    for e in during if e["phase"] == "begin"
                    and (e.get("write") or e.get("sbatch"))]
                unreadable = not any(r.slurm_ok for r in reports)
                if unreadable:
                    changed += sum(1 for j in ids if after.get(j) != before.get(j))
                live = slurm_objects(names)
                for job_id, view in views(client, ids).items():
                    mine = [(i, s) for i, s in live["dj-" + job_id] if s not in ENDED]
                    objects[job_id].update(i for i, _ in mine)
                    if (view["phase"] != "running" or view["slurm_job_id"] != recorded[job_id]
                            or (recorded[job_id], "RUNNING") not in mine):
                        lost.add(job_id)
                per_case[case.name] = "read failed" if unreadable else "read"
            release.touch()
            final: dict[str, dict[str, Any]] = {}

            def finished(v: dict[str, dict[str, Any]]) -> bool:
                final.update(v)
                return all(j["phase"] in TERMINAL for j in v.values())

            wait_for(lambda: ticked(finished), timeout=90, interval=0.5,
                     what="the real jobs to finish")
            done = True
        finally:
            release.touch()
            if not done:
                cancel_user_jobs()
            loop.run(runner.close())
            store.dispose()
    records = recorded_executions(ids, final)  # (slurmdbd records a job seconds late)
    shutil.rmtree(gate, ignore_errors=True)
    outcome = tally(dict.fromkeys(ids, "succeeded"), final, records)
    for job_id in ids:
        objects[job_id].update(r.job_id for r in records[job_id] if ran(r))
    lost.update(outcome.lost)
    duplicates = sum(len(found) - 1 for found in objects.values())
    judged = [e for e in sink.entries if e["seq"] not in damaged_seqs]
    wrong, why_wrong = wrong_writes(judged, url)
    REAL.update(jobs=len(ids), lost=len(lost), duplicates=duplicates,
                wrong=len(damaged_writes) + changed + wrong, damaged_writes=len(damaged_writes),
                changed=changed, judged=sum(1 for e in judged if e["phase"] == "begin"
                                            and e.get("write")),
                damaged_rows=damaging.damaged, executions=outcome.executed,
                records=outcome.records, failed_reads=sum(1 for v in per_case.values()
                                                          if v == "read failed"),
                took=time.monotonic() - started)
    emit(f"\nfault 5 on the cluster: {len(ids)} jobs, {damaging.damaged} damaged rows read in "
         f"{len(CASES) * DAMAGED_TICKS} ticks ({REAL['failed_reads']} cases read failed), "
         f"{REAL['took']:.1f}s; lost {sorted(lost) or 'none'}; objects per job "
         f"{ {j: sorted(o) for j, o in objects.items()} }; writes on damaged output "
         f"{damaged_writes or 'none'}; other wrong writes {why_wrong or 'none'}", capsys)
    assert damaging.damaged >= len(CASES) * len(ids)
    assert lost == set() and duplicates == 0
    assert damaged_writes == [] and changed == 0 and wrong == 0, why_wrong


def test_zz_malformed_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The row of fault 5 in the summary table: lost, duplicates and wrong writes as
    measured by each canned case (its store and every command the adapter ran) and by
    the real jobs on the cluster (squeue, sacct and the reconciler's database)."""
    assert len(RESULTS) == len(CASES), "run the whole module for the figures"
    counts: dict[str, int] = {}
    for result in RESULTS.values():
        key = result.outcome.split(":", 1)[0]
        counts[key] = counts.get(key, 0) + 1
    writes = sum(r.writes + r.sbatches for r in RESULTS.values())
    changed = sum(1 for r in RESULTS.values() if r.changed)
    canned_lost = sum(1 for r in RESULTS.values() if r.lost)
    canned_dups = sum(r.duplicates for r in RESULTS.values()) + EXTRA["unknown_state_duplicates"]
    emit("\nfault 5, per case: " + "; ".join(f"{k}={v.outcome}"
                                            for k, v in sorted(RESULTS.items())), capsys)
    cluster = (f"on the cluster {REAL['jobs']} real jobs read through every damage "
               f"({REAL['damaged_rows']} damaged rows, {REAL['failed_reads']} cases read "
               f"failed): {REAL['lost']} lost, {REAL['duplicates']} extra Slurm objects, "
               f"{REAL['executions']} executions in {REAL['records']} sacct records, "
               f"{REAL['damaged_writes']} writes on damaged output, {REAL['changed']} rows "
               f"changed on unreadable output, {REAL['judged']} other writes judged"
               if REAL else "the cluster part did not run")
    record_row(FaultRow(
        fault="5 malformed Slurm output", jobs_in_flight=len(CASES) + REAL.get("jobs", 0),
        lost=canned_lost + REAL.get("lost", 0),
        duplicates=canned_dups + REAL.get("duplicates", 0),
        wrong_writes=writes + changed + REAL.get("wrong", 0), recovery_s=None,
        notes=(f"{len(CASES)} damaged squeue rows through find_many, stop/hold/release and "
               f"a real tick: {counts.get('error', 0)} clear errors (no job changed), "
               f"{counts.get('foreign', 0)} foreign, "
               f"{counts.get('unknown', 0) + counts.get('unknown-state', 0)} unknown; "
               f"{canned_lost} lost, {canned_dups} duplicates, "
               f"{writes} Slurm writes/sbatch, {changed} jobs changed on unreadable data; "
               f"{cluster}")), capsys)
