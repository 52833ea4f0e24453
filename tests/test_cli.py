"""dispatchctl: the subcommand table, submit --dry-run, and one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.cli.app import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
JOB_ID = "01JZ8Q2N5V0000000000000000"
GOOD: dict[str, Any] = {"command": ["/bin/true"], "workdir": "/home/alice"}


def _write(tmp_path: Path, doc: object, name: str = "job.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(path)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dry_run_prints_a_start_script(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["submit", _write(tmp_path, GOOD), "--dry-run"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith("#!/bin/sh\n")
    assert "--job-name=dj-" in out


def test_dry_run_on_a_grid_engine_cluster_prints_its_qsub(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job's cluster (or the default one) chooses the Start script's kind."""
    config = tmp_path / "c.toml"
    config.write_text('[[clusters]]\nname = "lab"\n[[clusters]]\nname = "sge"\n'
                      'kind = "gridengine"\n')
    code, out, _ = _run(["--config", str(config), "submit",
                         _write(tmp_path, {**GOOD, "cluster": "sge"}), "--dry-run",
                         "--job-id", JOB_ID, "--gate"], capsys)
    assert code == 0
    assert f"J=$(qsub -terse -N dj-{JOB_ID} -A 'dispatch;s=1;a=0' -h " in out
    code, out, _ = _run(["--config", str(config), "submit", _write(tmp_path, GOOD),
                         "--dry-run"], capsys)
    assert code == 0 and "sbatch" in out and "qsub" not in out


def test_gate_and_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["submit", _write(tmp_path, GOOD), "--dry-run", "--job-id", JOB_ID,
                         "--submission", "5", "--attempt", "2", "--gate"], capsys)
    assert code == 0
    assert "'--comment=dispatch:s=5;a=2'" in out
    assert "  --hold \\\n" in out


def test_yaml_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["submit", str(ROOT / "testdata" / "jobs" / "train.yaml"), "--dry-run",
                         "--job-id", JOB_ID], capsys)
    assert code == 0
    assert "exec python3 train.py --epochs 90 --data /data/imagenet\n" in out


def test_stdin_document(monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(GOOD)))
    code, out, _ = _run(["submit", "-", "--dry-run", "--job-id", JOB_ID], capsys)
    assert code == 0 and "exec /bin/true\n" in out


