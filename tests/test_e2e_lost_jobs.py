"""Issue 9: jobs that Slurm itself loses, staged for real, with the daemon as a real process.

* **slurmctld SIGKILL after a burst of sbatch.** 20 jobs are written; the daemon submits
  them in one batched Start call; the moment that call has returned (every sbatch
  acknowledged, read back) slurmctld is SIGKILLed -- it saves its job state at most every
  5 s, so the jobs it had not saved yet are gone when it starts again, from squeue and
  (mostly) from sacct, while both answer. Their ids are handed out again. When the daemon
  split the burst and released a first part before the kill, those jobs already run on
  slurmd: a new job given the same id makes slurmctld kill it as uid 0 ("Duplicate
  jobid") and drain the node (the test resumes it, as an operator would). Such a kill
  is Slurm's own, never a user's cancel.
* **StateSaveLocation lost.** 10 jobs run or wait; slurmctld is stopped, its state
  directory wiped, and it is started again: every job is gone (slurmd's running jobs are
  killed as orphans, slurmdbd's records of them are flushed CANCELLED with no requester).
  ``FirstJobId`` is set past every id accounting has seen, so that no new job reuses an
  id with stale records; ``scripts/slurm-up`` then restores slurm.conf (slurmctld keeps
  the id sequence it saved).

Every job must end ``succeeded``; none failed, unknown or cancelled (a cancel Slurm made
is never a user's). A lost object shows cause ``lost`` in the job's history and is
resubmitted: for free when the evidence says it never started (never seen running, no
Slurm output file), under the ``lost`` budget (node-lost-like) when it may have run. A
job runs twice only in that second case: such jobs are counted and reported apart from
duplicate executions, which must be 0.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    cancel_user_jobs,
    emit,
    executions,
    fault_daemon,
    read_records,
    recorded_executions,
    restore_cluster,
    slurm_ctl,
    slurm_up,
    tally,
    wait_for,
    wait_terminal,
    write_targets,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RUN = Path("/var/lib/dispatch-slurm/run")
STATE = Path("/var/lib/dispatch-slurm/state")
SLURM_CONF = Path("/etc/slurm/slurm.conf")
GRACE_S = 5  # unknown_grace_s of the daemon: a lost job is declared within seconds
POLICY = {"backoff": {"initial_s": 1, "factor": 2, "max_s": 4}}
BAD_PHASES = {"failed", "cancelled", "rejected"}
BAD_EVENTS = {"Failed", "Unknown", "Cancelled", "Warning"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    restore_cluster()
    env = slurm_up()
    try:
        yield env
    finally:
        restore_cluster()


# ---------------------------------------------------------------- what the daemon recorded


@dataclass
class History:
    events: list[tuple[str, str]] = field(default_factory=list)
    # (submission, status, slurm id, slurm submit, cause, started_at)
    submissions: list[tuple[int, str, int | None, int | None, str | None, int | None]] = \
        field(default_factory=list)
    budgets: dict[str, int] = field(default_factory=dict)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]

    def lost(self) -> bool:
        return "Lost" in self.kinds() or any(s[4] == "lost" for s in self.submissions)

    def resubmissions(self) -> tuple[list[tuple[int, int]], list[bool]]:
        """The objects that were replaced, in order (Slurm id, submit time): every ended
        submission with an object but the last, which ran to completion; and whether each
        "Resubmitting" event, in order, spent no budget. One event per replaced object."""
        ended = [(int(s[2]), int(s[3])) for s in self.submissions
                 if s[1] == "ended" and s[2] is not None and s[3] is not None]
        return ended[:-1], ["no budget spent" in m for k, m in self.events
                            if k == "Resubmitting"]


def histories(url: str, ids: Sequence[str]) -> dict[str, History]:
    out = {i: History() for i in ids}
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            for job_id, kind, message in conn.execute(text(
                    "SELECT job_id, kind, message FROM events ORDER BY id")):
                if job_id in out:
                    out[job_id].events.append((str(kind), str(message)))
            for row in conn.execute(text(
                    "SELECT job_id, submission, status, slurm_job_id, slurm_submit, cause, "
                    "started_at FROM submissions ORDER BY job_id, submission")):
                if row[0] in out:
                    out[row[0]].submissions.append(tuple(row[1:]))
            for job_id, budgets in conn.execute(text(
                    "SELECT job_id, budgets_used FROM job_status")):
                if job_id in out:
                    out[job_id].budgets = json.loads(budgets or "{}")
    finally:
        engine.dispose()
    return out


# ---------------------------------------------------------------- judging Slurm writes


@dataclass(frozen=True)
class Acct:
    job_id: int
    name: str
    user: str
    submit: int


def _accounting_by_id(names: set[str]) -> dict[int, list[Acct]]:
    out = subprocess.run(["sacct", "-a", "-X", "-D", "-P", "-n", "-S", "now-2hours",
                          "-o", "JobIDRaw,JobName%64,User,Submit"], capture_output=True,
                         text=True, check=True, timeout=60,
                         env={**os.environ, "TZ": "UTC"}).stdout
    found: dict[int, list[Acct]] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or parts[1] not in names:
            continue
        submit = (calendar.timegm(time.strptime(parts[3], "%Y-%m-%dT%H:%M:%S"))
                  if parts[3][:1].isdigit() else 0)
        found.setdefault(int(parts[0]), []).append(Acct(int(parts[0]), parts[1], parts[2],
                                                        submit))
    return found


def judge_writes(entries: Sequence[dict[str, Any]], url: str) -> tuple[int, list[str]]:
    """Every Slurm write the daemon made, judged knowing that ids are REUSED here: the
    object a write hit is the recorded submission with that Slurm id submitted last before
    the write. Wrong: no such submission; a release/update of one the daemon judged a
    duplicate; ``scancel --name`` of another job; accounting showing that object (its id
    and submit time) as another user's or another name's."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT job_id, status, slurm_job_id, slurm_submit "
                                     "FROM submissions WHERE slurm_job_id IS NOT NULL")).all()
    finally:
        engine.dispose()
    by_id: dict[int, list[tuple[int, str, str]]] = {}
    for job_id, status, slurm_id, submit in rows:
        by_id.setdefault(int(slurm_id), []).append((int(submit or 0), str(job_id), str(status)))
    acct = _accounting_by_id({"dj-" + str(r[0]) for r in rows})
    wrong: list[str] = []
    for entry in entries:
        if entry.get("phase") != "begin" or not entry.get("write"):
            continue
        argv, at = entry["argv"], float(entry["t"])
        what = " ".join(argv)
        targets = write_targets(argv)
        if not targets:
            wrong.append(f"no recorded object: {what}")
        for target in targets:
            before = sorted(c for c in by_id.get(target, []) if c[0] <= at + 1)
            if not before:
                wrong.append(f"no recorded object {target}: {what}")
                continue
            submit, job_id, status = before[-1]
            named = [a.split("=", 1)[1] for a in argv if a.startswith("--name=")]
            if named and named != ["dj-" + job_id]:
                wrong.append(f"scancel names another job than {target}'s dj-{job_id}: "
                             f"{what}")
            elif os.path.basename(argv[0]) == "scontrol" and status == "duplicate":
                wrong.append(f"released/updated duplicate {target}: {what}")
            elif any(a.submit == submit and (a.user != "dispatch" or a.name != "dj-" + job_id)
                     for a in acct.get(target, [])):
                wrong.append(f"{target} at {submit} is not dispatch's dj-{job_id}: {what}")
    return len(wrong), wrong


