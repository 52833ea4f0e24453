"""What Start refuses before anything runs (SPEC §3.3), and a few rendering rules."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import pytest

from controller.errors import ErrInvalid
from controller.model.ids import JobID
from controller.model.obs import StartRequest
from controller.model.spec import Placement, parse_job_document
from controller.slurm import script
from controller.slurm.script import (
    MAX_SCRIPT_BYTES,
    StartSettings,
    render_start_script,
    sbatch_options,
)

JOB = JobID("01JZ8Q2N5V0000000000000000")


def _request(doc: dict[str, Any] | None = None, **changes: Any) -> StartRequest:
    base = {"command": ["/bin/true"], "workdir": "/home/alice"}
    spec = parse_job_document({**base, **(doc or {})})
    request = StartRequest(job_id=JOB, generation=1, submission=1, attempt=0, spec=spec)
    return dataclasses.replace(request, **changes)


@pytest.mark.parametrize(("request_", "settings", "field"), [
    pytest.param(_request(job_id=JobID("01jz8q2n5v0000000000000000")), StartSettings(),
                 "job_id", id="job-id-lower-case"),
    pytest.param(_request(job_id=JobID("dj-01JZ8Q2N5V0000000000000000")), StartSettings(),
                 "job_id", id="job-id-shape"),
    pytest.param(_request(attempt=-1), StartSettings(), "attempt", id="negative-attempt"),
    pytest.param(_request(submission=0), StartSettings(), "submission", id="submission-0"),
    pytest.param(_request(submission=1_000_000), StartSettings(), "submission",
                 id="submission-1000000"),
    pytest.param(_request(spec=dataclasses.replace(_request().spec, workdir="rel/dir")),
                 StartSettings(), "workdir", id="relative-workdir"),
    pytest.param(_request(), StartSettings(output_dir="/out/%u"), "output.dir",
                 id="output-dir-percent"),
    pytest.param(_request(), StartSettings(output_dir="/out\\x"), "output.dir",
                 id="output-dir-backslash"),
    pytest.param(_request(), StartSettings(output_dir="/out\nx"), "output.dir",
                 id="output-dir-newline"),
    pytest.param(_request(), StartSettings(output_dir="/out\tx"), "output.dir",
                 id="output-dir-tab"),
    pytest.param(_request(), StartSettings(pass_names=("DISPATCH_X",)), "environment.pass[0]",
                 id="pass-reserved"),
    pytest.param(_request(), StartSettings(pass_names=("A B",)), "environment.pass[0]",
                 id="pass-not-identifier"),
    pytest.param(_request(extra_exclude=("",)), StartSettings(), "extra_exclude[0]",
                 id="extra-exclude-empty"),
    pytest.param(_request(extra_exclude=("n 1",)), StartSettings(), "extra_exclude[0]",
                 id="extra-exclude-space"),
    pytest.param(_request({"stop_grace_s": 65_536}), StartSettings(), "stop_grace_s",
                 id="grace-over-slurm-limit"),
    pytest.param(_request({"resources": {"memory_mb": 10},
                           "extensions": {"slurm": {"Resources": {"mem_per_cpu_mb": 1}}}}),
                 StartSettings(), "extensions.slurm.Resources.mem_per_cpu_mb",
                 id="mem-and-mem-per-cpu"),
    pytest.param(_request({"extensions": {"slurm": {"Resources": {"mem_per_cpu_mb": 1,
                                                                  "mem_per_gpu_mb": 1}}}}),
                 StartSettings(), "extensions.slurm.Resources.mem_per_gpu_mb",
                 id="mem-per-cpu-and-gpu"),
    pytest.param(_request({"command": ["x" * 50_000, "y" * 50_000]}), StartSettings(), "job",
                 id="over-90-KiB"),
])
def test_refused(request_: StartRequest, settings: StartSettings, field: str) -> None:
    with pytest.raises(ErrInvalid) as info:
        render_start_script(request_, settings)
    assert info.value.field == field


def _args(char: str, count: int) -> list[str]:
    """``count`` characters spread over arguments of at most 60,000 (the spec's limit)."""
    return [char * min(60_000, count - i) for i in range(0, count, 60_000)]


def test_size_limit_counts_utf8_bytes() -> None:
    rendered = render_start_script(_request(), StartSettings())
    room = MAX_SCRIPT_BYTES - len(rendered.encode())
    # each extra argument costs one space; plain ASCII needs no quotes
    fits = _request({"command": ["/bin/true", *_args("a", room - 2)]})
    assert len(render_start_script(fits, StartSettings()).encode()) == MAX_SCRIPT_BYTES
    too_big = _request({"command": ["/bin/true", *_args("a", room - 1)]})
    with pytest.raises(ErrInvalid):
        render_start_script(too_big, StartSettings())
    # "é" is two bytes: half as many characters already do not fit
    over = _request({"command": ["/bin/true", *_args("é", room // 2)]})
    with pytest.raises(ErrInvalid):
        render_start_script(over, StartSettings())


def test_name_labels_checkpoint_never_reach_sbatch() -> None:
    doc = {"name": "secret-name", "labels": {"team": "label-value"},
           "extensions": {"dispatch": {"SharedCheckpoint": {"path": "/ckpt/path-value"}}}}
    rendered = render_start_script(_request(doc), StartSettings())
    for text in ("secret-name", "label-value", "/ckpt/path-value"):
        assert text not in rendered


def test_placement_merges_field_by_field_and_appends_extra_exclude() -> None:
    defaults = Placement(partition="batch", account="acct", qos="normal", exclude="n1",
                         exclusive=False)
    doc = {"extensions": {"slurm": {"Placement": {"qos": "high", "nodelist": "n[2-3]"}}}}
    words = sbatch_options(_request(doc, extra_exclude=("n9", "n9", "n8")),
                           StartSettings(defaults=defaults))
    options = [shlex.split(w)[0] for w in words]
    assert [o for o in options if o.startswith(("--partition", "--account", "--qos",
                                                "--nodelist", "--exclude", "--exclusive"))] == [
        "--partition=batch", "--account=acct", "--qos=high", "--nodelist=n[2-3]",
        "--exclude=n1,n9,n8"]


def test_time_rounds_up_to_minutes() -> None:
    for seconds, minutes in ((1, 1), (60, 1), (61, 2), (86_400, 1440)):
        words = sbatch_options(_request({"resources": {"time_limit_s": seconds},
                                         "extensions": {"slurm": {"Resources": {
                                             "time_min_s": seconds}}}}), StartSettings())
        assert f"--time={minutes}" in words
        assert f"--time-min={minutes}" in words


def test_delimiter_skips_lines_of_the_body() -> None:
    assert script._delimiter("a\nb\n") == "DISPATCH_EOF"
    assert script._delimiter("DISPATCH_EOF\nDISPATCH_EOF_1\n") == "DISPATCH_EOF_2"
    every = "\n".join(["DISPATCH_EOF"] + [f"DISPATCH_EOF_{i}" for i in range(1, 1000)])
    with pytest.raises(ErrInvalid):
        script._delimiter(every)


@pytest.mark.parametrize(("value", "word"), [
    pytest.param("plain", "plain", id="safe"),
    pytest.param("it's", "'it'\"'\"'s'", id="quote"),
    pytest.param("a\nb", "a\"$DISPATCH_NL\"b", id="newline"),
    pytest.param("\r\n", "\"$DISPATCH_CR\"\"$DISPATCH_NL\"", id="crlf-only"),
    pytest.param("", "''", id="empty"),
])
def test_values_stay_on_one_line(value: str, word: str) -> None:
    assert script._literal(value) == word
