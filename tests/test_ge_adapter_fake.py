"""The Grid Engine adapter's decisions over a scripted runner (no cell): seed 003's
check -- a job listed 'r' on an unheard host is node-lost only when the host answers,
runs no execd and has no process of it, and its accounting record wins when there is
one -- and the unheard grace."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence

import pytest

from controller.gridengine.adapter import GridEngineAdapter
from controller.gridengine.verify import ANSWERED, EXECD_ALIVE
from controller.model.obs import CauseKind, Source, State
from controller.runner.base import CommandResult
from controller.slurm.script import StartSettings

JOB = "01JZ8Q2N5V0000000000000000"
NAME = "dj-" + JOB
SUBMIT = 1_796_468_000
LIST = f"""<?xml version='1.0'?>
<job_info>
  <queue_info>
    <Queue-List>
      <name>all.q@node1</name>
      <state>u</state>
      <job_list state="running">
        <JB_job_number>42</JB_job_number>
        <JB_name>{NAME}</JB_name>
        <JB_owner>dispatch</JB_owner>
        <state>r</state>
        <JAT_start_time>2026-12-05T10:00:00</JAT_start_time>
        <slots>1</slots>
      </job_list>
    </Queue-List>
  </queue_info>
  <job_info></job_info>
</job_info>
"""
DETAILS = f"""<?xml version='1.0'?>
<detailed_job_info><djob_info><element>
  <JB_job_number>42</JB_job_number><JB_job_name>{NAME}</JB_job_name>
  <JB_owner>dispatch</JB_owner><JB_submission_time>{SUBMIT}</JB_submission_time>
  <JB_account>dispatch;s=1;a=0</JB_account>
</element></djob_info></detailed_job_info>
"""
_FIELDS = ["all.q", "node1", "dispatch", "dispatch", NAME, "42", "dispatch;s=1;a=0", "0",
           str(SUBMIT), str(SUBMIT + 5), str(SUBMIT + 9), "0", "0", *["0"] * 28, "NONE",
           "0", "0", "0"]
RECORD = ":".join(_FIELDS) + "\n"  # accounting(5): 45 fields, pe_taskid NONE


class Scripted:
    """Answers each script by its first word: the list, the details, the probe, the
    accounting read."""

    def __init__(self, probe: str, record: str = "") -> None:
        self.probe = probe
        self.record = record
        self.scripts: list[str] = []

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        raise AssertionError(f"unexpected command {argv}")

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        self.scripts.append(script)
        if script.startswith("exec qstat -f"):
            out = LIST
        elif "qstat -j" in script:
            out = DETAILS
        elif script.startswith("H="):
            out = self.probe
        elif script.startswith("F="):
            data = self.record.encode()
            out = f"{len(data)} 0\n{base64.b64encode(data).decode()}\n"
        else:
            raise AssertionError(f"unexpected script {script[:60]!r}")
        return CommandResult(("sh", "-s"), 0, out, "", 0.01)

    async def close(self) -> None:
        return None


def _observe(runner: Scripted, *, grace: float = 0, reads: int = 1):  # type: ignore[no-untyped-def]
    clock = iter(range(2_000_000_000, 2_000_000_100, 30))
    adapter = GridEngineAdapter(runner, cluster="ge", settings=StartSettings(),  # type: ignore[arg-type]
                                user="dispatch", clock=lambda: float(next(clock)),
                                unheard_grace_s=grace, first_read_bytes=1 << 20)

    async def main():  # type: ignore[no-untyped-def]
        found = None
        for _ in range(reads):
            found = await adapter.find_many([JOB])
        return found[JOB][0]  # type: ignore[index]
    return asyncio.run(main())


@pytest.mark.parametrize(("probe", "record", "state", "cause", "source"), [
    pytest.param(f"{ANSWERED}\n", "", State.RUNNING, CauseKind.NODE_LOST, Source.LIVE,
                 id="host-answers-no-execd-no-process"),
    pytest.param(f"{ANSWERED}\n", RECORD, State.ENDED, CauseKind.COMPLETED,
                 Source.ACCOUNTING, id="its-record-wins"),
    pytest.param(f"{ANSWERED}\n{EXECD_ALIVE}\n", "", State.RUNNING, CauseKind.NONE,
                 Source.LIVE, id="execd-alive-reports-itself"),
    pytest.param(f"{ANSWERED}\nDISPATCH_ATTEMPT=s1-42-r0\n", "", State.RUNNING,
                 CauseKind.NONE, Source.LIVE, id="its-process-is-there"),
    pytest.param("", "", State.RUNNING, CauseKind.NONE, Source.LIVE,
                 id="host-does-not-answer"),
])
def test_listed_running_on_an_unheard_host(probe: str, record: str, state: State,
                                           cause: CauseKind, source: Source) -> None:
    obs = _observe(Scripted(probe, record))
    assert (obs.state, obs.cause.kind, obs.source) == (state, cause, source)


def test_no_probe_before_the_unheard_grace() -> None:
    runner = Scripted(f"{ANSWERED}\n")
    obs = _observe(runner, grace=45, reads=2)  # 30 s between the reads: within 45 s
    assert obs.cause.kind is CauseKind.NONE
    assert not any(s.startswith("H=") for s in runner.scripts)
    runner = Scripted(f"{ANSWERED}\n")
    obs = _observe(runner, grace=45, reads=3)  # 60 s: past it
    assert obs.cause.kind is CauseKind.NODE_LOST