# ---------------------------------------------------------------- the cluster


def slurmctld_pid() -> int:
    return int((RUN / "slurmctld.pid").read_text().split()[0])


class KillAfterBurst(threading.Thread):
    """SIGKILL slurmctld the moment the daemon's first Start call with sbatch in it has
    returned successfully (the recorded runner's ``end`` line)."""

    def __init__(self, record: Path, min_sbatch: int) -> None:
        super().__init__(daemon=True)
        self.record = record
        self.min_sbatch = min_sbatch
        self.killed_at: float | None = None
        self.sbatch = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for entry in read_records(self.record):
                if (entry.get("phase") == "end" and entry.get("kind") == "script"
                        and entry.get("rc") == 0):
                    self.sbatch += int(entry.get("sbatch", 0))
            if self.sbatch >= self.min_sbatch:
                os.kill(slurmctld_pid(), signal.SIGKILL)
                self.killed_at = time.time()
                return
            self.sbatch = 0
            self.stop.wait(0.005)


class ResumeDrained(threading.Thread):
    """The operator: when slurmctld drains the node for "Duplicate jobid" (a job it lost
    was still running there under an id it handed out again), resume it. The daemon's
    handling of the jobs is what is tested; a drained node would only stall them."""

    def __init__(self, node: str) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.resumed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            out = subprocess.run(["sinfo", "-h", "-n", self.node, "-o", "%T|%E"],
                                 capture_output=True, text=True, check=False, timeout=30)
            state, _, reason = out.stdout.strip().partition("|")
            if state.startswith("drain") and "Duplicate jobid" in reason:
                subprocess.run(["scontrol", "update", f"NodeName={self.node}",
                                "State=RESUME"], capture_output=True, check=False, timeout=30)
                self.resumed += 1


