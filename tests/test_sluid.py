"""SLUID (Slurm's unique job id, never reused), pure parts: the text columns that carry
it, the identity a cluster supports, the writes that name a job by it, and the identity
check's belt. The real clusters prove the rest (tests/test_adapter_identity.py,
test_adapter_start.py::test_preflight, per version)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from controller.errors import ErrInvalid, ProtocolError
from controller.model.obs import ObjectRef
from controller.runner.base import CommandResult
from controller.slurm.adapter import (
    IDENTITY_CLASSIC,
    IDENTITY_SLUID,
    IDENTITY_SLUID_ACCOUNTING,
    Capabilities,
    SlurmAdapter,
    _squeue_format,
    identity_for,
)
from controller.slurm.dialects import (
    SACCT_TEXT_COLUMNS_SLUID,
    SQUEUE_TEXT_COLUMNS,
    SQUEUE_TEXT_COLUMNS_SLUID,
    SQUEUE_TEXT_FORMAT,
    SQUEUE_TEXT_FORMAT_SLUID,
    parse_sacct_text,
    parse_squeue_text,
)
from controller.slurm.script import StartSettings

SLUID = "sE0HM8R59HN500"  # as 26.05.5 printed it
SQ = ("7|dj-x|svc|R|RUNNING|None|2026-11-30T12:00:00|2026-11-30T12:00:00|"
      "2026-11-30T12:00:01|NONE|N/A|UNLIMITED|1|0|0|vm|lab|{sluid}|dispatch:s=1;a=0|")
SA = ("7|dj-x|svc|1001|COMPLETED|None|2026-11-30T12:00:00|2026-11-30T12:00:00|"
      "2026-11-30T12:00:01|2026-11-30T12:00:02|0:0|vm|00:10:00|lab|{sluid}|dispatch:s=1;a=0")


def test_the_sluid_columns_keep_comment_last_and_are_asked_only_by_choice() -> None:
    assert SQUEUE_TEXT_COLUMNS_SLUID[-2:] == ("SLUID", "Comment")
    assert SACCT_TEXT_COLUMNS_SLUID[-2:] == ("SLUID", "Comment")
    assert "SLUID" not in SQUEUE_TEXT_FORMAT and "SLUID" not in SQUEUE_TEXT_COLUMNS
    assert "SLUID:|" in SQUEUE_TEXT_FORMAT_SLUID
    assert _squeue_format(SQUEUE_TEXT_COLUMNS) == SQUEUE_TEXT_FORMAT
    assert _squeue_format(SQUEUE_TEXT_COLUMNS_SLUID) == SQUEUE_TEXT_FORMAT_SLUID


@pytest.mark.parametrize(("field", "expected"), [(SLUID, SLUID), ("", None), ("N/A", None)])
def test_sluid_is_read_from_squeue_and_sacct(field: str, expected: str | None) -> None:
    [live] = parse_squeue_text(SQ.format(sluid=field) + "\n", columns=SQUEUE_TEXT_COLUMNS_SLUID)
    [acct] = parse_sacct_text(SA.format(sluid=field) + "\n", columns=SACCT_TEXT_COLUMNS_SLUID)
    assert live.sluid == acct.sluid == expected
    assert live.comment == acct.comment == "dispatch:s=1;a=0"


@pytest.mark.parametrize("field", ["12345", "s-bad", "sE0HM8R59HN500 x"])
def test_a_garbled_sluid_is_refused(field: str) -> None:
    with pytest.raises(ProtocolError, match="SLUID"):
        parse_squeue_text(SQ.format(sluid=field) + "\n", columns=SQUEUE_TEXT_COLUMNS_SLUID)


@pytest.mark.parametrize(("version", "squeue", "sacct", "identity"), [
    ((26, 5, 5), True, True, IDENTITY_SLUID),
    ((25, 11, 0), True, True, IDENTITY_SLUID_ACCOUNTING),  # squeue has it, writes do not
    ((24, 11, 5), False, True, IDENTITY_SLUID_ACCOUNTING),
    ((22, 5, 8), False, False, IDENTITY_CLASSIC),
    ((26, 5, 5), False, True, IDENTITY_SLUID_ACCOUNTING),  # squeue refused: never write by it
])
def test_identity_from_what_preflight_probed(version: tuple[int, int, int], squeue: bool,
                                             sacct: bool, identity: str) -> None:
    assert identity_for(version, squeue_sluid=squeue, sacct_sluid=sacct) == identity


class Recording:
    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        self.argv.append(list(argv))
        return CommandResult(tuple(argv), 0, "", "", 0.0)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        raise AssertionError("no script here")

    async def close(self) -> None:
        pass


CAPS = Capabilities(slurm_version="26.05.5", identity=IDENTITY_SLUID, squeue_sluid=True,
                    sacct_sluid=True, accounting_history=True)


def adapter(runner: Recording, caps: Capabilities | None = CAPS) -> SlurmAdapter:
    return SlurmAdapter(runner, cluster="lab", user="svc", capabilities=caps,  # type: ignore[arg-type]
                        settings=StartSettings(output_dir="/tmp/dispatch-sluid-test"))


async def test_writes_name_the_job_by_its_sluid_and_cancel_drops_the_name_filter() -> None:
    runner = Recording()
    slurm = adapter(runner)
    for operation in ("cancel", "hold", "start-now", "release", "requeue"):
        await slurm._write(operation, SLUID, uid="dj-x", begin=2_000_000_000)
        await slurm._write(operation, "7", uid="dj-x", begin=2_000_000_000)
    assert runner.argv == [
        ["scancel", SLUID], ["scancel", "--name=dj-x", "7"],
        ["scontrol", "update", f"JobId={SLUID}", "StartTime=2033-05-18T03:33:20"],
        ["scontrol", "update", "JobId=7", "StartTime=2033-05-18T03:33:20"],
        ["scontrol", "update", f"JobId={SLUID}", "StartTime=now"],
        ["scontrol", "update", "JobId=7", "StartTime=now"],
        ["scontrol", "release", SLUID], ["scontrol", "release", "7"],
        ["scontrol", "requeue", SLUID], ["scontrol", "requeue", "7"],
    ]
    with pytest.raises(ErrInvalid):
        await slurm._write("cancel", "7;rm", uid="dj-x")
    with pytest.raises(ErrInvalid):
        await slurm._write("suspend", SLUID, uid="dj-x")


def test_the_target_is_the_sluid_only_where_writes_take_it() -> None:
    [job] = parse_squeue_text(SQ.format(sluid=SLUID) + "\n", columns=SQUEUE_TEXT_COLUMNS_SLUID)
    ref = ObjectRef("lab", "dj-x", 7, job.submit_time or 0)
    assert adapter(Recording())._target(ref, job) == SLUID
    accounting_only = replace(CAPS, identity=IDENTITY_SLUID_ACCOUNTING, squeue_sluid=False)
    assert adapter(Recording(), accounting_only)._target(ref, job) == "7"
    assert adapter(Recording(), None)._target(ref, job) == "7"  # no Preflight: never


def test_a_different_sluid_fails_the_identity_check_and_equality_ignores_it() -> None:
    [job] = parse_squeue_text(SQ.format(sluid=SLUID) + "\n", columns=SQUEUE_TEXT_COLUMNS_SLUID)
    slurm = adapter(Recording())
    ref = ObjectRef("lab", "dj-x", 7, job.submit_time or 0)
    assert slurm._same_object(ref, job)
    assert slurm._same_object(replace(ref, sluid=SLUID), job)
    stale = replace(ref, sluid="sE0HM8R5AF4V00")
    assert not slurm._same_object(stale, job)  # everything else matches: the belt holds
    # a requeue gives the job a new SLUID and submit time: a ref of the first run still
    # names it (restart count above zero, later submit), and a write takes the new SLUID
    requeued = replace(job, sluid="sE0HM8R5VBF800", restart_count=1,
                       submit_time=(job.submit_time or 0) + 3)
    assert slurm._same_object(replace(ref, sluid=SLUID), requeued)
    assert slurm._target(replace(ref, sluid=SLUID), requeued) == "sE0HM8R5VBF800"
    assert stale == ref and hash(stale) == hash(ref)  # a ref is the same ref with or without
