"""bench/burst/starts.py: the pace of Start through ``SlurmAdapter`` alone (no database,
no daemon) against a raw ``sbatch --hold`` loop measured in the same run, on the real
cluster of ``scripts/slurm-up`` (the host's 22.05, transport local as ``dispatch``).

Each round: N gated Starts issued together (``asyncio.gather``, as a tick issues a slice
of Submits), so the adapter cuts them into Start batches of ``start_batch`` scripts with
``start_parallel`` calls in flight; then the same N as one raw shell loop of
``sbatch --hold --wrap true``. The jobs are cancelled after each part. Rounds alternate
the two, so drift in slurmctld's pace (its table of ended jobs grows) hits both alike.
``--against REV`` also times the adapter of ``git archive REV`` (in a subprocess of this
script run on that tree) in the same rounds, and prints the ratio.

    flock /tmp/dispatch-cluster.lock .venv/bin/python bench/burst/starts.py
    flock /tmp/dispatch-cluster.lock .venv/bin/python bench/burst/starts.py --against HEAD~1

Figures: jobs/s of each part per round, then medians and ratios (adapter / raw loop).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ulid import ULID

ROOT = Path(__file__).resolve().parents[2]
USER = "dispatch"
OUTPUT_DIR = "~/.dispatch/bench-starts"


def raw_loop(n: int) -> float:
    from run import as_user  # bench/burst/run.py's helpers (see main)

    text = f"for i in $(seq {n}); do sbatch --hold --parsable --wrap true >/dev/null; done"
    began = time.monotonic()
    done = as_user(USER, "sh", "-c", text, check=False, timeout=600)
    took = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"raw loop failed: {done.stderr[-300:]}")
    return n / took


async def _adapter_starts(n: int, batch: int | None, parallel: int | None) -> float:
    # imported here: with --against, the subprocess imports the other tree's controller
    from controller.model.obs import StartRequest
    from controller.model.spec import parse_job_document
    from controller.runner.local import LocalRunner
    from controller.slurm.adapter import SlurmAdapter
    from controller.slurm.script import StartSettings

    runner = LocalRunner(run_as=USER, default_timeout=120)
    settings = StartSettings(output_dir=OUTPUT_DIR)
    probe = SlurmAdapter(runner, cluster="lab", settings=settings, user=USER,
                         command_timeout=120)
    caps = await probe.preflight()
    sizes = {k: v for k, v in (("start_batch", batch), ("start_parallel", parallel))
             if v is not None}  # else the adapter's own defaults
    adapter = SlurmAdapter(runner, cluster="lab", settings=settings, user=USER,
                           command_timeout=120, capabilities=caps, **sizes)
    spec = parse_job_document({"command": ["true"], "workdir": "/tmp"})
    requests = [StartRequest(job_id=str(ULID()), generation=1, submission=1, attempt=0,
                             spec=spec, gate=True) for _ in range(n)]
    try:
        began = time.monotonic()
        refs = await asyncio.gather(*(adapter.start(r) for r in requests))
        took = time.monotonic() - began
    finally:
        await runner.close()
    if len({ref.id for ref in refs}) != n:
        raise SystemExit("the adapter returned fewer distinct refs than Starts")
    return n / took


def adapter_rate(n: int, batch: int | None, parallel: int | None, tree: Path | None) -> float:
    if tree is None:
        return asyncio.run(_adapter_starts(n, batch, parallel))
    sizes = [*(["--batch", str(batch)] if batch is not None else []),
             *(["--parallel", str(parallel)] if parallel is not None else [])]
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--one", str(n), *sizes],
        env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, capture_output=True,
        text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the adapter of {tree} failed: {done.stderr[-800:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=256, help="Starts per round (256)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--batch", type=int, help="start_batch (the adapter's default)")
    parser.add_argument("--parallel", type=int,
                        help="start_parallel (the adapter's default)")
    parser.add_argument("--against", metavar="REV", help="also time git archive REV")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the subprocess part
    args = parser.parse_args()
    if args.one:
        print(json.dumps({"rate": asyncio.run(_adapter_starts(args.one, args.batch,
                                                              args.parallel))}))
        return 0
    # Imported here, not above: run.py puts this tree first on sys.path, and the --one
    # subprocess of --against must import the other tree's controller.
    from run import cancel_all, live_jobs, show_config, wait_for_room

    if live_jobs(USER):
        raise SystemExit("user dispatch has live jobs: someone is using the cluster")
    slurm_config = show_config()
    max_jobs = int(slurm_config.get("MaxJobCount", "10000").split()[0])
    min_job_age = int(slurm_config.get("MinJobAge", "300 sec").split()[0])
    with tempfile.TemporaryDirectory(prefix="bench-starts-") as tmp:
        other: Path | None = None
        if args.against:
            other = Path(tmp) / "tree"
            other.mkdir()
            archive = subprocess.run(["git", "archive", args.against], cwd=ROOT,
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(other)], input=archive, check=True)
        rows: dict[str, list[float]] = {"raw": [], "adapter": []}
        if other is not None:
            rows[f"adapter@{args.against}"] = []
        for index in range(args.rounds):
            figures = {}
            for part, values in rows.items():
                cancel_all(USER)
                wait_for_room(args.jobs, max_jobs, min_job_age)
                if part == "raw":
                    rate = raw_loop(args.jobs)
                else:
                    tree = other if part != "adapter" else None
                    rate = adapter_rate(args.jobs, args.batch, args.parallel, tree)
                values.append(rate)
                figures[part] = f"{rate:.1f}"
            print(f"round {index + 1}: " + ", ".join(f"{k} {v} jobs/s"
                                                   for k, v in figures.items()), flush=True)
        cancel_all(USER)
    from controller.slurm.adapter import SlurmAdapter

    defaults = inspect.signature(SlurmAdapter).parameters
    batch = args.batch or defaults["start_batch"].default
    parallel = args.parallel or defaults["start_parallel"].default
    raw = statistics.median(rows["raw"])
    print(f"\n{args.jobs} gated Starts per round, start_batch {batch}, "
          f"start_parallel {parallel}, {args.rounds} rounds (medians)")
    for part, values in rows.items():
        med = statistics.median(values)
        print(f"  {part:<24} {med:7.1f} jobs/s = {med / raw:.2f}x the raw sbatch --hold loop"
              f" (rounds: {', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
