"""Golden Start scripts (SPEC §3): the rendered text, byte for byte.

Each ``testdata/golden/start/<case>.json`` holds a request, a configuration
(inline ``config`` or ``config_file``) and a job document (inline ``job`` or
``job_file``); ``<case>.sh`` is the exact expected Start script. Set
``UPDATE_GOLDEN=1`` to rewrite the goldens, then review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main
from controller.cli.documents import read_document
from controller.config import load_config, parse_config
from controller.model.ids import parse_job_id
from controller.model.obs import StartRequest
from controller.model.spec import parse_job_document
from controller.slurm.script import render_batch_script, render_start_script

ROOT = Path(__file__).resolve().parent.parent
CASES_DIR = ROOT / "testdata" / "golden" / "start"
CASES = sorted(CASES_DIR.glob("*.json"))


def _update_golden() -> bool:
    return os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")


def _load(case: Path) -> tuple[dict[str, Any], StartRequest, Any]:
    data = json.loads(case.read_text(encoding="utf-8"))
    if "config_file" in data:
        config = load_config(str(ROOT / data["config_file"]))
    else:
        config = parse_config(data.get("config", {}))
    doc = data["job"] if "job" in data else read_document(str(ROOT / data["job_file"]))
    r = data["request"]
    request = StartRequest(job_id=parse_job_id(r["job_id"]), generation=r["generation"],
                           submission=r["submission"], attempt=r["attempt"],
                           spec=parse_job_document(doc), gate=r["gate"],
                           extra_exclude=tuple(r["extra_exclude"]))
    return data, request, config


def _golden(case: Path) -> Path:
    return case.with_suffix(".sh")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.stem) for c in CASES])
def test_start_script_matches_golden(case: Path) -> None:
    _, request, config = _load(case)
    rendered = render_start_script(request, config.start_settings()).encode("utf-8")
    golden = _golden(case)
    if _update_golden():
        golden.write_bytes(rendered)
    assert golden.exists(), f"{golden} missing; run with UPDATE_GOLDEN=1 and review it"
    assert rendered == golden.read_bytes()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.stem) for c in CASES])
def test_golden_is_valid_sh(case: Path) -> None:
    """Both the Start script and the batch script inside it parse under /bin/sh."""
    _, request, config = _load(case)
    settings = config.start_settings()
    batch = render_batch_script(request, settings)
    for script in (render_start_script(request, settings), batch):
        result = subprocess.run(["/bin/sh", "-n"], input=script.encode(), capture_output=True,
                                check=False)
        assert result.returncode == 0, result.stderr.decode()
    assert b"\r\n" not in batch.encode()  # sbatch refuses DOS line breaks


def test_every_golden_has_a_case() -> None:
    scripts = {p.stem for p in CASES_DIR.glob("*.sh")}
    assert scripts == {c.stem for c in CASES}
    assert len(CASES) >= 9


def _cli_cases() -> list[Any]:
    """Cases the CLI can express: no inline config, no extra_exclude, generation 1."""
    out = []
    for case in CASES:
        data = json.loads(case.read_text(encoding="utf-8"))
        if "config" in data or data["request"]["extra_exclude"] or \
                data["request"]["generation"] != 1:
            continue
        out.append(pytest.param(case, id=case.stem))
    return out


@pytest.mark.parametrize("case", _cli_cases())
def test_cli_dry_run_prints_the_golden(case: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(case.read_text(encoding="utf-8"))
    if "job_file" in data:
        job_file = str(ROOT / data["job_file"])
    else:
        job_path = tmp_path / "job.json"
        job_path.write_text(json.dumps(data["job"]), encoding="utf-8")
        job_file = str(job_path)
    r = data["request"]
    argv = ["submit", job_file, "--dry-run", "--job-id", r["job_id"],
            "--submission", str(r["submission"]), "--attempt", str(r["attempt"])]
    if r["gate"]:
        argv.append("--gate")
    if "config_file" in data:
        argv += ["--config", str(ROOT / data["config_file"])]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out.encode("utf-8") == _golden(case).read_bytes()


def test_cli_cases_cover_yaml_json_and_config_files() -> None:
    ids = {p.id for p in _cli_cases()}
    assert {"minimal", "placement_override", "pass_variables", "gate"} <= ids
