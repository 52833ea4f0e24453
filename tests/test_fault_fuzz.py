"""Fault 6: hostile input, fuzzed with hypothesis (>= 10,000 generated inputs).

* ``test_fuzz_documents``: job documents full of shell metacharacters, newlines, NUL,
  lone surrogates, huge values, wrong types, ``DISPATCH_`` names and relative paths.
  Each one is judged by the client-side validator and the Start script renderer, then
  written *straight into the jobs table with SQL* (batches of rows) and reconciled by the
  real ``Reconciler`` on a real SQLite store. Each is either rejected with a reason that
  names a field that exists (or is required) -- and the daemon marks its row rejected with
  that reason -- or accepted, and then Start receives exactly the command and environment
  the document asked for.
* ``test_fuzz_raw_rows``: rows no client library would write (spec that is not JSON, not
  an object, nested 100,000 deep, numbers of 5,000 digits; ids that are no ULID; unknown
  desired states; broken policies) inserted with SQL: the tick never crashes, every bad
  row is rejected with a reason naming its field, every good row is submitted.
* ``test_accepted_documents_run_exactly``: accepted hostile documents, rendered and run
  under the real /bin/sh with a recording fake sbatch (the helpers of
  ``tests/test_script_exec.py``): the command receives exactly the argv and environment
  asked for, and the canary file that any shell injection would create never appears.
* ``test_hostile_documents_on_the_cluster`` (slurm): ``testdata/fault/hostile_jobs.json``
  through the real daemon on the real cluster, next to broken rows inserted with SQL:
  the output files show exactly the argv and environment, the broken rows are rejected,
  the daemon keeps running.

The row of fault 6 is measured, never assumed: *lost* counts the hostile cluster jobs
that did not succeed or never started in sacct, the broken rows that did not end
rejected, and the accepted generated rows that the tick did not submit; *duplicate
executions* counts the started sacct records (all users, every record) of a hostile job
beyond its first, and the generated rows that Start received more than once in a tick;
*wrong writes* counts shell injections, the daemon's Slurm writes that
``fault_support.wrong_writes`` judges wrong, and the sacct records of broken rows (a row
rejected for its spec must never reach Slurm).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from controller.client import Client
from controller.errors import ErrInvalid, ErrUnsupported
from controller.metrics import Metrics
from controller.model.ids import JobID, new_job_id, parse_job_id
from controller.model.job import Desired
from controller.model.obs import ObjectRef, StartRequest
from controller.model.policy import parse_policy
from controller.model.spec import parse_job_document
from controller.reconcile.tick import Reconciler, TickSettings
from controller.slurm.script import StartSettings, render_start_script
from controller.store import repo
from controller.store.db import Store
from tests.daemon_harness import ran
from tests.fakeslurm import FakeSlurm
from tests.fault_support import (
    OUTPUT_DIR,
    FaultRow,
    cancel_user_jobs,
    emit,
    executions,
    fault_daemon,
    knob,
    record_row,
    slurm_up,
    tally,
    wait_for,
    wait_terminal,
    wrong_writes,
)
from tests.test_script_exec import JOB_ID, PASS, PYTHON_ENV, SLURM_JOB_ID, Host, _b, _decode_env

ROOT = Path(__file__).resolve().parent.parent
CANARY_DIR = Path(tempfile.gettempdir()) / "dispatch-fault-canary"
CANARY = CANARY_DIR / "pwned"
SETTINGS = StartSettings(output_dir="/tmp/dispatch-fault-output")
NOW = 1_800_000_000
DOCUMENTS = knob("FUZZ_DOCUMENTS", 7000)
ROWS = knob("FUZZ_ROWS", 3000)
EXECUTED = knob("FUZZ_EXECUTED", 150)
BATCH = 500

FIGURES: dict[str, int] = {"documents": 0, "rows": 0, "document_rows": 0, "accepted": 0,
                           "rejected": 0,
                           "refused_at_start": 0, "executed": 0, "injections": 0,
                           "crashes": 0, "ticks": 0, "cluster_jobs": 0, "cluster_rows": 0,
                           "raw_seq": 0, "row_lost": 0, "row_duplicates": 0,
                           "cluster_measured": 0, "cluster_lost": 0, "cluster_duplicates": 0,
                           "cluster_executions": 0, "cluster_records": 0,
                           "cluster_extra_records": 0, "cluster_wrong_writes": 0,
                           "cluster_writes": 0, "broken_records": 0}
FIELDS_SEEN: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def canary() -> None:
    shutil.rmtree(CANARY_DIR, ignore_errors=True)
    CANARY_DIR.mkdir(mode=0o777)
    CANARY_DIR.chmod(0o777)  # the cluster's user could create it too


# ---------------------------------------------------------------- strategies

INJECTIONS = [f"$(touch {CANARY})", f"`touch {CANARY}`", f";touch {CANARY};",
              f"';touch {CANARY};'", f'";touch {CANARY};"', f"\nDISPATCH_EOF\ntouch {CANARY}\n",
              f"${{X:=$(touch {CANARY})}}", f"|touch {CANARY}", f"&&touch {CANARY}",
              f"\ntouch {CANARY}\n", f"'\n touch {CANARY}\n'", f"$'\\x27';touch {CANARY}"]
TRICKY = ["$", "`", "'", '"', "\\", "\n", "\r", "\r\n", "\t", " ", "!", "#", "&", ";", "|",
          "*", "?", "[", "]", "{", "}", "(", ")", "<", ">", "~", "%", "%j", "=", "-", "--",
          "-rf", "$(id)", "${HOME}", "$1", "$@", "\nDISPATCH_EOF\n", "DISPATCH_EOF",
          "\nDISPATCH_EOF_1", "\nDé", "é", "世", "\U0001f600", "\u2028", "\ufeff", "\x7f",
          "\x1b[31m", "..", "/", "EOF"]
POISON = ["\x00", "\ud800", "\udfff", "a\x00b"]  # never a valid value anywhere

clean_piece = st.one_of(st.sampled_from(TRICKY + INJECTIONS),
                        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
clean_text = st.lists(clean_piece, max_size=8).map("".join)
huge_text = st.sampled_from(["x" * 65_537, "y" * 4_097, "é" * 40_000, "$" * 30_000])
poison_text = st.tuples(clean_text, st.sampled_from(POISON), clean_text).map("".join)
any_text = st.one_of(clean_text, clean_text, clean_text, poison_text, huge_text)
wrong = st.one_of(st.none(), st.booleans(), st.integers(-3, 3),
                  st.integers(2**31, 2**80), st.floats(allow_nan=True, allow_infinity=True),
                  st.just(1e308), st.just(2.5), st.lists(st.integers(), max_size=2),
                  st.just({}), st.just({"x": 1}), st.text(max_size=3))
good_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
odd_name = st.sampled_from(["DISPATCH_X", "DISPATCH_JOB_ID", "DISPATCH_", "dispatch_x",
                            "1ABC", "A B", "A=B", "", "A\nB", "A\x00", "É", "A-B", "A.B",
                            "PATH", "IFS", "PS4", "ENV", "HOME", "PWD", "SLURM_JOB_ID",
                            "SLURM_EXPORT_ENV", "BASH_ENV", "CDPATH", "OPTIND", "x" * 300])
env_name = st.one_of(good_name, good_name, odd_name)
path_text = st.one_of(
    st.just("/tmp"), clean_text.map(lambda s: "/tmp/" + s), any_text.map(lambda s: "/" + s),
    st.sampled_from(["tmp", "./x", "../x", "~/x", "", "relative/path", "/", "//", "-/x",
                     "/tmp/\n", "/tmp\x00x", "$HOME/x", "~"]), wrong)
count = st.one_of(st.integers(1, 64), st.integers(-2, 0), st.integers(2**31 - 2, 2**31 + 2),
                  st.floats(min_value=1, max_value=8).map(math.floor).map(float), wrong)
RESOURCE_KEYS = ["nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node", "memory_mb",
                 "time_limit_s"]
resources = st.one_of(
    st.fixed_dictionaries({}, optional=dict.fromkeys(RESOURCE_KEYS, count)),
    st.dictionaries(st.sampled_from([*RESOURCE_KEYS, "bogus", "Nodes"]), count, max_size=3),
    wrong)
placement_keys = ["partition", "account", "qos", "reservation", "constraint", "nodelist",
                  "exclude", "exclusive", "bogus"]
extensions = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"slurm": st.fixed_dictionaries({}, optional={
        "Placement": st.dictionaries(st.sampled_from(placement_keys),
                                     st.one_of(any_text, st.booleans(), wrong), max_size=3),
        "Resources": st.dictionaries(st.sampled_from(
            ["gres", "licenses", "mem_per_cpu_mb", "mem_per_gpu_mb", "tmp_mb", "time_min_s",
             "bogus"]), st.one_of(count, any_text), max_size=3),
        "Unknown": st.just({})})}),
    st.fixed_dictionaries({"dispatch": st.fixed_dictionaries({}, optional={
        "Output": st.fixed_dictionaries({}, optional={"stdout": path_text,
                                                      "stderr": path_text}),
        "SharedCheckpoint": st.fixed_dictionaries({}, optional={"path": path_text}),
        "Image": st.just({"ref": "x"})})}),
    st.dictionaries(st.sampled_from(["kubernetes", "Slurm", ""]), st.just({}), max_size=1),
    wrong)
labels = st.one_of(st.dictionaries(st.one_of(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
                                             any_text),
                                   st.one_of(st.from_regex(r"[a-z0-9]{0,8}", fullmatch=True),
                                             any_text, wrong), max_size=3), wrong)
command = st.one_of(
    st.lists(clean_text, min_size=1, max_size=6),
    st.lists(clean_text, min_size=1, max_size=6),
    st.lists(st.one_of(clean_text, any_text, wrong), min_size=1, max_size=5),
    st.just([]), st.just([""]), st.just(["x"] * 4097), st.just(["x" * 30_000] * 4), wrong)
env = st.one_of(st.dictionaries(env_name, any_text, max_size=5),
                st.dictionaries(good_name, clean_text, max_size=5),
                st.dictionaries(good_name, st.one_of(clean_text, wrong), max_size=3), wrong)
hostile_valid = st.fixed_dictionaries(
    {"command": st.lists(clean_text, min_size=1, max_size=6),
     "workdir": st.one_of(st.just("/tmp"), clean_text.map(lambda s: "/tmp/" + s))},
    optional={"env": st.dictionaries(st.one_of(good_name, good_name, odd_name), clean_text,
                                     max_size=5),
              "name": clean_text, "requeue": st.booleans(),
              "labels": st.dictionaries(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
                                        st.from_regex(r"[a-z0-9]{0,8}", fullmatch=True),
                                        max_size=2),
              "resources": st.fixed_dictionaries({}, optional=dict.fromkeys(
                  RESOURCE_KEYS, st.integers(1, 64))),
              "stop_grace_s": st.integers(1, 70_000)})
documents = st.one_of(
    hostile_valid, hostile_valid, hostile_valid,
    st.fixed_dictionaries(
        {"command": command, "workdir": path_text},
        optional={"env": env, "resources": resources, "extensions": extensions,
                  "labels": labels, "name": any_text, "requeue": st.one_of(st.booleans(), wrong),
                  "stop_grace_s": st.one_of(st.integers(1, 70_000), count),
                  "Command": clean_text, "argv": st.just(["sh"]), "shell": st.just(True)}),
    st.fixed_dictionaries({"command": command, "workdir": path_text},
                          optional={"env": env}),
    st.fixed_dictionaries({}, optional={"command": command, "workdir": path_text}),
    wrong)


# ---------------------------------------------------------------- the oracle


def _resolves(node: Any, rest: str) -> bool:
    """Does the dotted/indexed path ``rest`` name something inside ``node``?"""
    if rest == "":
        return True
    if isinstance(node, list) and rest.startswith("["):
        close = rest.find("]")
        if close < 0 or not rest[1:close].isdigit() or int(rest[1:close]) >= len(node):
            return False
        after = rest[close + 1:]
        return _resolves(node[int(rest[1:close])], after[1:] if after.startswith(".")
                         else after)
    if isinstance(node, Mapping):
        for key in node:
            if not isinstance(key, str) or not rest.startswith(key):
                continue
            after = rest[len(key):]
            if after == "":
                return True
            if after.startswith(".") and _resolves(node[key], after[1:]):
                return True
            if after.startswith("[") and _resolves(node[key], after):
                return True
    return False


def field_is_real(doc: Any, field: str | None, message: str) -> bool:
    """A rejection names a real field: one inside the document, or a required one that
    is missing from an object that is there, or the document/row itself."""
    if not field:
        return False
    if field in ("job", "spec", "id", "desired", "policy"):
        return True
    if _resolves(doc, field):
        return True
    if "is required" in message:
        parent, _, _ = field.rpartition(".")
        return parent == "" or _resolves(doc, parent)
    return False


@dataclass(frozen=True)
class Verdict:
    kind: str  # accepted | rejected | refused (at Start, by the renderer)
    field: str = ""
    reason: str = ""


def judge(doc: Any) -> Verdict:
    """What the product must do with ``doc``; fails the test on a crash or a reason
    that names no real field."""
    try:
        spec = parse_job_document(doc)
    except (ErrInvalid, ErrUnsupported) as exc:
        assert field_is_real(doc, exc.field, exc.reason), (exc.field, str(exc)[:200], doc)
        return Verdict("rejected", exc.field or "", str(exc))
    assert list(spec.command) == doc["command"]
    assert dict(spec.env) == doc.get("env", {})
    assert spec.workdir == doc["workdir"]
    request = StartRequest(job_id=JobID(JOB_ID), generation=1, submission=1, attempt=0,
                           spec=spec, gate=True)
    try:
        render_start_script(request, SETTINGS)
    except ErrInvalid as exc:
        assert field_is_real(doc, exc.field, exc.reason), (exc.field, str(exc)[:200])
        return Verdict("refused", exc.field or "", str(exc))
    return Verdict("accepted")


def count_verdict(v: Verdict) -> None:
    FIGURES[v.kind if v.kind != "refused" else "refused_at_start"] += 1
    if v.field:
        key = v.field.split(".")[0].split("[")[0]
        FIELDS_SEEN[key] = FIELDS_SEEN.get(key, 0) + 1


# ---------------------------------------------------------------- rows through the tick


class RenderingSlurm(FakeSlurm):
    """The stateful fake Slurm, but Start renders the real Start script first (as the
    real adapter does), and every request is kept."""

    def __init__(self, clock: list[int]) -> None:
        super().__init__(clock)
        self.requests: dict[str, StartRequest] = {}
        self.starts: dict[str, int] = {}  # Start calls per dispatch job

    async def start(self, request: StartRequest) -> ObjectRef:
        render_start_script(request, SETTINGS)
        self.requests[request.job_id] = request
        self.starts[request.job_id] = self.starts.get(request.job_id, 0) + 1
        return await super().start(request)


@dataclass
class Row:
    id: str
    spec: str
    desired: str = "run"
    policy: str | None = None
    generation: int = 1
    expect: Verdict | None = None
    doc: Any = None


def _expected_row(row: Row) -> Verdict:
    """The verdict for a raw row, from the public validators (an oracle)."""
    try:
        parse_job_id(row.id, field="id")
    except ErrInvalid as exc:
        return Verdict("rejected", "id", str(exc))
    try:
        doc = json.loads(row.spec)
    except (ValueError, RecursionError) as exc:
        return Verdict("rejected", "spec", str(exc))
    verdict = judge(doc)
    if verdict.kind == "rejected":
        return verdict
    try:
        parse_policy(row.policy)
    except ErrInvalid as exc:
        return Verdict("rejected", exc.field or "policy", str(exc))
    except (ValueError, RecursionError) as exc:
        return Verdict("rejected", "policy", str(exc))
    try:
        Desired(row.desired)
    except ValueError:
        return Verdict("rejected", "desired", "")
    return verdict


class Batches:
    """Rows written straight into the jobs table with SQL, reconciled in batches."""

    def __init__(self, tmp: Path) -> None:
        self.store = Store(f"sqlite:///{tmp}/fuzz.db")
        self.store.migrate()
        self.rows: list[Row] = []
        self.problems: list[str] = []

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        with self.store.engine.begin() as conn:
            for table in ("events", "submissions", "job_status", "jobs"):
                conn.execute(text(f"DELETE FROM {table}"))
            for row in rows:
                conn.execute(text(
                    "INSERT INTO jobs (id, spec, labels, desired, policy, generation, "
                    "created_at, updated_at) VALUES (:id, :spec, '{}', :desired, :policy, "
                    ":generation, 0, 0)"), {"id": row.id, "spec": row.spec,
                                            "desired": row.desired, "policy": row.policy,
                                            "generation": row.generation})
        clock = [NOW]
        fake = RenderingSlurm(clock)
        reconciler = Reconciler(self.store, fake, metrics=Metrics(), clock=lambda: clock[0],
                                settings=TickSettings())
        try:
            report = asyncio.run(reconciler.tick())
            FIGURES["ticks"] += 1
            if report.replan_soon:  # a refused Start is decided by the next plan
                errors = report.errors
                report = asyncio.run(reconciler.tick())
                report.errors[:0] = errors
                FIGURES["ticks"] += 1
        except Exception as exc:
            FIGURES["crashes"] += 1
            self.problems.append(f"the tick crashed on a batch of rows: {exc!r:.300}")
            return
        with self.store.transaction() as tx:
            final = {v.id: v for v in repo.list_jobs(tx)}
        self.problems += [f"tick error: {e[:300]}" for e in report.errors
                          if ": submit: " not in e]
        for row in rows:
            problem = self._check(row, final[row.id], fake)
            if problem:
                self.problems.append(problem)
            # the row's figures, from the store and the Starts the tick made: an accepted
            # row that was not submitted is lost; a second Start of one job a duplicate
            if (row.expect is not None and row.expect.kind == "accepted"
                    and row.desired != "stopped" and (
                        row.id not in fake.requests
                        or final[row.id].phase not in ("pending", "held"))):
                FIGURES["row_lost"] += 1
            FIGURES["row_duplicates"] += max(0, fake.starts.get(row.id, 0) - 1)

    @staticmethod
    def _check(row: Row, view: repo.JobView, fake: RenderingSlurm) -> str:
        expect = row.expect
        assert expect is not None
        where = f"{row.id} {row.spec[:200]!r} -> {view.phase} {view.cause_detail[:200]!r}"
        if expect.kind == "rejected":
            if view.phase != "rejected" or row.id in fake.requests:
                return f"not rejected: {where}"
            if not view.cause_detail.startswith(repo.storable_text(expect.field) + ": "):
                return f"rejected without naming {expect.field!r}: {where}"
        elif row.desired == "stopped":
            if view.phase != "cancelled" or row.id in fake.requests:
                return f"stopped row not cancelled: {where}"
        elif expect.kind == "refused":
            if (view.phase, view.cause) != ("failed", "unrunnable") or \
                    expect.field not in view.cause_detail:
                return f"not refused at Start naming {expect.field!r}: {where}"
        else:
            request = fake.requests.get(row.id)
            doc = json.loads(row.spec)
            if request is None or view.phase not in ("pending", "held"):
                return f"not submitted: {where}"
            if (list(request.spec.command), dict(request.spec.env), request.spec.workdir) != (
                    doc["command"], doc.get("env", {}), doc["workdir"]):
                return f"Start got another command/env/workdir: {where}"
        return ""


# ---------------------------------------------------------------- 1. documents


@pytest.mark.slow
def test_fuzz_documents(tmp_path: Path) -> None:
    batches = Batches(tmp_path)

    @settings(max_examples=DOCUMENTS, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(doc=documents)
    def one(doc: Any) -> None:
        verdict = judge(doc)
        count_verdict(verdict)
        FIGURES["documents"] += 1
        try:
            spec_text = json.dumps(doc)
        except (TypeError, ValueError):
            return  # not even JSON: no client could store it
        stored = json.loads(spec_text)
        row = Row(id=new_job_id(), spec=spec_text, doc=stored)
        row.expect = judge(stored)
        FIGURES["document_rows"] += 1
        batches.add(row)

    one()
    batches.flush()
    batches.store.dispose()
    assert batches.problems == [], batches.problems[:5]


# ---------------------------------------------------------------- 2. raw rows

DEEP = "[" * 100_000
BAD_SPECS = ["", "not json", "null", "[]", '"a string"', "42", "true", DEEP,
             '{"command": ["x"], "workdir": "/tmp", "stop_grace_s": ' + "1" * 5000 + "}",
             '{"command": ["x"], "workdir": "/tmp"} trailing', '{"command": ["x"]',
             '{"command": ["x"], "workdir": "/tmp", "env": {"A": "\\ud800"}}',
             '{"command": ["x"], "workdir": "/tmp", "resources": {"nodes": 1e999}}',
             '{"command": "rm -rf /", "workdir": "/tmp"}',
             '{"command": ["x"], "workdir": "tmp"}', '{"command": ["x"], "workdir": "/tmp",'
             ' "env": {"DISPATCH_JOB_ID": "x"}}', "\x00", "{" * 50_000]
BAD_POLICIES = [None, None, None, "", "garbage", "[]", '{"causes": 5}',
                '{"causes": {"timeout": {"budget": -1}}}', '{"backoff": {"initial_s": "x"}}',
                '{"unknown_grace_s": 1e999}', "[" * 100_000,
                '{"retry_exit_codes": [' + "9" * 5000 + "]}",
                '{"causes": {"cancelled": {"action": "resubmit"}}}', '{"bogus": 1}',
                '{"causes": {"unknown": {"action": "resubmit"}}}', "null"]
row_ids = st.one_of(st.just("new"), st.just("new"), st.just("new"),
                    st.sampled_from(["", "x", "01jz8q2n5v0000000000000000",
                                     "dj-01JZ8Q2N5V0000000000000", "81JZ8Q2N5V00000000000000",
                                     "01JZ8Q2N5V00000000000000I", "01JZ8Q2N5V0000000000000 ",
                                     "01JZ8Q2N5V000000000000'", "01JZ8Q2N5V000000000000\n"]))
specs = st.one_of(st.sampled_from(BAD_SPECS),
                  documents.map(lambda d: json.dumps(d, default=str)),
                  st.fixed_dictionaries({"command": st.lists(clean_text, min_size=1,
                                                             max_size=3),
                                         "workdir": st.just("/tmp")}).map(json.dumps))
desired = st.one_of(st.sampled_from(["run", "run", "run", "held", "stopped"]),
                    st.sampled_from(["RUN", "", "bogus", "running", " run", "run\n"]))
policies = st.one_of(st.sampled_from(BAD_POLICIES),
                     st.dictionaries(st.sampled_from(["causes", "backoff", "retry_exit_codes",
                                                      "unknown_grace_s", "on_exhausted"]),
                                     wrong, max_size=2).map(json.dumps))


@pytest.mark.slow
def test_fuzz_raw_rows(tmp_path: Path) -> None:
    batches = Batches(tmp_path)

    @settings(max_examples=ROWS, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(id_kind=row_ids, spec=specs, desired_=desired, policy=policies,
           generation=st.integers(-(2**31), 2**31 - 1))
    def one(id_kind: str, spec: str, desired_: str, policy: str | None,
            generation: int) -> None:
        FIGURES["raw_seq"] += 1
        bad_id = f"{id_kind}{FIGURES['raw_seq']}"  # unique, and still no ULID
        row = Row(id=new_job_id() if id_kind == "new" else bad_id, spec=spec,
                  desired=desired_, policy=policy, generation=generation)
        if any(r.id == row.id for r in batches.rows):
            batches.flush()  # one row per primary key and batch
        try:
            row.doc = json.loads(spec)
        except (ValueError, RecursionError):
            row.doc = None
        row.expect = _expected_row(row)
        count_verdict(row.expect)
        FIGURES["rows"] += 1
        batches.add(row)

    one()
    batches.flush()
    batches.store.dispose()
    assert batches.problems == [], batches.problems[:5]


# ---------------------------------------------------------------- 3. exact execution

SKIP_ENV_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_")
# valid names a shell or Slurm treats specially: the job must still see exactly these values
SPECIAL_NAMES = ["PATH", "IFS", "PS4", "ENV", "HOME", "PWD", "SLURM_JOB_ID", "SLURM_EXPORT_ENV",
                 "BASH_ENV", "CDPATH", "OPTIND", "SHELL", "dispatch_x", "x" * 300]
accepted_documents = st.fixed_dictionaries(
    {"command": st.lists(clean_text, max_size=6),
     "env": st.dictionaries(st.one_of(good_name, good_name, st.sampled_from(SPECIAL_NAMES)),
                            clean_text, max_size=5)},
    optional={"labels": st.dictionaries(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
                                        st.from_regex(r"[a-z0-9]{0,8}", fullmatch=True),
                                        max_size=2),
              "resources": st.fixed_dictionaries({}, optional=dict.fromkeys(
                  RESOURCE_KEYS, st.integers(1, 64))),
              "stop_grace_s": st.integers(1, 65_535)})


@settings(max_examples=EXECUTED, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(doc=accepted_documents, host_value=clean_text)
def test_accepted_documents_run_exactly(doc: dict[str, Any], host_value: str) -> None:
    env = doc["env"]
    if any(name.startswith(SKIP_ENV_PREFIXES) for name in env):
        return  # they would change the Python helper that reports argv and env
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(Path(tmp))
        run_doc = {**doc, "command": [sys.executable, "-S", str(host.helper), *doc["command"]],
                   "workdir": str(host.workdir), "env": {**env, **PYTHON_ENV}}
        verdict = judge(run_doc)
        if verdict.kind != "accepted":
            assert verdict.field, verdict
            return
        spec = parse_job_document(run_doc)
        request = StartRequest(job_id=JobID(JOB_ID), generation=1, submission=1, attempt=0,
                               spec=spec)
        script = render_start_script(request, StartSettings(
            output_dir=str(host.root / "out"), pass_names=PASS))
        host_env = {"PATH": f"{host.bin}:{os.environ['PATH']}", "HOME": str(host.home),
                    "HOSTVAR_A": host_value, "HOSTVAR_EMPTY": ""}
        started = host.start(script, host_env)
        assert started.returncode == 0, started.stderr.decode(errors="replace")
        argv = host.recorded_argv()
        args = argv[argv.index("/dev/stdin") + 1:]
        ran = host.run_batch(args, None)
        assert ran.returncode == 0, ran.stderr.decode(errors="replace")
        out_file = host.root / "out" / JOB_ID / f"s1-{SLURM_JOB_ID}-r0.out"
        report = json.loads(out_file.read_text())
        got_argv = [bytes.fromhex(a) for a in report["argv"]]
        got_env = _decode_env(report["env"])
        FIGURES["executed"] += 1
        if CANARY.exists():
            FIGURES["injections"] += 1
        assert got_argv == [a.encode() for a in doc["command"]]
        expected_env = {**_b({**env, **PYTHON_ENV})}
        for name, value in expected_env.items():
            assert got_env.get(name) == value, name
        assert not CANARY.exists(), "a value ran as shell code"


# ---------------------------------------------------------------- 4. the real cluster

HELPER = """import json, os, sys
json.dump({"argv": [os.fsencode(a).hex() for a in sys.argv[1:]],
           "env": {k.hex(): v.hex() for k, v in os.environb.items()}}, sys.stdout)
