"""The controller-side rows of ``dispatchctl``: run, migrate, submit, get, describe, hold,
release, cancel, logs, wait, preflight.

Every command except ``run``, ``logs`` and ``preflight`` reads or writes the database
only: the CLI never polls Slurm per job. ``logs`` reads the job's output files on
the Slurm host through the configured transport; ``preflight`` asks Slurm what it can do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from dataclasses import asdict
from typing import Any

from controller.cli import (
    EXIT_FAILURE,
    EXIT_OK,
    Command,
    Streams,
    _config,
    read_document,
    secret_looking_env,
)
from controller.client import TERMINAL, Client
from controller.errors import ErrInvalid, ErrNotFound
from controller.model.ids import new_job_id, parse_job_id
from controller.model.job import Desired
from controller.model.obs import ObjectRef
from controller.model.spec import parse_job_document
from controller.store import repo
from controller.store.db import redact_url
from controller.store.lease import read_lease


def _client(args: argparse.Namespace) -> Client:
    return Client(_config(args).database.url)


def _store_ready(client: Client) -> None:
    if client.store.current_revision() is None:
        raise ErrInvalid("the database has no schema yet: run 'dispatchctl migrate' first",
                         field="database")


# ---------------------------------------------------------------- submit


def submit_document(args: argparse.Namespace, streams: Streams) -> int:
    doc = read_document(args.file)
    spec = parse_job_document(doc)
    assert isinstance(doc, dict)
    for name in secret_looking_env(spec):
        streams.warn(f"env.{name} looks like a secret; env values are stored in the job "
                     "script by slurmctld")
    policy = None
    if args.policy:
        raw = read_document(args.policy)
        if not isinstance(raw, dict):
            raise ErrInvalid("must be a JSON object", field=args.policy)
        policy = raw
    job_id = parse_job_id(args.job_id, field="--job-id") if args.job_id else new_job_id()
    client = _client(args)
    try:
        _store_ready(client)
        client.submit(doc, job_id=job_id, policy=policy, held=args.held)
    finally:
        client.close()
    print(job_id, file=streams.stdout)
    return EXIT_OK


# ---------------------------------------------------------------- run, migrate


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--migrate", action="store_true",
                        help="upgrade the database schema before starting")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def _run(args: argparse.Namespace, streams: Streams) -> int:
    from controller.daemon.service import Daemon
    from controller.wiring import build_all, setup_logging

    setup_logging(args.log_level)
    config = _config(args)
    parts = build_all(config)
    store = parts["store"]
    if args.migrate:
        store.migrate()
    elif store.current_revision() is None:
        raise ErrInvalid("the database has no schema yet: run 'dispatchctl migrate' first "
                         "(or 'dispatchctl run --migrate')", field="database")
    adapter = parts["adapter"]

    async def preflight() -> list[str]:
        from controller.slurm.adapter import preflight_problems

        caps = await adapter.preflight()
        logging.getLogger("dispatch.preflight").info(
            "preflight: what the cluster supports", extra={"capabilities": asdict(caps)})
        return preflight_problems(caps)

    daemon = Daemon(config, store=store, adapter=adapter, metrics=parts["metrics"],
                    lease=parts["lease"], preflight=preflight)

    async def main() -> None:
        try:
            await daemon.run()
        finally:
            await parts["runner"].close()

    asyncio.run(main())
    return EXIT_OK


def _configure_migrate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revision", default="head", help="target revision (default head)")


def _migrate(args: argparse.Namespace, streams: Streams) -> int:
    from controller.store.db import Store

    config = _config(args)
    store = Store(config.database.url)
    try:
        store.migrate(args.revision)
        print(f"database {redact_url(config.database.url)} at revision "
              f"{store.current_revision()}", file=streams.stdout)
    finally:
        store.dispose()
    return EXIT_OK


# ---------------------------------------------------------------- get, describe


def _configure_get(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="one job id (default: all jobs)")
    parser.add_argument("-l", "--selector", help="label selector, k=v[,k=v]")
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")


def _age(now: float, then: int) -> str:
    secs = max(0, int(now - then)) if then else 0
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _get(args: argparse.Namespace, streams: Streams) -> int:
    selector = repo.parse_selector(args.selector) if args.selector else None
    client = _client(args)
    try:
        _store_ready(client)
        with client.store.transaction() as tx:
            views = repo.list_jobs(tx, job_id=args.id, selector=selector)
    finally:
        client.close()
    if args.output == "json":
        objs = [v.to_json() for v in views]
        out: Any = objs[0] if args.id else {"items": objs}
        print(json.dumps(out, indent=2, sort_keys=True), file=streams.stdout)
        return EXIT_OK
    now = time.time()
    headers = ["ID", "PHASE", "ATTEMPT", "SUBMISSION", "SLURM-ID", "CAUSE", "AGE"]
    if args.output == "wide":
        headers += ["STATE", "NODES", "REASON", "DESIRED"]
    rows = []
    for v in views:
        row = [v.id, v.phase, str(v.attempt), str(v.submission),
               str(v.slurm_job_id or "-"), v.cause or "-", _age(now, v.created_at)]
        if args.output == "wide":
            row += [v.object_state or "-", v.nodes or "-", v.reason or "-", v.desired]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(),
              file=streams.stdout)
    return EXIT_OK


def _configure_describe(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="job id (none: only the leader lease)")


def _ts(epoch: int | None) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _describe(args: argparse.Namespace, streams: Streams) -> int:
    client = _client(args)
    try:
        _store_ready(client)
        with client.store.transaction() as tx:
            lease = read_lease(tx)
            if args.id is not None:
                (view,) = repo.list_jobs(tx, job_id=args.id)
                subs = repo.list_submissions(tx, args.id)
                events = repo.list_events(tx, args.id)
    finally:
        client.close()
    out = streams.stdout
    if lease is None:
        print("Leader:      - (no daemon has taken the lease yet)", file=out)
    else:
        left = lease.expires_at - time.time()
        print(f"Leader:      {lease.holder} (epoch {lease.epoch}, "
              + (f"expires in {left:.0f}s)" if left > 0 else f"expired {-left:.0f}s ago)"),
              file=out)
    if args.id is None:
        return EXIT_OK
    print(f"ID:          {view.id}", file=out)
    print(f"Phase:       {view.phase}", file=out)
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
    print(f"  {'N':>3} {'ATTEMPT':>7} {'SLURM-ID':>9} {'STATUS':<10} {'STATE':<9} "
          f"{'CAUSE':<14} {'EXIT':>4} NODES", file=out)
    for s in subs:
        print(f"  {s.submission:>3} {s.attempt:>7} {s.slurm_job_id or '-':>9} {s.status:<10} "
              f"{s.state or '-':<9} {s.cause or '-':<14} "
              f"{'-' if s.exit_code is None else s.exit_code:>4} {s.nodes or '-'}", file=out)
    print("Events:", file=out)
    for e in events:
        print(f"  {_ts(e.at)}  {e.kind:<14} {e.message}", file=out)
    return EXIT_OK


# ---------------------------------------------------------------- hold, release, cancel


def _configure_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="job id")
    parser.add_argument("-l", "--selector", help="label selector, k=v[,k=v] (bulk)")


def _set_desired(desired: Desired) -> Any:
    def handler(args: argparse.Namespace, streams: Streams) -> int:
        if bool(args.id) == bool(args.selector):
            raise ErrInvalid("give exactly one of ID or -l SELECTOR", field="target")
        client = _client(args)
        try:
            _store_ready(client)
            with client.store.transaction() as tx:
                if args.id:
                    ids: list[str] = [parse_job_id(args.id, field="id")]
                else:
                    selector = repo.parse_selector(args.selector)
                    if not selector:
                        raise ErrInvalid("must not be empty", field="selector")
                    ids = repo.job_ids_by_selector(tx, selector)
                changed = repo.set_desired(tx, ids, desired, now=int(time.time()))
        finally:
            client.close()
        if args.id and changed == 0:
            raise ErrNotFound(f"no job {args.id}")
        print(f"{changed} job(s) set to {desired.value}", file=streams.stdout)
        return EXIT_OK
    return handler


# ---------------------------------------------------------------- wait


def _configure_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="job id")
    parser.add_argument("--timeout", type=float, default=None, help="seconds (default: none)")
    parser.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)


def _wait(args: argparse.Namespace, streams: Streams) -> int:
    client = _client(args)
    live = streams.stderr.isatty()

    def progress(view: dict[str, Any]) -> None:
        line = (f"{view['id']} {view['phase']} attempt={view['attempt']} "
                f"slurm={view['slurm_job_id'] or '-'} state={view['object_state'] or '-'}")
        if live:
            print("\r\x1b[2K" + line, end="", file=streams.stderr, flush=True)
        else:
            print(line, file=streams.stderr)

    try:
        _store_ready(client)
        try:
            view = client.wait(parse_job_id(args.id, field="id"), timeout=args.timeout,
                               poll_s=args.poll, on_change=progress)
        except TimeoutError as exc:
            print(f"\ndispatchctl: {exc}" if live else f"dispatchctl: {exc}",
                  file=streams.stderr)
            return EXIT_FAILURE
    finally:
        client.close()
    if live:
        print(file=streams.stderr)
    print(json.dumps({k: view[k] for k in ("id", "phase", "cause", "exit_code", "attempt",
                                           "warning")},
                     sort_keys=True), file=streams.stdout)
    return _WAIT_EXIT.get((view["phase"], bool(view.get("warning"))), EXIT_FAILURE)


# ``dispatchctl wait`` exit status (README): 0 succeeded; 3 failed with a warning (its
# recovery budget spent under ``on_exhausted: warn``: the workflow may go on); 1 any other
# ending (failed, cancelled, rejected) or a timeout
EXIT_WARNING = 3
_WAIT_EXIT: dict[tuple[str, bool], int] = {
    ("succeeded", False): EXIT_OK,
    ("failed", True): EXIT_WARNING,
}


# ---------------------------------------------------------------- logs, preflight


def _configure_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="job id")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    parser.add_argument("--stderr", action="store_true", help="the job's stderr")
    parser.add_argument("--submission", type=int, default=None,
                        help="which submission (default: the current one)")


def _logs(args: argparse.Namespace, streams: Streams) -> int:
    from controller.wiring import build_adapter, build_runner

    config = _config(args)
    client = Client(config.database.url)
    try:
        _store_ready(client)
        with client.store.transaction() as tx:
            (view,) = repo.list_jobs(tx, job_id=args.id)
            subs = {s.submission: s for s in repo.list_submissions(tx, args.id)}
    finally:
        client.close()
    number = args.submission or view.submission
    sub = subs.get(number)
    if sub is None or sub.slurm_job_id is None or sub.slurm_submit is None:
        raise ErrNotFound(f"job {args.id} has no submitted Slurm job for submission {number}")
    ref = ObjectRef(sub.cluster or config.cluster.name, "dj-" + view.id, sub.slurm_job_id,
                    sub.slurm_submit)

    async def main() -> None:
        runner = build_runner(config)
        adapter = build_adapter(config, runner)
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


def _preflight(args: argparse.Namespace, streams: Streams) -> int:
    import dataclasses

    from controller.slurm.adapter import preflight_problems
    from controller.wiring import build_adapter, build_runner

    config = _config(args)

    async def main() -> tuple[dict[str, Any], list[str]]:
        runner = build_runner(config)
        try:
            found = await build_adapter(config, runner).preflight()
        finally:
            await runner.close()
        return dataclasses.asdict(found), preflight_problems(found)

    caps, problems = asyncio.run(main())
    if args.output == "json":
        print(json.dumps({**caps, "problems": problems}, indent=2, sort_keys=True,
                         default=str), file=streams.stdout)
    else:
        for key, value in caps.items():
            print(f"{key:<24} {value}", file=streams.stdout)
    for problem in problems:  # what the daemon needs and the cluster lacks
        print(f"preflight: {problem}", file=streams.stderr)
    return EXIT_FAILURE if problems else EXIT_OK


def register(commands: dict[str, Command]) -> None:
    rows = {
        "run": Command("run the reconciling daemon", _configure_run, _run),
        "migrate": Command("create or upgrade the database schema", _configure_migrate,
                           _migrate),
        "get": Command("list jobs, or show one", _configure_get, _get),
        "describe": Command("show a job's conditions, submissions and events",
                            _configure_describe, _describe),
        "hold": Command("hold jobs (gated or pending ones stay queued)", _configure_target,
                        _set_desired(Desired.HELD)),
        "release": Command("release held jobs", _configure_target, _set_desired(Desired.RUN)),
        "cancel": Command("stop jobs (cancels their Slurm jobs)", _configure_target,
                          _set_desired(Desired.STOPPED)),
        "wait": Command("wait until a job ends; exit 0 only if it succeeded",
                        _configure_wait, _wait),
        "logs": Command("print a job's output", _configure_logs, _logs),
        "preflight": Command("check what the Slurm cluster supports", _configure_preflight,
                             _preflight),
    }
    commands.update(rows)


__all__ = ["TERMINAL", "register", "submit_document"]