def test_secret_looking_env_warns_once_per_name(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = {**GOOD, "env": {"API_TOKEN": "x", "db_password": "y", "HOME_DIR": "z"}}
    code, out, err = _run(["submit", _write(tmp_path, doc), "--dry-run"], capsys)
    assert code == 0 and out
    assert err.splitlines() == [
        "dispatchctl: warning: env.API_TOKEN looks like a secret; env values are stored in the "
        "job script by slurmctld",
        "dispatchctl: warning: env.db_password looks like a secret; env values are stored in "
        "the job script by slurmctld",
    ]


def test_submit_writes_the_database_and_get_reads_it(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/d.db"\n')
    job = _write(tmp_path, {**GOOD, "labels": {"wf": "x"}})
    code, out, err = _run(["submit", job, "--config", str(config)], capsys)
    assert code == 2 and "dispatchctl migrate" in err  # no schema yet: a clear error
    assert _run(["migrate", "--config", str(config)], capsys)[0] == 0
    code, out, err = _run(["submit", job, "--config", str(config)], capsys)
    assert code == 0, err
    job_id = out.strip()
    assert len(job_id) == 26
    code, out, _ = _run(["get", job_id, "-o", "json", "--config", str(config)], capsys)
    got = json.loads(out)
    assert code == 0 and (got["id"], got["phase"], got["attempt"]) == (job_id, "pending", 0)
    code, out, _ = _run(["cancel", "-l", "wf=x", "--config", str(config)], capsys)
    assert (code, out) == (0, "1 job(s) set to stopped\n")
    code, _, err = _run(["get", "01JZ8Q2N5V0000000000000000", "--config", str(config)],
                        capsys)
    assert code == 1 and "no job" in err


def test_config_goes_before_or_after_the_command(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``dispatchctl --config FILE get``, as kubectl takes its global flags (issue 21:
    it was refused with "argument COMMAND: invalid choice"); after the command wins."""
    config = tmp_path / "c.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/d.db"\n')
    assert _run(["--config", str(config), "migrate"], capsys)[0] == 0
    code, out, err = _run(["--config", str(config), "get", "-o", "json"], capsys)
    assert (code, json.loads(out)) == (0, {"items": []}), err
    bad = tmp_path / "bad.toml"
    bad.write_text("[nonsense]\n")
    code, _, err = _run(["--config", str(bad), "get", "--config", str(config)], capsys)
    assert code == 0, err
    code, _, err = _run(["--config", str(bad), "get"], capsys)
    assert code == 2 and "nonsense" in err


def test_get_unowned_lists_a_neighbours_jobs(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """What a leader's read found of dj- jobs this database never had: listed, counted
    by describe, never this deployment's."""
    from controller.model.obs import Cause, ObjectObs, ObjectRef, Source, State
    from controller.store import repo
    from controller.store.db import Store

    config = tmp_path / "c.toml"
    url = f"sqlite:///{tmp_path}/d.db"
    config.write_text(f'[database]\nurl = "{url}"\n')
    assert _run(["migrate", "--config", str(config)], capsys)[0] == 0
    ref = ObjectRef("lab", "dj-01JZ8Q2N5V0000000000000009", 4242, 1_800_000_000)
    obs = ObjectObs(ref=ref, state=State.RUNNING, cause=Cause(), submission=1, attempt=0,
                    foreign=False, restart_count=0, hold_instance=None, requeued=False,
                    exit_code=None, nodes=(), reason="", submit=ref.submit, start=None,
                    end=None, source=Source.LIVE, observed_at=ref.submit)
    store = Store(url)
    with store.transaction() as tx:
        repo.save_unowned(tx, "lab", [obs], now=1_800_000_000)
    store.dispose()
    code, out, _ = _run(["get", "--unowned", "--config", str(config)], capsys)
    assert code == 0 and out.splitlines()[0].split() == [
        "CLUSTER", "SLURM-ID", "NAME", "STATE", "SEEN"]
    assert out.splitlines()[1].split()[:4] == ["lab", "4242", ref.uid, "running"]
    code, out, _ = _run(["get", "--unowned", "-o", "json", "--config", str(config)], capsys)
    assert code == 0 and [u["slurm_job_id"] for u in json.loads(out)["items"]] == [4242]
    code, out, _ = _run(["describe", "--config", str(config)], capsys)
    assert code == 0 and "Unowned:     1 dj- Slurm job(s)" in out
    code, _, err = _run(["get", "--unowned", "-l", "a=b", "--config", str(config)], capsys)
    assert code == 2 and "unowned" in err


@pytest.mark.parametrize(("doc", "extra", "field"), [
    pytest.param({"workdir": "/w"}, [], "command", id="no-command"),
    pytest.param({"command": [], "workdir": "/w"}, [], "command", id="empty-command"),
    pytest.param({**GOOD, "workdir": "rel"}, [], "workdir", id="relative-workdir"),
    pytest.param({**GOOD, "env": {"DISPATCH_X": "1"}}, [], "env.DISPATCH_X", id="reserved-env"),
    pytest.param({**GOOD, "resources": {"nodes": 0}}, [], "resources.nodes", id="nodes"),
    pytest.param({**GOOD, "extensions": {"dispatch": {"Image": {}}}}, [],
                 "extensions.dispatch.Image", id="image-unsupported"),
    pytest.param({**GOOD, "extensions": {"k8s": {}}}, [], "extensions.k8s", id="namespace"),
    pytest.param({**GOOD, "colour": "blue"}, [], "colour", id="unknown-field"),
    pytest.param('{"command": ["a"], "command": ["b"], "workdir": "/w"}', [], "command",
                 id="duplicate-key"),
    pytest.param(GOOD, ["--job-id", "not-a-ulid"], "--job-id", id="job-id"),
    pytest.param(GOOD, ["--submission", "0"], "--submission", id="submission-0"),
    pytest.param(GOOD, ["--submission", "1000000"], "--submission", id="submission-big"),
    pytest.param(GOOD, ["--submission", "01"], "--submission", id="submission-leading-zero"),
    pytest.param(GOOD, ["--attempt", "-1"], "--attempt", id="attempt-negative"),
    pytest.param({**GOOD, "stop_grace_s": 100_000}, [], "stop_grace_s", id="grace"),
    pytest.param({**GOOD, "command": ["x" * 50_000, "y" * 50_000]}, [], "job", id="too-big"),
])
def test_bad_input_is_one_line_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, extra: list[str],
        field: str) -> None:
    code, out, err = _run(["submit", _write(tmp_path, doc), "--dry-run", *extra], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(f"dispatchctl: error: {field}: "), err


def test_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.json")
    bad_json = _write(tmp_path, "{", "bad.json")
    bad_yaml = _write(tmp_path, "command: [unclosed\n", "bad.yaml")
    for path in (missing, bad_json, bad_yaml):
        code, _, err = _run(["submit", path, "--dry-run"], capsys)
        assert code == 2
        assert err.count("\n") == 1 and err.startswith(f"dispatchctl: error: {path}: "), err


def test_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[output]\ndir = "/out/%j"\n')
    code, _, err = _run(["submit", _write(tmp_path, GOOD), "--dry-run", "--config",
                         str(config)], capsys)
    assert code == 2
    assert err.startswith("dispatchctl: error: output.dir: must not contain %"), err
    config.write_text("[daemon]\ntick = 1\n")
    code, _, err = _run(["submit", _write(tmp_path, GOOD), "--dry-run", "--config",
                         str(config)], capsys)
    assert (code, err) == (2, "dispatchctl: error: daemon.tick: unknown key\n")


@pytest.mark.parametrize("argv", [
    pytest.param([], id="no-command"),
    pytest.param(["launch"], id="unknown-command"),
    pytest.param(["submit"], id="no-file"),
    pytest.param(["submit", "f.json", "--bogus"], id="unknown-flag"),
])
def test_usage_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(argv, capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("dispatchctl: error: "), err


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "submit" in out


def test_the_table_drives_the_parser() -> None:
    parser = build_parser()
    args = parser.parse_args(["submit", "x.json", "--dry-run"])
    assert args.handler is COMMANDS["submit"].handler
    assert args.config is None