"""


def _broken_rows() -> list[tuple[str, str]]:
    return [("spec nested 100,000 deep", DEEP),
            ("a number of 5,000 digits", '{"command": ["true"], "workdir": "/tmp", '
             '"stop_grace_s": ' + "7" * 5000 + "}"),
            ("a lone surrogate", '{"command": ["echo", "\\ud800"], "workdir": "/tmp"}'),
            ("not JSON", "{command: true}"),
            ("a DISPATCH_ name", '{"command": ["true"], "workdir": "/tmp", '
             '"env": {"DISPATCH_EPOCH": "1"}}'),
            ("a relative workdir", '{"command": ["true"], "workdir": "tmp"}')]


@pytest.mark.slurm
@pytest.mark.slow
def test_hostile_documents_on_the_cluster(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    slurm_up()
    cancel_user_jobs()
    helper = Path("/tmp/dispatch-fault-helper.py")
    helper.write_text(HELPER)
    helper.chmod(0o644)
    hostile = json.loads((ROOT / "testdata" / "fault" / "hostile_jobs.json").read_text())
    url = f"sqlite:///{tmp_path}/hostile.db"
    Store(url).migrate()
    client = Client(url)
    ids: dict[str, dict[str, Any]] = {}
    for raw in hostile["jobs"]:
        doc = json.loads(json.dumps(raw).replace("@CANARY@", str(CANARY)))
        os.makedirs(doc["workdir"], exist_ok=True)
        os.chmod(doc["workdir"], 0o777)
        run_doc = {**doc, "command": ["/usr/bin/python3", "-S", str(helper), *doc["command"]]}
        assert judge(run_doc).kind == "accepted", doc
        ids[client.submit(run_doc)] = doc
    broken: dict[str, str] = {}
    store = Store(url)
    with store.engine.begin() as conn:
        for what, spec in _broken_rows():
            job_id = new_job_id()
            conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                         {"id": job_id, "spec": spec})
            broken[job_id] = what
    store.dispose()
    started = time.monotonic()
    with fault_daemon(tmp_path, url) as d:
        final = wait_terminal(client, [*ids, *broken], timeout=120)
        alive = d.alive()
        log = d.log_text()
        entries = d.records()
    took = time.monotonic() - started
    # slurmdbd records a job seconds after it ended: wait until sacct shows a started
    # record of every job the daemon submitted, then count every record of every name
    submitted = [j for j in ids if final[j]["slurm_job_id"] is not None]
    wait_for(lambda: all(any(ran(r) for r in recs)
                         for recs in executions(submitted).values()),
             timeout=90, interval=1, what="accounting to record every execution")
    records = executions([*ids, *broken])
    outcome = tally(dict.fromkeys(ids, "succeeded"), final, records)
    broken_lost = [j for j in broken if final[j]["phase"] != "rejected"]
    broken_records = sum(len(records[j]) for j in broken)
    wrong, why_wrong = wrong_writes(entries, url)
    FIGURES.update(cluster_measured=1, cluster_lost=len(outcome.lost) + len(broken_lost),
                   cluster_duplicates=outcome.duplicate_executions,
                   cluster_executions=outcome.executed, cluster_records=outcome.records,
                   cluster_extra_records=outcome.extra_records + outcome.other_users,
                   cluster_wrong_writes=wrong + broken_records,
                   cluster_writes=sum(1 for e in entries
                                      if e.get("phase") == "begin" and e.get("write")),
                   broken_records=broken_records)
    bad: list[str] = []
    for job_id, doc in ids.items():
        view = final[job_id]
        if view["phase"] != "succeeded":
            bad.append(f"{job_id} {view['phase']} {view['cause_detail'][:200]}")
            continue
        out = Path(OUTPUT_DIR) / job_id / f"s1-{view['slurm_job_id']}-r0.out"
        report = json.loads(out.read_text())
        got_argv = [bytes.fromhex(a).decode() for a in report["argv"]]
        got_env = {bytes.fromhex(k).decode(): bytes.fromhex(v).decode()
                   for k, v in report["env"].items()}
        if got_argv != doc["command"]:
            bad.append(f"{job_id} argv {got_argv!r:.200} != {doc['command']!r:.200}")
        for name, value in doc.get("env", {}).items():
            if got_env.get(name) != value:
                bad.append(f"{job_id} env {name}={got_env.get(name)!r:.80} != {value!r:.80}")
        if job_id in outcome.lost or job_id in outcome.duplicates:
            bad.append(f"{job_id} ran {sum(1 for r in records[job_id] if ran(r))} times "
                       f"({len(records[job_id])} sacct records)")
    for job_id, what in broken.items():
        view = final[job_id]
        if view["phase"] != "rejected" or not view["cause_detail"]:
            bad.append(f"broken row ({what}) ended {view['phase']}: {view['cause_detail']}")
    FIGURES["cluster_jobs"] = len(ids)
    FIGURES["cluster_rows"] = len(broken)
    if CANARY.exists():
        FIGURES["injections"] += 1
    bad += [f"broken row ({broken[j]}) has {len(records[j])} sacct records" for j in broken
            if records[j]]
    bad += [f"wrong write: {w}" for w in why_wrong]
    emit(f"\nfault 6 on the cluster: {len(ids)} hostile documents, {len(broken)} broken rows, "
         f"{took:.1f}s; daemon alive={alive}, 'tick crashed' in log: "
         f"{log.count('tick crashed')}; sacct: {outcome.executed} executions in "
         f"{outcome.records} records; problems: {bad or 'none'}", capsys)
    assert alive and "tick crashed" not in log
    assert bad == []
    assert not CANARY.exists()


def test_zz_fuzz_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The row of fault 6 in the summary table: lost, duplicate executions and wrong
    writes as measured above (sacct and the daemon's database for the cluster jobs, the
    store and the Starts of the tick for the generated rows)."""
    generated = FIGURES["documents"] + FIGURES["rows"]
    cluster = (f"{FIGURES['cluster_jobs']} hostile jobs + {FIGURES['cluster_rows']} broken "
               f"rows on the cluster: {FIGURES['cluster_executions']} executions in "
               f"{FIGURES['cluster_records']} sacct records "
               f"({FIGURES['cluster_extra_records']} extra), {FIGURES['cluster_lost']} lost, "
               f"{FIGURES['broken_records']} sacct records of broken rows, "
               f"{FIGURES['cluster_writes']} Slurm writes judged"
               if FIGURES["cluster_measured"] else "the cluster part did not run")
    emit(f"\nfault 6 figures: {FIGURES}\nfault 6 rejection fields (top level): "
         f"{dict(sorted(FIELDS_SEEN.items(), key=lambda kv: -kv[1]))}", capsys)
    record_row(FaultRow(
        fault="6 hostile input (hypothesis)",
        jobs_in_flight=FIGURES["cluster_jobs"] + FIGURES["cluster_rows"],
        lost=FIGURES["cluster_lost"] + FIGURES["row_lost"],
        duplicates=FIGURES["cluster_duplicates"] + FIGURES["row_duplicates"],
        wrong_writes=FIGURES["injections"] + FIGURES["cluster_wrong_writes"], recovery_s=None,
        notes=(f"{FIGURES['documents']} documents (of them {FIGURES['document_rows']} also "
               f"as SQL rows) + {FIGURES['rows']} raw SQL rows generated "
               f"({FIGURES['ticks']} ticks): {FIGURES['accepted']} accepted, "
               f"{FIGURES['rejected']} rejected naming the field, "
               f"{FIGURES['refused_at_start']} refused at Start naming the field; "
               f"{FIGURES['row_lost']} accepted rows not submitted, "
               f"{FIGURES['row_duplicates']} second Starts; "
               f"{FIGURES['executed']} run under /bin/sh with exact argv+env; {cluster}; "
               f"shell injections {FIGURES['injections']}, "
               f"daemon/tick crashes {FIGURES['crashes']}")), capsys)
    if FIGURES["documents"] or FIGURES["rows"]:
        assert generated >= min(10_000, DOCUMENTS + ROWS)
    assert FIGURES["injections"] == 0 and FIGURES["crashes"] == 0

