"""The Grid Engine Start script (controller/gridengine/script.py): golden text, the
qsub options of each resource, what is refused before anything runs, and the batch
script run by a real sh with Grid Engine's variables."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controller.errors import ErrInvalid, ErrUnsupported
from controller.gridengine.script import (
    GridEngineSettings,
    host_expression,
    qsub_options,
    render_batch_script,
    render_start_script,
)
from controller.model.ids import parse_job_id
from controller.model.obs import StartRequest
from controller.model.spec import parse_job_document
from controller.slurm.script import StartSettings

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "testdata" / "golden" / "gridengine"
JOB = "01JZ8Q2N5V0000000000000000"


def request(doc: dict[str, object], *, gate: bool = True, exclude: tuple[str, ...] = (),
            submission: int = 2, attempt: int = 1) -> StartRequest:
    base: dict[str, object] = {"command": ["python3", "-c", "print('hi')"],
                               "workdir": "/home/dispatch/w"}
    return StartRequest(job_id=parse_job_id(JOB), generation=3, submission=submission,
                        attempt=attempt, spec=parse_job_document({**base, **doc}),
                        gate=gate, extra_exclude=exclude)


CASES = {
    "minimal": (request({}), StartSettings(), GridEngineSettings()),
    "resources": (request({"resources": {"tasks_per_node": 2, "cpus_per_task": 2,
                                         "memory_mb": 4000, "time_limit_s": 90},
                           "env": {"A": "x\ny", "B": "it's"}, "requeue": True},
                          exclude=("node7",)),
                  StartSettings(output_dir="/data/out", pass_names=("PATH", "HOME")),
                  GridEngineSettings(queue="all.q", pe="smp", project="lab")),
    "output": (request({"extensions": {"dispatch": {"Output": {
        "stdout": "/data/exp/out", "stderr": "/data/exp/err"}}}}, gate=False),
               StartSettings(), GridEngineSettings()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_start_script_matches_golden(name: str) -> None:
    req, settings, ge = CASES[name]
    rendered = render_start_script(req, settings, ge)
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("UPDATE_GOLDEN", "") not in ("", "0"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_qsub_options_in_order() -> None:
    req, settings, ge = CASES["resources"]
    assert qsub_options(req, settings, ge) == [
        "-terse", "-N", f"dj-{JOB}", "-A", "'dispatch;s=2;a=1'", "-h", "-S", "/bin/sh",
        "-wd", "/home/dispatch/w", "-j", "y", "-o", '"$D/s2-\\$JOB_ID.ge"', "-r", "y",
        "-l", "h_rt=90", "-l", "h_vmem=1000M", "-pe", "smp", "4", "-q", "all.q",
        "-P", "lab", "-l", "'h=!node7'", "-w", "e"]


def test_host_expression() -> None:
    assert host_expression("", ["a"]) == "!a"
    assert host_expression("a,b", ["c", "c", "d"]) == "(a|b)&!c&!d"
    assert host_expression("a", []) == "a"
    with pytest.raises(ErrInvalid):
        host_expression("a b", [])


@pytest.mark.parametrize(("doc", "error"), [
    pytest.param({"resources": {"nodes": 2}}, ErrUnsupported, id="nodes"),
    pytest.param({"resources": {"gpus_per_node": 1}}, ErrUnsupported, id="gpus"),
    pytest.param({"extensions": {"slurm": {"Placement": {"partition": "gpu"}}}},
                 ErrUnsupported, id="partition"),
    pytest.param({"extensions": {"slurm": {"Resources": {"gres": "gpu:1"}}}},
                 ErrUnsupported, id="gres"),
    pytest.param({"workdir": "/x", "extensions": {"slurm": {"Placement": {
        "exclude": "a;b"}}}}, ErrInvalid, id="bad exclude"),
])
def test_refused_before_anything_runs(doc: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        render_start_script(request(doc), StartSettings(), GridEngineSettings())


def test_exclusion_refuses_a_bad_host_name() -> None:
    with pytest.raises(ErrInvalid):
        render_start_script(request({}, exclude=("a&b",)), StartSettings(),
                            GridEngineSettings())


def test_batch_script_runs_with_grid_engine_variables(tmp_path: Path) -> None:
    req, settings, _ = CASES["resources"]
    req2 = StartRequest(job_id=req.job_id, generation=1, submission=2, attempt=1,
                        spec=parse_job_document({"command": ["sh", "-c",
                                                             'printf "%s|%s|%s|%s" '
                                                             '"$DISPATCH_ATTEMPT" '
                                                             '"$DISPATCH_EPOCH" "$A" "$HOME"'],
                                                 "workdir": "/", "env": {"A": "x\ny"}}))
    body = render_batch_script(req2, settings)
    script = tmp_path / "job.sh"
    script.write_text(body)
    env = {"PATH": os.environ["PATH"], "JOB_ID": "41", "RESTARTED": "1"}
    subprocess.run(["sh", str(script), str(tmp_path), "=/usr/bin", "=/home/x"], env=env,
                   check=True)
    assert (tmp_path / "s2-41-r1.out").read_text() == "s2-41-r1|2000001|x\ny|/home/x"
    bad = subprocess.run(["sh", str(script), str(tmp_path), "", ""],
                         env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
                         check=False)
    assert bad.returncode == 125 and "JOB_ID" in bad.stderr
