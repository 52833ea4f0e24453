"""``dispatchctl``: the command-line client.

Subcommands live in one table, ``COMMANDS``: name -> ``Command(help, configure,
handler)``. ``configure`` adds the subcommand's arguments to its parser (every
subcommand also gets ``--config FILE``); ``handler(args, streams)`` returns the
exit status. Adding ``run``, ``get``, ``describe``, ``hold``, ... means adding a
row; ``main`` needs no change.

Exit status: 0 success, 1 failure, 2 bad input. Bad input prints exactly one
line on stderr, ``dispatchctl: error: <field>: <reason>``.

Implemented so far: ``submit FILE --dry-run`` validates a job document (JSON, or
YAML when the name ends ``.yaml``/``.yml`` and PyYAML is installed; ``-`` reads
stdin) and prints the exact Start script it would run, touching neither the
database nor Slurm.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from controller import __version__
from controller.config import Config, load_config
from controller.errors import DispatchError, ErrInvalid, ErrUnsupported
from controller.model.ids import new_job_id, parse_job_id
from controller.model.obs import StartRequest
from controller.model.spec import JobSpec, parse_job_document
from controller.slurm.naming import MAX_SUBMISSION
from controller.slurm.script import render_start_script

PROG = "dispatchctl"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_SECRET_NAME_RE = re.compile(r"PASSWORD|SECRET|TOKEN|KEY|CREDENTIAL", re.IGNORECASE)


class UsageError(Exception):
    """The command line itself is wrong (argparse's complaint, as one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


@dataclass(frozen=True, slots=True)
class Streams:
    """Where a handler writes; injected so tests need no global capture."""

    stdout: TextIO
    stderr: TextIO

    def warn(self, message: str) -> None:
        print(f"{PROG}: warning: {message}", file=self.stderr)


Handler = Callable[[argparse.Namespace, Streams], int]


@dataclass(frozen=True, slots=True)
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handler: Handler


# ---------------------------------------------------------------- shared helpers


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ErrInvalid("appears twice in one object", field=key)
        out[key] = value
    return out


def read_document(path: str, *, stdin: TextIO | None = None) -> object:
    """The decoded job document at ``path`` (``-`` = stdin); ErrInvalid names the file."""
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise ErrInvalid(f"cannot read: {exc.strerror or exc}", field=path) from exc
    except UnicodeDecodeError as exc:
        raise ErrInvalid("is not UTF-8 text", field=path) from exc
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # optional dependency
        except ImportError as exc:
            raise ErrInvalid("reading YAML needs PyYAML; use JSON or install PyYAML",
                             field=path) from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ErrInvalid(f"is not valid YAML: {exc}", field=path) from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ErrInvalid(f"is not valid JSON: {exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}", field=path) from exc


def secret_looking_env(spec: JobSpec) -> list[str]:
    """Env names that look like secrets (their values end up in a script slurmctld keeps)."""
    return [name for name, _ in spec.env if _SECRET_NAME_RE.search(name)]


def _config(args: argparse.Namespace) -> Config:
    path: str | None = args.config
    return load_config(path)


# ---------------------------------------------------------------- submit


def _configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="job document (JSON, or YAML ending .yaml/.yml; - for stdin)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the Start script instead of submitting")
    parser.add_argument("--job-id", metavar="ULID",
                        help="job id to render with (default: a new one)")
    parser.add_argument("--submission", metavar="N", default="1",
                        help=f"submission number, 1..{MAX_SUBMISSION} (default 1)")
    parser.add_argument("--attempt", metavar="A", default="0",
                        help="attempt number, >= 0 (default 0)")
    parser.add_argument("--gate", action="store_true",
                        help="submit held (sbatch --hold), as the controller does")
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
    if not args.dry_run:
        return _submit_to_database(args, streams)
    job_id = parse_job_id(args.job_id, field="--job-id") if args.job_id else new_job_id()
    submission = _int_flag(args.submission, "--submission", minimum=1, maximum=MAX_SUBMISSION)
    attempt = _int_flag(args.attempt, "--attempt", minimum=0)
    config = _config(args)
    spec = parse_job_document(read_document(args.file))
    for name in secret_looking_env(spec):
        streams.warn(f"env.{name} looks like a secret; env values are stored in the job "
                     "script by slurmctld")
    request = StartRequest(job_id=job_id, generation=1, submission=submission,
                           attempt=attempt, spec=spec, gate=args.gate)
    streams.stdout.write(render_start_script(request, config.start_settings()))
    return EXIT_OK


# ---------------------------------------------------------------- the table and main


COMMANDS: dict[str, Command] = {}  # filled below


def build_parser(commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    table = COMMANDS if commands is None else commands
    parser = _Parser(prog=PROG, description="Run desired batch jobs on Slurm.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=None,
                        help="configuration TOML (default: built-in defaults)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)
    for name, command in table.items():
        child = sub.add_parser(name, help=command.help, description=command.help,
                               parents=[common])
        command.configure(child)
        child.set_defaults(handler=command.handler)
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dispatchctl`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    streams = Streams(stdout=sys.stdout, stderr=sys.stderr)
    try:
        args = build_parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args, streams)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except UsageError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=streams.stderr)
        return EXIT_USAGE
    except (ErrInvalid, ErrUnsupported) as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=streams.stderr)
        return EXIT_USAGE
    except DispatchError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=streams.stderr)
        return EXIT_FAILURE


from controller.cli_jobs import register  # noqa: E402  (the controller-side rows)

COMMANDS["submit"] = Command(help="validate a job document and write it for the daemon "
                             "(--dry-run prints the Start script instead)",
                             configure=_configure_submit, handler=_submit)
register(COMMANDS)


def _submit_to_database(args: argparse.Namespace, streams: Streams) -> int:
    from controller.cli_jobs import submit_document

    return submit_document(args, streams)


if __name__ == "__main__":
    sys.exit(main())