def _max_job_id_ever() -> int:
    """The largest Slurm job id accounting has ever seen on this cluster."""
    out = subprocess.run(["sacct", "-a", "-X", "-D", "-n", "-P", "-S", "2000-01-01T00:00:00",
                          "-E", "now", "-o", "JobIDRaw"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    ids = [int(w) for w in out.split() if w.isdigit()]
    squeue = subprocess.run(["squeue", "-h", "-a", "--states=all", "-o", "%i"],
                            capture_output=True, text=True, check=False, timeout=60).stdout
    ids += [int(w) for w in squeue.split() if w.isdigit()]
    return max(ids, default=0)


def _with_first_job_id(conf: str, first: int) -> str:
    lines = [ln for ln in conf.splitlines() if not re.match(r"(FirstJobId|MaxJobId)=", ln)]
    return "\n".join([*lines, f"FirstJobId={first}"]) + "\n"


# ---------------------------------------------------------------- the common verdict


def started_objects(url: str, ids: Sequence[str]) -> dict[str, list[tuple[int, int]]]:
    """Per dispatch job, its recorded objects (Slurm id, submit time) that accounting shows
    started. Matched by id AND submit time, whatever the record's name: after a state loss
    slurmdbd keeps the killed first run under the name "allocation", with no comment, so a
    count by ``dj-`` name (``executions``) misses it."""
    wanted = set(ids)
    objects: dict[tuple[int, int], str] = {}
    for job_id, hist in histories(url, ids).items():
        for _, _, slurm_id, submit, _, _ in hist.submissions:
            if slurm_id is not None and submit is not None and job_id in wanted:
                objects[(int(slurm_id), int(submit))] = job_id
    out: dict[str, list[tuple[int, int]]] = {i: [] for i in ids}
    if not objects:
        return out
    text_out = subprocess.run(
        ["sacct", "-a", "-X", "-D", "-P", "-n", "-S", "now-2hours",
         "-j", ",".join(sorted({str(k[0]) for k in objects})), "-o", "JobIDRaw,Submit,Start"],
        capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "TZ": "UTC"}).stdout
    for line in text_out.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or not parts[1][:1].isdigit() or not parts[2][:1].isdigit():
            continue  # never started (Start Unknown/None)
        key = (int(parts[0]), calendar.timegm(time.strptime(parts[1], "%Y-%m-%dT%H:%M:%S")))
        if key in objects:
            out[objects[key]].append(key)
    return out


@dataclass
class Verdict:
    lost: list[str]
    free: list[str]  # resubmitted for free: never started
    budgeted: list[str]  # resubmitted under the lost budget: may have started
    ran_twice: list[str]  # ran more than once: legitimately only in ``budgeted``
    # a job lost twice may be in both ``free`` and ``budgeted``; per resubmission, the
    # object a free one replaced never started:
    free_but_started: dict[str, list[tuple[int, int]]]
    unpaired: dict[str, Any]  # replaced objects and Resubmitting events that do not pair
    duplicates: dict[str, int]  # executions beyond those the lost budget explains
    bad: dict[str, Any]
    tally: Any
    runs: int
    wrong: tuple[int, list[str]]

    def line(self) -> str:
        return (f"{len(self.lost)} lost ({len(self.free)} resubmitted free, "
                f"{len(self.budgeted)} under the lost budget), {self.runs} executions, "
                f"{len(self.ran_twice)} jobs ran twice (may have started: legitimate), "
                f"{sum(self.duplicates.values())} duplicate executions, "
                f"{self.wrong[0]} wrong writes")


def verdict(url: str, ids: Sequence[str], final: dict[str, dict[str, Any]],
            records: Sequence[dict[str, Any]]) -> Verdict:
    done = [i for i in ids if final[i]["phase"] == "succeeded"]
    wait_for(lambda: all(any(r.start not in ("Unknown", "None", "") and r.state != "RUNNING"
                             for r in recs) for recs in executions(done).values()),
             timeout=60, what="accounting to record every execution")
    hist = histories(url, ids)
    outcome = tally(dict.fromkeys(ids, "succeeded"), final,
                    recorded_executions(ids, final))
    lost = sorted(i for i in ids if hist[i].lost())
    free = sorted(i for i in lost if any(
        k == "Resubmitting" and "no budget spent" in m for k, m in hist[i].events))
    budgeted = sorted(i for i in lost if hist[i].budgets.get("lost", 0) > 0)
    bad = {i: (final[i]["phase"], final[i]["cause"], final[i]["cause_detail"],
               [k for k in hist[i].kinds() if k in BAD_EVENTS])
           for i in ids if final[i]["phase"] in BAD_PHASES
           or BAD_EVENTS.intersection(hist[i].kinds())}
    runs = started_objects(url, ids)
    ran_twice = sorted(i for i, r in runs.items() if len(r) > 1)
    free_but_started: dict[str, list[tuple[int, int]]] = {}
    unpaired: dict[str, Any] = {}
    for i in lost:
        replaced, free_flags = hist[i].resubmissions()
        if len(replaced) != len(free_flags):
            unpaired[i] = (hist[i].submissions, hist[i].events)
        started = [obj for obj, gratis in zip(replaced, free_flags, strict=False)
                   if gratis and obj in runs[i]]
        if started:
            free_but_started[i] = started
    # one execution, plus one per resubmission spent on the lost budget (it may have run)
    duplicates = {i: len(r) - 1 - hist[i].budgets.get("lost", 0) for i, r in runs.items()
                  if len(r) - 1 > hist[i].budgets.get("lost", 0)}
    for i, n in outcome.duplicates.items():  # two started dj- records the budget misses
        if n - 1 > hist[i].budgets.get("lost", 0):
            duplicates[i] = max(duplicates.get(i, 0), n - 1 - hist[i].budgets.get("lost", 0))
    return Verdict(lost, free, budgeted, ran_twice, free_but_started, unpaired, duplicates,
                   bad, outcome,
                   sum(len(r) for r in runs.values()), judge_writes(records, url))


def check(v: Verdict, hist: dict[str, History]) -> None:
    assert v.bad == {}, v.bad
    assert v.tally.lost == [], v.tally.lost  # every job succeeded and really ran
    for job in v.lost:  # resubmitted: a later submission ran to completion
        assert len(hist[job].submissions) >= 2, (job, hist[job].submissions)
        assert "Resubmitting" in hist[job].kinds(), (job, hist[job].events)
    # running twice is legitimate only for a lost object that may have started, which
    # is resubmitted under the lost budget (like node-lost), never for free
    assert set(v.ran_twice) <= set(v.budgeted), (v.ran_twice, v.budgeted)
    assert v.unpaired == {}, v.unpaired
    assert v.free_but_started == {}, v.free_but_started
    assert v.duplicates == {}, v.duplicates
    assert v.wrong[0] == 0, v.wrong[1]


def _doc(command: str, label: str) -> dict[str, object]:
    return {"command": ["/bin/sh", "-c", command], "workdir": "/tmp",
            "labels": {"e2e": label}}


# ---------------------------------------------------------------- the tests


def test_slurmctld_killed_after_sbatch_burst(cluster: dict[str, str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    restore_cluster()  # every daemon up, the node resumed, no jobs of ours
    url = f"sqlite:///{tmp_path}/burst.db"
    Store(url).migrate()
    client = Client(url)
    ids = [client.submit(_doc("sleep 2", "burst"), policy=POLICY) for _ in range(20)]
    t0 = time.time()
    with fault_daemon(tmp_path, url, unknown_grace_s=GRACE_S) as d:
        killer = KillAfterBurst(d.record, min_sbatch=len(ids))
        killer.start()
        killer.join(timeout=60)
        killer.stop.set()
        assert killer.killed_at is not None, "the daemon never submitted the burst"
        # every job's Slurm job is recorded (acknowledged) while slurmctld is dead
        wait_for(lambda: all(v["slurm_job_id"] for v in client.list_jobs()), timeout=30,
                 what="the daemon to record every acknowledged Slurm job")
        operator = ResumeDrained(cluster["NODE"])
        operator.start()
        try:
            slurm_ctl("start", "slurmctld")
            restarted = time.time()
            final = wait_terminal(client, ids, timeout=150)
        finally:
            operator.stop.set()
        records = d.records()
    v = verdict(url, ids, final, records)
    emit(f"\nslurmctld SIGKILL {killer.killed_at - t0:.1f}s in, right after "
         f"{killer.sbatch} acknowledged sbatch: {v.line()}; converged "
         f"{time.time() - restarted:.0f}s after the restart; node resumed after a "
         f"'Duplicate jobid' drain {operator.resumed} time(s)", capsys)
    check(v, histories(url, ids))


def test_slurmctld_state_directory_lost(cluster: dict[str, str], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    restore_cluster()  # every daemon up, the node resumed, no jobs of ours
    url = f"sqlite:///{tmp_path}/stateloss.db"
    Store(url).migrate()
    client = Client(url)
    # 8 CPUs: 8 run when the state is lost, 2 wait
    ids = [client.submit(_doc("sleep 12", "state-loss"), policy=POLICY) for _ in range(10)]
    conf = SLURM_CONF.read_text()
    t0 = time.time()
    try:
        with fault_daemon(tmp_path, url, unknown_grace_s=GRACE_S) as d:
            wait_for(lambda: sum(v["phase"] == "running" for v in client.list_jobs()) >= 8
                     and all(v["slurm_job_id"] for v in client.list_jobs()),
                     timeout=60, what="8 jobs running, every job submitted")
            first = _max_job_id_ever() + 1
            slurm_ctl("stop", "slurmctld")
            for entry in STATE.iterdir():  # the state directory is lost
                if entry.is_dir():
                    subprocess.run(["rm", "-rf", "--", str(entry)], check=True)
                else:
                    entry.unlink()
            SLURM_CONF.write_text(_with_first_job_id(conf, first))
            slurm_ctl("start", "slurmctld")
            restarted = time.time()
            final = wait_terminal(client, ids, timeout=150)
            records = d.records()
    finally:
        # slurm-up's own slurm.conf again (it differs: slurmctld restarts, and keeps the
        # job id sequence it saved, past FirstJobId)
        slurm_up()
        cancel_user_jobs()
    v = verdict(url, ids, final, records)
    emit(f"\nslurmctld state directory lost {restarted - t0:.0f}s in (new ids from "
         f"{first}): {v.line()}; converged {time.time() - restarted:.0f}s after the "
         "restart", capsys)
    assert len(v.lost) == len(ids), (v.lost, final)  # every job was lost
    check(v, histories(url, ids))
    assert v.budgeted, "no running job was resubmitted under the lost budget"
