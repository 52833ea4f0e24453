"""bench/workflows (issue 20): the same Snakemake workflows run by
``snakemake-executor-plugin-slurm`` and by this repository's ``dispatch`` executor on the
same real Slurm (the host's 22.05), one plugin after the other, K workflows at once:

* ``clean``: every Snakemake runs to its end;
* ``killed``: every Snakemake is SIGKILLed once, half-way (half of its jobs started),
  then unlocked and started again, and runs to its end.

Per plugin and mode it prints the wall time, slurmctld RPCs of the job user per job
(``sdiag``, before and after), Slurm commands per job (the plugin's own, through shims
first on its PATH -- the slurm plugin's jobs inherit that PATH, so their ``srun`` counts
too -- plus, for dispatch, the daemon's ``dispatch_slurm_commands_total``), jobs wrongly
reported (Snakemake's errors for jobs that worked, and workflows reported done with an
output missing) and re-runs (executions of a job's command beyond its first, from the
``starts.log`` line every job's command writes first). With ``--runs K`` each figure is
min / median / max.

Run as root with the cluster up (``scripts/slurm-up``); the job user ``dispatch`` runs
Snakemake (from ``.venv-jobs``, which must have the slurm plugin for ``slurm``:
``.venv-jobs/bin/pip install 'snakemake-executor-plugin-slurm>=2,<3'``). The dispatch
daemon runs on a SQLite file with its default 5 s tick. ``--smoke`` is the small size the
test command runs (``tests/test_bench_cluster.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
JOBS_VENV = ROOT / ".venv-jobs"
DISPATCHCTL = str(Path(sys.executable).parent / "dispatchctl")
USER = "dispatch"
BASE = Path("/tmp/dispatch-bench-workflows")
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr",
                  "srun", "sstat", "sshare")
PLUGINS = ("slurm", "dispatch")
MODES = ("clean", "killed")

SNAKEFILE = """
N = {work}

rule all:
    input: "merged.txt"

rule work:
    output: "work/{{i}}.txt"
    shell:
        "echo work-{{wildcards.i}} >> starts.log; sleep {sleep}; echo {{wildcards.i}} > {{output}}"

rule merge:
    input: expand("work/{{i}}.txt", i=range(N))
    output: "merged.txt"
    shell: "echo merge >> starts.log; cat {{input}} > {{output}}"
"""


@dataclass
class Figures:
    plugin: str
    mode: str
    jobs: int
    wall_s: float
    rpcs: int
    commands: int
    wrong: int
    reruns: int

    def row(self) -> list[str]:
        return [self.plugin, self.mode, f"{self.wall_s:.1f}", f"{self.rpcs / self.jobs:.2f}",
                f"{self.commands / self.jobs:.2f}", str(self.wrong), str(self.reruns)]


HEADER = ["plugin", "mode", "wall s", "RPCs/job", "Slurm cmds/job", "wrongly reported",
          "re-runs"]


# ---------------------------------------------------------------- the job user, Slurm


def chown(path: Path) -> None:
    entry = pwd.getpwnam(USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def as_user(argv: Sequence[str], *, cwd: Path, path_prefix: Path, log: Path,
            ) -> subprocess.Popen[bytes]:
    entry = pwd.getpwnam(USER)
    env = {"HOME": entry.pw_dir, "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8",
           "PATH": f"{path_prefix}:{JOBS_VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    with log.open("ab") as handle:
        return subprocess.Popen(list(argv), cwd=str(cwd), env=env, user=USER, group=USER,
                                extra_groups=[], stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)


def user_rpcs() -> int:
    """slurmctld's RPC count of the job user so far (``sdiag``, by user)."""
    out = subprocess.run(["sdiag"], check=True, capture_output=True, text=True).stdout
    section = out.split("Remote Procedure Call statistics by user", 1)[1]
    match = re.search(rf"^\s*{USER}\s+\(\s*\d+\)\s+count:(\d+)", section, re.M)
    return int(match.group(1)) if match else 0


def drain() -> None:
    subprocess.run(["scancel", "-u", USER], check=False, capture_output=True)
    wait(lambda: not subprocess.run(["squeue", "-h", "-u", USER, "-t", "PD,R,CG,S"],
                                    check=False, capture_output=True, text=True).stdout.strip(),
         timeout=120, what="the job user's jobs to leave the queue")


