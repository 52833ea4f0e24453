"""Output files of a submission (SPEC §3.4): paths, manifest, restart order."""

from __future__ import annotations

import pytest

from controller.errors import ErrInvalid
from controller.model.ids import JobID
from controller.model.spec import parse_job_document
from controller.slurm.script import (
    StartSettings,
    StreamFiles,
    manifest_path,
    output_dir,
    output_layout,
    parse_execution_file,
    parse_manifest,
    shell_path,
    sort_execution_files,
)

JOB = JobID("01JZ8Q2N5V0000000000000000")


def test_paths_as_configured() -> None:
    settings = StartSettings()
    assert output_dir(settings, JOB) == f"~/.dispatch/output/{JOB}"
    assert manifest_path(settings, JOB, 3) == f"~/.dispatch/output/{JOB}/s3.manifest"
    assert output_dir(StartSettings(output_dir="/data/"), JOB) == f"/data/{JOB}"


@pytest.mark.parametrize(("path", "word"), [
    pytest.param("~", '"$HOME"', id="home"),
    pytest.param("~/", '"$HOME"', id="home-slash"),
    pytest.param("~/a b", '"$HOME"/\'a b\'', id="under-home"),
    pytest.param("/x/y", "/x/y", id="absolute"),
    pytest.param("/x y", "'/x y'", id="absolute-space"),
])
def test_shell_path(path: str, word: str) -> None:
    assert shell_path(path) == word


def test_default_layout_and_manifest_round_trip() -> None:
    spec = parse_job_document({"command": ["x"], "workdir": "/w"})
    layout = output_layout(StartSettings(output_dir="/o"), JOB, 4, spec)
    assert layout.manifest_path == f"/o/{JOB}/s4.manifest"
    assert layout.slurm_log_pattern == f"/o/{JOB}/s4-%j.slurm"
    assert layout.stdout.file_name(77, 2) == "s4-77-r2.out"
    assert layout.stderr.file_name(77, 2) == "s4-77-r2.err"
    assert parse_manifest(layout.manifest_json()) == (layout.stdout, layout.stderr)
    assert layout.stdout.locate(layout.directory) == (f"/o/{JOB}", "s4-")


def test_dispatch_output_layout() -> None:
    spec = parse_job_document({"command": ["x"], "workdir": "/w", "extensions": {"dispatch": {
        "Output": {"stdout": "/logs/run.out", "stderr": "/logs/run.err"}}}})
    layout = output_layout(StartSettings(), JOB, 2, spec)
    assert layout.stdout == StreamFiles("/logs/run.out.s2-", "")
    assert layout.stdout.file_name(9, 0) == "/logs/run.out.s2-9-r0"
    assert layout.stderr.locate(layout.directory) == ("/logs", "run.err.s2-")


def test_restart_order_is_numeric() -> None:
    names = ["s1-7-r10.out", "s1-7-r9.out", "s1-7-r0.out", "s1-7-r1.out", "s1-7-r10.err",
             "s1.manifest", "s1-7.slurm", "s1-7-r01.out", "s1-7-r2.out.tmp", "s12-7-r3.out",
             "s1-x-r3.out"]
    assert sort_execution_files(names, "s1-", ".out") == [
        "s1-7-r0.out", "s1-7-r1.out", "s1-7-r9.out", "s1-7-r10.out"]
    assert sort_execution_files(["run.s1-5-r2", "run.s1-5-r11", "run.s1-5-r2.gz"],
                                "run.s1-", "") == ["run.s1-5-r2", "run.s1-5-r11"]


def test_parse_execution_file() -> None:
    assert parse_execution_file("s3-123-r45.err", "s3-", ".err") == (123, 45)
    assert parse_execution_file("s3-123-r45.err", "s3-", ".out") is None
    assert parse_execution_file("s3--r45.err", "s3-", ".err") is None


@pytest.mark.parametrize("text", [
    pytest.param("not json", id="not-json"),
    pytest.param('{"version": 2, "stdout": {}, "stderr": {}}', id="version"),
    pytest.param('{"version": 1, "stdout": {"prefix": "a"}, "stderr": {}}', id="no-suffix"),
    pytest.param("[]", id="list"),
])
def test_bad_manifest(text: str) -> None:
    with pytest.raises(ErrInvalid):
        parse_manifest(text)
