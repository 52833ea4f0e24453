"""The Start script and batch script, executed under a real /bin/sh (SPEC §3).

A recording fake ``sbatch`` stands first in PATH: it saves its argv and the
batch script it reads, and prints a job id. The saved batch script is then run
the way slurmstepd runs it -- an empty environment plus ``SLURM_JOB_ID`` (and
``SLURM_RESTART_COUNT`` after a requeue), the stored arguments, the work
directory as cwd -- with a Python helper as the command that reports the argv
and environment it received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.model.ids import JobID
from controller.model.obs import StartRequest
from controller.model.spec import parse_job_document
from controller.runner.base import CommandResult
from controller.slurm.script import (
    SETUP_FAILED_EXIT,
    StartSettings,
    render_start_script,
    sort_execution_files,
    start_dirs,
)
from controller.slurm.startbatch import batch_script, parse_batch_output

JOB_ID = JobID("01JZ8Q2N5V0000000000000042")
SLURM_JOB_ID = "4242"
PASS = ("PATH", "HOSTVAR_A", "HOSTVAR_EMPTY", "HOSTVAR_UNSET")
# The helper must see exactly what it is given: no C-locale coercion adding LC_CTYPE.
PYTHON_ENV = {"PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "1"}

FAKE_SBATCH = """#!/bin/sh
printf '%s\\0' "$@" >"$DISPATCH_TEST_RECORD/argv"
cat >"$DISPATCH_TEST_RECORD/script"
echo 4242
"""

HELPER = """import json, os, sys
sys.stderr.write("helper-stderr\\n")
json.dump({"argv": [os.fsencode(a).hex() for a in sys.argv[1:]],
           "env": {k.hex(): v.hex() for k, v in os.environb.items()}}, sys.stdout)
"""

# Any text but NUL, heavy on what a shell or a here-document would misread.
_TRICKY = ["$", "`", "'", '"', "\\", "\n", "\r", "\r\n", "\t", " ", "!", "#", "&", ";", "|",
           "*", "?", "[", "]", "{", "}", "(", ")", "<", ">", "~", "%", "=", "-", "$(id)",
           "${HOME}", "$1", "\nDISPATCH_EOF\n", "DISPATCH_EOF", "\nDISPATCH_EOF_1", "\nDé", "é",
           "世", "\U0001f600", "\u2028", "\x7f"]
_pieces = st.one_of(st.sampled_from(_TRICKY),
                    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
texts = st.lists(_pieces, max_size=12).map("".join)
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not n.upper().startswith(("DISPATCH_", "PYTHON", "LD_", "MALLOC_", "GLIBC_"))
)


def _decode_env(hexed: dict[str, str]) -> dict[bytes, bytes]:
    return {bytes.fromhex(k): bytes.fromhex(v) for k, v in hexed.items()}


def _b(mapping: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in mapping.items()}


class Host:
    """A scratch Slurm host: fake sbatch, a home, a work directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.record = root / "record"
        self.home = root / "home"
        self.workdir = root / "work dir é'$x"
        for d in (self.bin, self.record, self.home, self.workdir):
            d.mkdir()
        sbatch = self.bin / "sbatch"
        sbatch.write_text(FAKE_SBATCH)
        sbatch.chmod(0o755)
        self.helper = root / "helper.py"
        self.helper.write_text(HELPER)

    def start(self, script: str, env: dict[str, str], *,
              stdin_mode: bool = False) -> subprocess.CompletedProcess[bytes]:
        argv = ["/bin/sh", "-s"] if stdin_mode else ["/bin/sh", "-c", script]
        return subprocess.run(argv, input=script.encode() if stdin_mode else None,
                              env={**env, "DISPATCH_TEST_RECORD": str(self.record)},
                              capture_output=True, check=False, cwd=self.root)

    def recorded_argv(self) -> list[str]:
        raw = (self.record / "argv").read_bytes()
        assert raw.endswith(b"\0")
        return [a.decode() for a in raw[:-1].split(b"\0")]

    def run_batch(self, args: list[str], restart: int | None) -> subprocess.CompletedProcess[bytes]:
        env = {"SLURM_JOB_ID": SLURM_JOB_ID}
        if restart is not None:
            env["SLURM_RESTART_COUNT"] = str(restart)
        return subprocess.run(["/bin/sh", str(self.record / "script"), *args], env=env,
                              cwd=self.workdir, capture_output=True, check=False)


def _request(host: Host, command: list[str], env: dict[str, str], *, submission: int,
             attempt: int, gate: bool) -> StartRequest:
    doc: dict[str, Any] = {"command": [sys.executable, "-S", str(host.helper), *command],
                           "workdir": str(host.workdir), "env": {**env, **PYTHON_ENV}}
    return StartRequest(job_id=JOB_ID, generation=1, submission=submission, attempt=attempt,
                        spec=parse_job_document(doc), gate=gate)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(command=st.lists(texts, max_size=6),
       env=st.dictionaries(env_names, texts, max_size=5),
       host_a=texts,
       submission=st.integers(1, 999_999),
       attempt=st.integers(0, 10**7),
       gate=st.booleans(),
       under_home=st.booleans())
