"""The job commands: submit, get, describe, hold, release, cancel, wait.

They read and write the database only, through ``controller.client.Client``: the CLI
never polls Slurm per job. ``submit --dry-run`` touches neither the database nor Slurm:
it prints the exact Start script the daemon would run.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from controller.cli.base import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_WARNING,
    Command,
    Handler,
    Streams,
    config_of,
    open_client,
)
from controller.cli.documents import read_job, read_policy
from controller.errors import ErrInvalid
from controller.model.ids import new_job_id, parse_job_id
from controller.model.job import Desired
from controller.model.obs import StartRequest
from controller.slurm.naming import MAX_SUBMISSION
from controller.store import repo
from controller.store.lease import DEFAULT_LEASE

# ---------------------------------------------------------------- submit


def _configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="job document (JSON, or YAML ending .yaml/.yml; - for stdin)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the Start script instead of submitting")
    parser.add_argument("--job-id", metavar="ULID",
                        help="job id to use (default: a new one)")
    parser.add_argument("--submission", metavar="N", default="1",
                        help=f"--dry-run: submission number, 1..{MAX_SUBMISSION} (default 1)")
    parser.add_argument("--attempt", metavar="A", default="0",
                        help="--dry-run: attempt number, >= 0 (default 0)")
    parser.add_argument("--gate", action="store_true",
                        help="--dry-run: submit held (sbatch --hold), as the controller does")
    parser.add_argument("--policy", metavar="FILE",
                        help="recovery policy document (JSON) for this job")
    parser.add_argument("--held", action="store_true",
                        help="write the job with desired state held (release it later)")


def _int_flag(text: str, flag: str, *, minimum: int, maximum: int | None = None) -> int:
    if re.fullmatch(r"0|[1-9][0-9]{0,11}", text) is None:
        raise ErrInvalid("must be a decimal integer", field=flag)
    value = int(text)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ErrInvalid(f"must be {bound}", field=flag)
    return value


def _submit(args: argparse.Namespace, streams: Streams) -> int:
    job_id = parse_job_id(args.job_id, field="--job-id") if args.job_id else new_job_id()
    if args.dry_run:
        submission = _int_flag(args.submission, "--submission", minimum=1,
                               maximum=MAX_SUBMISSION)
        attempt = _int_flag(args.attempt, "--attempt", minimum=0)
    config = config_of(args)
    job = read_job(args.file, streams)
    if args.dry_run:
        request = StartRequest(job_id=job_id, generation=1, submission=submission,
                               attempt=attempt, spec=job.spec, gate=args.gate)
        from controller import wiring

        cluster = (config.cluster_named(job.spec.clusters[0]) if job.spec.clusters
                   else config.default_cluster)
        streams.stdout.write(wiring.render_start(cluster, request))
        return EXIT_OK
    policy = read_policy(args.policy) if args.policy else None
    with open_client(config) as client:
        client.submit(job, job_id=job_id, policy=policy, held=args.held)
    print(job_id, file=streams.stdout)
    return EXIT_OK


# ---------------------------------------------------------------- get, describe


def _configure_get(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="one job id (default: all jobs)")
    parser.add_argument("-l", "--selector", help="label selector, k=v[,k=v]")
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")
    parser.add_argument("--unowned", action="store_true",
                        help="list the dj- Slurm jobs whose id this database never had (a "
                             "neighbouring deployment's on the same Slurm account): never "
                             "written by this one")


def _age(now: float, then: int) -> str:
    secs = max(0, int(now - then)) if then else 0
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _table(headers: list[str], rows: list[list[str]], streams: Streams) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(),
              file=streams.stdout)


def _get_unowned(args: argparse.Namespace, streams: Streams) -> int:
    if args.id or args.selector:
        raise ErrInvalid("--unowned lists Slurm jobs, not this database's: no ID or -l",
                         field="unowned")
    with open_client(config_of(args)) as client:
        found = client.unowned()
    if args.output == "json":
        print(json.dumps({"items": found}, indent=2, sort_keys=True), file=streams.stdout)
        return EXIT_OK
    now = time.time()
    _table(["CLUSTER", "SLURM-ID", "NAME", "STATE", "SEEN"],
           [[u["cluster"], str(u["slurm_job_id"]), u["name"], u["state"],
             _age(now, u["seen_at"]) + " ago"] for u in found], streams)
    return EXIT_OK


def _get(args: argparse.Namespace, streams: Streams) -> int:
    if args.unowned:
        return _get_unowned(args, streams)
    selector = repo.parse_selector(args.selector) if args.selector else None
    with open_client(config_of(args)) as client:
        views = client.views(job_id=args.id, selector=selector)
    if args.output == "json":
        objs = [v.to_json() for v in views]
        out: Any = objs[0] if args.id else {"items": objs}
        print(json.dumps(out, indent=2, sort_keys=True), file=streams.stdout)
        return EXIT_OK
    now = time.time()
    headers = ["ID", "PHASE", "CLUSTER", "ATTEMPT", "SUBMISSION", "SLURM-ID", "CAUSE", "AGE"]
    if args.output == "wide":
        headers += ["STATE", "NODES", "REASON", "DESIRED"]
    rows = []
    for v in views:
        row = [v.id, v.phase, v.cluster or "-", str(v.attempt), str(v.submission),
               str(v.slurm_job_id or "-"), v.cause or "-", _age(now, v.created_at)]
        if args.output == "wide":
            row += [v.object_state or "-", v.nodes or "-", v.reason or "-", v.desired]
        rows.append(row)
    _table(headers, rows, streams)
    return EXIT_OK


def _configure_describe(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="job id (none: only the leader lease)")


def _ts(epoch: int | None) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _describe(args: argparse.Namespace, streams: Streams) -> int:
    with open_client(config_of(args)) as client:
        found = client.describe(args.id)
    out = streams.stdout
    if not found.leases:
        print("Leader:      - (no daemon has taken the lease yet)", file=out)
    for lease in found.leases:  # one per shard: "controller" is the default cluster's
        left = lease.expires_at - time.time()
        shard = "" if lease.name == DEFAULT_LEASE else f" [{lease.name}]"
        print(f"Leader:      {lease.holder} (epoch {lease.epoch}, "
              + (f"expires in {left:.0f}s)" if left > 0 else f"expired {-left:.0f}s ago)")
              + shard, file=out)
    view = found.job
    if view is None:
        if found.unowned:
            print(f"Unowned:     {found.unowned} dj- Slurm job(s) of ids this database never "
                  "had (a neighbouring deployment's; never written): dispatchctl get "
                  "--unowned", file=out)
        return EXIT_OK
    print(f"ID:          {view.id}", file=out)
    print(f"Phase:       {view.phase}", file=out)
    print(f"Cluster:     {view.cluster or '- (not placed yet)'}", file=out)
    print(f"Desired:     {view.desired} (generation {view.generation})", file=out)
    print(f"Labels:      {','.join(f'{k}={v}' for k, v in sorted(view.labels.items())) or '-'}",
          file=out)
    print(f"Attempt:     {view.attempt}", file=out)
    print(f"Slurm job:   {view.slurm_job_id or '-'} ({view.object_state or '-'})", file=out)
    cause = f"{view.cause or '-'} {view.cause_detail}".strip()
    print(f"Cause:       {cause}" + (f" (exit {view.exit_code})"
                                     if view.exit_code is not None else ""), file=out)
    print("Conditions:", file=out)
    for c in view.conditions or []:
        print(f"  {c['type']:<18} {c['status']!s:<6} {c['reason']:<16} "
              f"since {_ts(c['since'])}  {c['message']}", file=out)
    print("Submissions:", file=out)
    print(f"  {'N':>3} {'ATTEMPT':>7} {'CLUSTER':<12} {'SLURM-ID':>9} {'STATUS':<10} "
          f"{'STATE':<9} {'CAUSE':<14} {'EXIT':>4} NODES", file=out)
    for s in found.submissions:
        print(f"  {s.submission:>3} {s.attempt:>7} {s.cluster or '-':<12} "
              f"{s.slurm_job_id or '-':>9} {s.status:<10} "
              f"{s.state or '-':<9} {s.cause or '-':<14} "
              f"{'-' if s.exit_code is None else s.exit_code:>4} {s.nodes or '-'}", file=out)
    print("Events:", file=out)
    for e in found.events:
        print(f"  {_ts(e.at)}  {e.kind:<14} {e.message}", file=out)
    return EXIT_OK


# ---------------------------------------------------------------- hold, release, cancel


def _configure_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="job id")
    parser.add_argument("-l", "--selector", help="label selector, k=v[,k=v] (bulk)")


def _set_desired(desired: Desired) -> Handler:
    def handler(args: argparse.Namespace, streams: Streams) -> int:
        if bool(args.id) == bool(args.selector):
            raise ErrInvalid("give exactly one of ID or -l SELECTOR", field="target")
        selector = repo.parse_selector(args.selector) if args.selector else None
        if selector is not None and not selector:
            raise ErrInvalid("must not be empty", field="selector")
        with open_client(config_of(args)) as client:
            if selector is None:
                client.set_desired(args.id, desired)
                changed = 1
            else:
                changed = client.set_desired_selector(selector, desired)
        print(f"{changed} job(s) set to {desired.value}", file=streams.stdout)
        return EXIT_OK
    return handler


# ---------------------------------------------------------------- wait


def _configure_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="job id")
    parser.add_argument("--timeout", type=float, default=None, help="seconds (default: none)")
    parser.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)


# exit status: 0 succeeded; 3 failed with a warning; 1 any other ending (failed,
# cancelled, rejected) or a timeout
_WAIT_EXIT: dict[tuple[str, bool], int] = {
    ("succeeded", False): EXIT_OK,
    ("failed", True): EXIT_WARNING,
}


def _wait(args: argparse.Namespace, streams: Streams) -> int:
    job_id = parse_job_id(args.id, field="id")
    live = streams.stderr.isatty()

    def progress(view: dict[str, Any]) -> None:
        line = (f"{view['id']} {view['phase']} attempt={view['attempt']} "
                f"slurm={view['slurm_job_id'] or '-'} state={view['object_state'] or '-'}")
        if live:
            print("\r\x1b[2K" + line, end="", file=streams.stderr, flush=True)
        else:
            print(line, file=streams.stderr)

    with open_client(config_of(args)) as client:
        try:
            view = client.wait(job_id, timeout=args.timeout, poll_s=args.poll,
                               on_change=progress)
        except TimeoutError as exc:
            print(f"\ndispatchctl: {exc}" if live else f"dispatchctl: {exc}",
                  file=streams.stderr)
            return EXIT_FAILURE
    if live:
        print(file=streams.stderr)
    print(json.dumps({k: view[k] for k in ("id", "phase", "cause", "exit_code", "attempt",
                                           "warning")},
                     sort_keys=True), file=streams.stdout)
    return _WAIT_EXIT.get((view["phase"], bool(view.get("warning"))), EXIT_FAILURE)


COMMANDS: dict[str, Command] = {
    "submit": Command("validate a job document and write it for the daemon "
                      "(--dry-run prints the Start script instead)", _configure_submit,
                      _submit),
    "get": Command("list jobs, or show one", _configure_get, _get),
    "describe": Command("show a job's conditions, submissions and events",
                        _configure_describe, _describe),
    "hold": Command("hold jobs (gated or pending ones stay queued)", _configure_target,
                    _set_desired(Desired.HELD)),
    "release": Command("release held jobs", _configure_target, _set_desired(Desired.RUN)),
    "cancel": Command("stop jobs (cancels their Slurm jobs)", _configure_target,
                      _set_desired(Desired.STOPPED)),
    "wait": Command("wait until a job ends; exit 0 only if it succeeded", _configure_wait,
                    _wait),
}
