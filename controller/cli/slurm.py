"""The commands that reach Slurm through the configured transport: ``logs`` (a job's
output files on the Slurm host) and ``preflight`` (what the cluster supports)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from typing import Any

from controller.cli.base import EXIT_FAILURE, EXIT_OK, Command, Streams, config_of, open_client
from controller.errors import DispatchError, ErrNotFound
from controller.model.ids import parse_job_id
from controller.model.obs import ObjectRef


def _configure_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="job id")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    parser.add_argument("--stderr", action="store_true", help="the job's stderr")
    parser.add_argument("--submission", type=int, default=None,
                        help="which submission (default: the current one)")


def _logs(args: argparse.Namespace, streams: Streams) -> int:
    from controller import wiring

    job_id = parse_job_id(args.id, field="id")
    config = config_of(args)
    with open_client(config) as client:
        found = client.describe(job_id)
    assert found.job is not None
    number = args.submission or found.job.submission
    sub = {s.submission: s for s in found.submissions}.get(number)
    if sub is None or sub.slurm_job_id is None or sub.slurm_submit is None:
        raise ErrNotFound(f"job {job_id} has no submitted Slurm job for submission {number}")
    cluster = config.cluster_named(sub.cluster or config.default_cluster.name)
    ref = ObjectRef(cluster.name, "dj-" + job_id, sub.slurm_job_id, sub.slurm_submit)

    async def main() -> None:
        runner = wiring.build_runner(cluster)
        adapter = wiring.build_adapter(cluster, runner)
        try:
            async for chunk in adapter.output(ref, "stderr" if args.stderr else "stdout",
                                              follow=args.follow, submission=number):
                text = chunk.decode(errors="replace") if isinstance(chunk, bytes) else chunk
                streams.stdout.write(text)
                streams.stdout.flush()
        finally:
            await runner.close()

    asyncio.run(main())
    return EXIT_OK


def _configure_preflight(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--cluster", action="append", default=None,
                        help="check only this configured cluster (repeatable; default: "
                             "every one)")


def _preflight(args: argparse.Namespace, streams: Streams) -> int:
    """Each configured cluster (or those named) in turn; fails when any lacks what the
    daemon needs or cannot be reached."""
    from controller import wiring
    from controller.config import ClusterEntry
    from controller.slurm.adapter import preflight_problems

    config = config_of(args)
    clusters = ([config.cluster_named(name) for name in args.cluster] if args.cluster
                else list(config.clusters))

    async def check(cluster: ClusterEntry) -> tuple[dict[str, Any], list[str]]:
        runner = wiring.build_runner(cluster)
        try:
            found = await wiring.build_adapter(cluster, runner).preflight()
        except DispatchError as exc:
            return {}, [f"cannot check: {exc}"]
        finally:
            await runner.close()
        return dataclasses.asdict(found), preflight_problems(found)

    results = {cluster.name: asyncio.run(check(cluster)) for cluster in clusters}
    several = len(results) > 1
    if args.output == "json":
        shown = {name: {**caps, "problems": problems}
                 for name, (caps, problems) in results.items()}
        print(json.dumps(shown if several else next(iter(shown.values())), indent=2,
                         sort_keys=True, default=str), file=streams.stdout)
    else:
        for name, (caps, _) in results.items():
            if several:
                print(f"cluster {name}", file=streams.stdout)
            for key, value in caps.items():
                print(f"{'  ' if several else ''}{key:<24} {value}", file=streams.stdout)
    failed = False
    for name, (_, problems) in results.items():
        for problem in problems:  # what the daemon needs and the cluster lacks
            failed = True
            print(f"preflight: {name + ': ' if several else ''}{problem}", file=streams.stderr)
    return EXIT_FAILURE if failed else EXIT_OK


COMMANDS: dict[str, Command] = {
    "logs": Command("print a job's output", _configure_logs, _logs),
    "preflight": Command("check what the Slurm cluster supports", _configure_preflight,
                         _preflight),
}