def wait(predicate: Callable[[], bool], *, timeout: float, what: str,
         interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def shims(directory: Path, log: Path) -> Path:
    """Scripts named like the Slurm commands that log their name, then exec the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in SLURM_COMMANDS:
        real = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if real is None:
            continue
        shim = directory / name
        shim.write_text(f'#!/bin/sh\necho {name} >> {log}\nexec {real} "$@"\n')
        shim.chmod(0o755)
    log.touch()
    log.chmod(0o666)
    return directory


# ---------------------------------------------------------------- the dispatch daemon


class Daemon:
    def __init__(self, work: Path) -> None:
        directory = work / "db"
        directory.mkdir()
        chown(directory)
        (work / "output").mkdir()
        chown(work / "output")
        self.url = f"sqlite:///{directory / 'dispatch.db'}"
        env = {**os.environ, "DISPATCH_DATABASE_URL": self.url}
        subprocess.run([DISPATCHCTL, "migrate"], check=True, capture_output=True, env=env)
        for path in directory.iterdir():
            chown(path)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        config = work / "daemon.toml"
        config.write_text(f"""
[cluster]
name = "lab"
[transport]
kind = "local"
run_as = "{USER}"
[output]
dir = "{work / 'output'}"
[database]
url = "{self.url}"
[daemon]
metrics_port = {self.port}
""")
        with (work / "daemon.log").open("ab") as handle:
            self.proc = subprocess.Popen([DISPATCHCTL, "run", "--config", str(config)],
                                         stdout=handle, stderr=subprocess.STDOUT)
        wait(lambda: self.metric_total("dispatch_leader") >= 0, timeout=60,
             what="the daemon's metrics")

    def metric_total(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return -1.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + "{", name + " ")))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- one phase


def snakemake_argv(plugin: str, daemon: Daemon | None, jobs: int,
                   status_s: float | None) -> list[str]:
    argv = [str(JOBS_VENV / "bin" / "snakemake"), "--executor", plugin, "--jobs", str(jobs),
            "--latency-wait", "10"]
    if status_s is not None:
        argv += ["--seconds-between-status-checks", f"{status_s:g}"]
    if daemon is not None:
        argv += ["--dispatch-database-url", daemon.url]
    return argv


def phase(plugin: str, mode: str, *, workflows: int, jobs: int, sleep: float,
          base: Path, status_s: float | None = None) -> Figures:
    drain()
    work = base / f"{plugin}-{mode}"
    work.mkdir(parents=True)
    os.chmod(work, 0o755)
    command_log = work / "commands.log"
    shim_dir = shims(work / "shims", command_log)
    daemon = Daemon(work) if plugin == "dispatch" else None
    dirs = []
    for index in range(workflows):
        wf = work / f"wf{index}"
        wf.mkdir()
        (wf / "Snakefile").write_text(SNAKEFILE.format(work=jobs - 1, sleep=sleep))
        chown(wf)
        chown(wf / "Snakefile")
        dirs.append(wf)
    argv = snakemake_argv(plugin, daemon, jobs, status_s)
    rpcs0 = user_rpcs()
    commands0 = daemon.metric_total("dispatch_slurm_commands_total") if daemon else 0.0
    started = time.monotonic()
    procs = {wf: as_user(argv, cwd=wf, path_prefix=shim_dir, log=wf / "snakemake.log")
             for wf in dirs}
    if mode == "killed":
        half = jobs // 2
        pending = set(dirs)
        deadline = time.monotonic() + 60 + jobs * sleep * 4
        while pending and time.monotonic() < deadline:
            for wf in sorted(pending):
                log = wf / "starts.log"
                if log.exists() and len(log.read_text().splitlines()) >= half:
                    os.killpg(procs[wf].pid, signal.SIGKILL)
                    procs[wf].wait()
                    unlock = as_user([*argv, "--unlock"], cwd=wf, path_prefix=shim_dir,
                                     log=wf / "snakemake.log")
                    unlock.wait(timeout=120)
                    procs[wf] = as_user(argv, cwd=wf, path_prefix=shim_dir,
                                        log=wf / "snakemake.log")
                    pending.discard(wf)
            time.sleep(0.2)
        if pending:
            raise TimeoutError(f"{len(pending)} workflows never got half-way")
    codes = {wf: proc.wait(timeout=1800) for wf, proc in procs.items()}
    wall = time.monotonic() - started
    rpcs = user_rpcs() - rpcs0
    commands = len(command_log.read_text().splitlines())
    if daemon is not None:
        commands += int(daemon.metric_total("dispatch_slurm_commands_total") - commands0)
        daemon.stop()
    wrong = reruns = 0
    for wf, code in codes.items():
        text = (wf / "snakemake.log").read_text(errors="replace")
        wrong += text.count("Error in rule ")
        if code == 0 and not (wf / "merged.txt").exists():
            wrong += 1
        if code != 0:
            print(f"  {plugin} {mode}: {wf.name} exited {code} (see {wf / 'snakemake.log'})",
                  flush=True)
        log = wf / "starts.log"
        starts = log.read_text().splitlines() if log.exists() else []
        reruns += len(starts) - len(set(starts))
    return Figures(plugin, mode, workflows * jobs, wall, rpcs, commands, wrong, reruns)


# ---------------------------------------------------------------- output


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in rows)


def spread(values: Sequence[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return "/".join(format(v, fmt) for v in (min(values), statistics.median(values),
                                             max(values)))


def summary(runs: list[list[Figures]]) -> str:
    rows = [HEADER]
    keyed: dict[tuple[str, str], list[Figures]] = {}
    for run in runs:
        for fig in run:
            keyed.setdefault((fig.plugin, fig.mode), []).append(fig)
    for (plugin, mode), figs in keyed.items():
        rows.append([plugin, mode, spread([f.wall_s for f in figs], ".1f"),
                     spread([f.rpcs / f.jobs for f in figs], ".2f"),
                     spread([f.commands / f.jobs for f in figs], ".2f"),
                     spread([float(f.wrong) for f in figs], ".0f"),
                     spread([float(f.reruns) for f in figs], ".0f")])
    lines = [table(rows)]
    for mode in MODES:
        slurm, ours = keyed.get(("slurm", mode)), keyed.get(("dispatch", mode))
        if slurm and ours:
            ratio = (statistics.median([f.rpcs / f.jobs for f in ours])
                     / max(statistics.median([f.rpcs / f.jobs for f in slurm]), 1e-9))
            lines.append(f"{mode}: RPCs per job, dispatch / slurm plugin (medians): {ratio:.2f}")
            lines.append(f"{mode}: re-runs, dispatch vs slurm plugin (medians): "
                         f"{statistics.median([f.reruns for f in ours]):.0f} vs "
                         f"{statistics.median([f.reruns for f in slurm]):.0f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=None, help="concurrent workflows "
                        "(default 8; --smoke 2)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per workflow, the "
                        "fan-in included (default 40; --smoke 6)")
    parser.add_argument("--sleep", type=float, default=None, help="seconds each job sleeps "
                        "(default 2)")
    parser.add_argument("--status-interval", type=float, default=None,
                        help="Snakemake's --seconds-between-status-checks (default: each "
                        "plugin's own; --smoke 2)")
    parser.add_argument("--runs", type=int, default=1, help="whole runs (min/median/max)")
    parser.add_argument("--plugins", default=",".join(PLUGINS),
                        help="comma list of slurm, dispatch (default both)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of clean, killed")
    parser.add_argument("--smoke", action="store_true", help="the small size (test command)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the workflow directories")
    args = parser.parse_args(argv)
    workflows = args.workflows or (2 if args.smoke else 8)
    jobs = args.jobs or (6 if args.smoke else 40)
    sleep = args.sleep if args.sleep is not None else 2.0
    status_s = args.status_interval if args.status_interval is not None else (
        2.0 if args.smoke else None)
    plugins = [p for p in args.plugins.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    phases = [(p, m) for p in plugins for m in modes]
    if args.smoke:
        # the test command's size: the slurm plugin waits 40 s before its first status
        # read and two minutes per phase even this small, so it is the full size's
        phases = [ph for ph in phases if ph[0] == "dispatch"]
    if not (JOBS_VENV / "bin" / "snakemake").exists():
        parser.error(f"{JOBS_VENV} has no snakemake (scripts/test builds it)")
    if any(plugin == "slurm" for plugin, _ in phases) and not list(JOBS_VENV.glob(
            "lib/python3*/site-packages/snakemake_executor_plugin_slurm")):
        parser.error(f"{JOBS_VENV} has no snakemake-executor-plugin-slurm: "
                     f"{JOBS_VENV}/bin/pip install 'snakemake-executor-plugin-slurm>=2,<3'")
    BASE.mkdir(exist_ok=True)
    os.chmod(BASE, 0o755)
    base = BASE / uuid.uuid4().hex[:8]
    print(f"bench/workflows: {workflows} workflows x {jobs} jobs (sleep {sleep:g} s), "
          f"phases {', '.join(f'{p} {m}' for p, m in phases)}, {args.runs} run(s); "
          f"in {base}", flush=True)
    runs: list[list[Figures]] = []
    try:
        for number in range(args.runs):
            run = []
            for plugin, mode in phases:
                fig = phase(plugin, mode, workflows=workflows, jobs=jobs, sleep=sleep,
                            base=base / f"run{number}", status_s=status_s)
                print(f"  run {number + 1}: " + "  ".join(
                    f"{h}={v}" for h, v in zip(HEADER, fig.row(), strict=True)), flush=True)
                run.append(fig)
            runs.append(run)
    finally:
        drain()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(summary(runs))
    if args.json:
        args.json.write_text(json.dumps([[asdict(f) for f in run] for run in runs], indent=2))
    bad = [f for run in runs for f in run if f.wrong or (f.plugin == "dispatch" and f.reruns)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
