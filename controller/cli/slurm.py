"""The commands that reach Slurm through the configured transport: ``logs`` (a job's
output files on the Slurm host), ``preflight`` (what the cluster supports) and ``owner``
(the deployment's ownership marker on each cluster)."""

from __future__ import annotations

import argparse
import asyncio
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

    config = config_of(args)
    clusters = ([config.cluster_named(name) for name in args.cluster] if args.cluster
                else list(config.clusters))

    async def check(cluster: ClusterEntry) -> tuple[dict[str, Any], list[str]]:
        runner = wiring.build_runner(cluster)
        try:
            return await wiring.build_adapter(cluster, runner).preflight_report()
        except DispatchError as exc:
            return {}, [f"cannot check: {exc}"]
        finally:
            await runner.close()

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


def _configure_owner(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", action="append", default=None,
                        help="only this configured cluster (repeatable; default: every one)")
    parser.add_argument("--take", action="store_true",
                        help="make this database the owner of the cluster's jobs (after "
                             "the other database that carries this deployment's id was "
                             "stopped): a new token, in the database, then in the marker")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def _owner(args: argparse.Namespace, streams: Streams) -> int:
    """Show (or ``--take``) each cluster's ownership marker against this database's
    claim; exit 1 when any cluster is in conflict and not taken."""
    from controller import wiring
    from controller.config import ClusterEntry
    from controller.reconcile.ownership import new_token
    from controller.reconcile.plan import ClaimStep, claim

    config = config_of(args)
    clusters = ([config.cluster_named(name) for name in args.cluster] if args.cluster
                else list(config.clusters))
    with open_client(config) as client:
        deployment, rows = client.claims()
        if args.take:
            taken = {cluster.name: new_token() for cluster in clusters}
            for name, token in taken.items():
                deployment = client.take_claim(name, token)
            deployment, rows = client.claims()
    claims = {row.cluster: row for row in rows}

    async def look(cluster: ClusterEntry) -> dict[str, Any]:
        row = claims.get(cluster.name)
        found: dict[str, Any] = {"cluster": cluster.name, "deployment": deployment,
                                 "token": row.token if row else None, "marker": None}
        if deployment is None:
            return {**found, "state": "unclaimed"}
        runner = wiring.build_runner(cluster)
        try:
            adapter = wiring.build_adapter(cluster, runner)
            if args.take and row is not None:
                await adapter.set_owner_marker(deployment, row.token)
            found["marker"] = await adapter.owner_marker(deployment)
        finally:
            await runner.close()
        step = claim(found["marker"], found["token"], row.previous if row else None,
                     takeover=False)
        state = {ClaimStep.KEEP: "owned", ClaimStep.RESUME: "owned (rotation pending)",
                 ClaimStep.MARK: "unclaimed", ClaimStep.CONFLICT: "CONFLICT",
                 ClaimStep.ROTATE: "owned"}[step]
        return {**found, "state": state}

    results = [asyncio.run(look(cluster)) for cluster in clusters]
    if args.output == "json":
        print(json.dumps(results, indent=2, sort_keys=True), file=streams.stdout)
    else:
        print(f"deployment {deployment or '- (no leader has claimed a cluster yet)'}",
              file=streams.stdout)
        for found in results:
            print(f"  {found['cluster']:<16} {found['state']:<26} marker "
                  f"{found['marker'] or '-'}  database {found['token'] or '-'}",
                  file=streams.stdout)
    conflicts = [found["cluster"] for found in results if found["state"] == "CONFLICT"]
    for name in conflicts:
        print(f"owner: {name}: another database with this deployment's id wrote the "
              "marker; stop one of the two, then `dispatchctl owner --take` where the "
              "jobs belong", file=streams.stderr)
    return EXIT_FAILURE if conflicts else EXIT_OK


COMMANDS: dict[str, Command] = {
    "logs": Command("print a job's output", _configure_logs, _logs),
    "preflight": Command("check what each cluster (Slurm or Grid Engine) supports",
                         _configure_preflight, _preflight),
    "owner": Command("show (or --take) which database owns each cluster's jobs",
                     _configure_owner, _owner),
}