def test_start_then_batch_runs_the_command_exactly(
        command: list[str], env: dict[str, str], host_a: str, submission: int, attempt: int,
        gate: bool, under_home: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(Path(tmp))
        out_cfg = "~/out" if under_home else str(host.root / "out")
        out_dir = (host.home if under_home else host.root) / "out" / JOB_ID
        start_settings = StartSettings(output_dir=out_cfg, pass_names=PASS)
        request = _request(host, command, env, submission=submission, attempt=attempt,
                           gate=gate)
        script = render_start_script(request, start_settings)

        host_env = {"PATH": f"{host.bin}:{os.environ['PATH']}", "HOME": str(host.home),
                    "HOSTVAR_A": host_a, "HOSTVAR_EMPTY": ""}
        started = host.start(script, host_env)
        assert started.returncode == 0, started.stderr.decode()
        assert started.stdout == b"4242\n"

        # --- what sbatch was given
        argv = host.recorded_argv()
        n = submission
        script_at = argv.index("/dev/stdin")
        options, args = argv[:script_at], argv[script_at + 1:]
        assert options[0] == "--parsable"
        assert all(o.startswith("--") for o in options)
        assert f"--job-name=dj-{JOB_ID}" in options
        assert f"--comment=dispatch:s={n};a={attempt}" in options
        assert "--export=NIL" in options
        assert ("--hold" in options) == gate
        assert f"--chdir={host.workdir}" in options
        assert f"--output={out_dir}/s{n}-%j.slurm" in options
        assert f"--error={out_dir}/s{n}-%j.slurm" in options
        assert "--no-requeue" in options
        assert args[0] == str(out_dir)
        batch = (host.record / "script").read_bytes()
        assert b"\r\n" not in batch and b"\0" not in batch  # what real sbatch refuses
        manifest = json.loads((out_dir / f"s{n}.manifest").read_text())
        assert manifest == {"version": 1, "stdout": {"prefix": f"s{n}-", "suffix": ".out"},
                            "stderr": {"prefix": f"s{n}-", "suffix": ".err"}}
        assert not (out_dir / f"s{n}.manifest.tmp").exists()

        # --- each execution of the stored batch script
        for restart in (None, 1, 10, 999_999):
            r = restart or 0
            ran = host.run_batch(args, restart)
            assert ran.returncode == 0, ran.stderr.decode()
            out_file = out_dir / f"s{n}-{SLURM_JOB_ID}-r{r}.out"
            report = json.loads(out_file.read_text())
            err_file = out_dir / f"s{n}-{SLURM_JOB_ID}-r{r}.err"
            assert err_file.read_bytes() == b"helper-stderr\n"
            assert [bytes.fromhex(a) for a in report["argv"]] == [a.encode() for a in command]

            expected = {"SLURM_JOB_ID": SLURM_JOB_ID, "PWD": str(host.workdir)}
            if restart is not None:
                expected["SLURM_RESTART_COUNT"] = str(restart)
            expected.update({
                "DISPATCH_JOB_ID": JOB_ID, "DISPATCH_SUBMISSION": str(n),
                "DISPATCH_ATTEMPT": f"s{n}-{SLURM_JOB_ID}-r{r}",
                "DISPATCH_EPOCH": str(n * 1_000_000 + r),
                "PATH": host_env["PATH"], "HOSTVAR_A": host_a, "HOSTVAR_EMPTY": "",
                "SLURM_EXPORT_ENV": "ALL",
            })
            expected.update(env)
            expected.update(PYTHON_ENV)
            assert _decode_env(report["env"]) == _b(expected)

        names = os.listdir(out_dir)
        assert sort_execution_files(names, f"s{n}-", ".out") == [
            f"s{n}-{SLURM_JOB_ID}-r{r}.out" for r in (0, 1, 10, 999_999)]

        # --- a restart count at the bound never reaches the command
        refused = host.run_batch(args, 1_000_000)
        assert refused.returncode == SETUP_FAILED_EXIT
        assert b"SLURM_RESTART_COUNT=1000000" in refused.stderr
        assert not (out_dir / f"s{n}-{SLURM_JOB_ID}-r1000000.out").exists()


def _simple_request(host: Host) -> StartRequest:
    return _request(host, ["hello"], {}, submission=1, attempt=0, gate=False)


def test_start_script_fed_on_stdin(tmp_path: Path) -> None:
    """``sh -s`` with the script on stdin (as over SSH) works the same as ``sh -c``."""
    host = Host(tmp_path)
    script = render_start_script(_simple_request(host),
                                 StartSettings(output_dir=str(tmp_path / "out")))
    started = host.start(script, {"PATH": f"{host.bin}:{os.environ['PATH']}"},
                         stdin_mode=True)
    assert started.returncode == 0, started.stderr.decode()
    assert started.stdout == b"4242\n"
    argv = host.recorded_argv()
    assert argv[argv.index("/dev/stdin") + 1:] == [
        str(tmp_path / "out" / JOB_ID), f"={host.bin}:{os.environ['PATH']}"]


def test_start_stops_when_a_step_fails(tmp_path: Path) -> None:
    """mkdir failing (a file where D's parent should be) stops the script before sbatch."""
    host = Host(tmp_path)
    (tmp_path / "blocker").write_text("")
    script = render_start_script(_simple_request(host),
                                 StartSettings(output_dir=str(tmp_path / "blocker")))
    started = host.start(script, {"PATH": f"{host.bin}:{os.environ['PATH']}"})
    assert started.returncode != 0
    assert not (host.record / "argv").exists()


def test_start_stops_without_home(tmp_path: Path) -> None:
    """``~`` needs HOME on the host: unset, the script stops before sbatch."""
    host = Host(tmp_path)
    script = render_start_script(_simple_request(host), StartSettings())
    started = host.start(script, {"PATH": f"{host.bin}:{os.environ['PATH']}"})
    assert started.returncode != 0
    assert not (host.record / "argv").exists()


def test_sbatch_failure_is_the_script_status(tmp_path: Path) -> None:
    host = Host(tmp_path)
    (host.bin / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission "
                                     "failed' >&2\nexit 1\n")
    script = render_start_script(_simple_request(host),
                                 StartSettings(output_dir=str(tmp_path / "out")))
    started = host.start(script, {"PATH": f"{host.bin}:{os.environ['PATH']}"})
    assert started.returncode == 1
    assert b"submission failed" in started.stderr


def test_batch_refuses_a_missing_or_odd_job_id_and_restart_count(tmp_path: Path) -> None:
    host = Host(tmp_path)
    script = render_start_script(_simple_request(host),
                                 StartSettings(output_dir=str(tmp_path / "out")))
    assert host.start(script, {"PATH": f"{host.bin}:{os.environ['PATH']}"}).returncode == 0
    args = host.recorded_argv()[host.recorded_argv().index("/dev/stdin") + 1:]
    script_path = str(host.record / "script")
    for env in ({}, {"SLURM_JOB_ID": "12a"},
                {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "010"},
                {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "-1"},
                {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1e3"},
                {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "99999999999999999999"}):
        ran = subprocess.run(["/bin/sh", script_path, *args], env=env, cwd=host.workdir,
                             capture_output=True, check=False)
        assert ran.returncode == SETUP_FAILED_EXIT, env
        assert ran.stderr.startswith(b"dispatch: "), env


_COUNTING = """#!/bin/sh
echo "$0" >>"$DISPATCH_TEST_RECORD/processes"
exec /bin/{name} "$@"
"""


def test_a_start_batch_makes_every_directory_with_one_mkdir_and_renames_nothing(
        tmp_path: Path) -> None:
    """A batch of three Start scripts (one with dispatch.Output, one whose Output
    directory cannot be made): the batch's one ``mkdir -p`` makes the directories, no
    script starts a ``mkdir`` or ``mv`` of its own but the one whose directory is still
    missing, which fails alone with its own message; the others are submitted with their
    manifests written."""
    host = Host(tmp_path)
    for name in ("mkdir", "mv"):
        (host.bin / name).write_text(_COUNTING.format(name=name))
        (host.bin / name).chmod(0o755)
    (host.bin / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (host.bin / "squeue").chmod(0o755)
    (tmp_path / "a-file").write_text("not a directory\n")
    settings_ = StartSettings(output_dir=str(tmp_path / "out"))
    outputs: list[dict[str, Any] | None] = [
        None, {"stdout": str(tmp_path / "logs" / "x.out"), "stderr": str(tmp_path / "x.err")},
        {"stdout": str(tmp_path / "a-file" / "x.out"), "stderr": str(tmp_path / "y.err")}]
    requests = []
    for index, output in enumerate(outputs):
        doc: dict[str, Any] = {"command": ["true"], "workdir": str(host.workdir)}
        if output is not None:
            doc["extensions"] = {"dispatch": {"Output": output}}
        requests.append(StartRequest(job_id=JobID(f"01JZ8Q2N5V00000000000000{index}A"),
                                     generation=1, submission=1, attempt=0,
                                     spec=parse_job_document(doc), gate=True))
    text = batch_script([render_start_script(r, settings_) for r in requests],
                        dirs=[d for r in requests for d in start_dirs(r, settings_)])
    ran = host.start(text, {"PATH": f"{host.bin}:{os.environ['PATH']}"}, stdin_mode=True)
    outcomes = parse_batch_output(CommandResult(("/bin/sh", "-s"), ran.returncode,
                                                ran.stdout.decode(), ran.stderr.decode(), 0.1),
                                  3, user="dispatch")
    assert [o.result.returncode for o in outcomes] == [0, 0, 1]
    assert "a-file" in outcomes[2].result.stderr and outcomes[0].result.stderr == ""
    # the batch's mkdir, then the third script's own (its directory is still missing)
    assert (host.record / "processes").read_text().splitlines() == [
        str(host.bin / "mkdir"), str(host.bin / "mkdir")]
    for request in requests[:2]:
        manifest = tmp_path / "out" / request.job_id / "s1.manifest"
        assert json.loads(manifest.read_text())["version"] == 1
    assert (tmp_path / "logs").is_dir()
    assert not list((tmp_path / "out").glob("*/*.tmp"))
