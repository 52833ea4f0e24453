"""The ``dispatchctl`` application: the command table, argument parsing, exit statuses.

``COMMANDS`` (name -> ``Command(help, configure, handler)``) is the union of the command
groups' tables (``jobs``, ``daemon``, ``slurm``, ``settings``); ``main`` needs no change
when a row is added. Every failure the project raises on purpose ends as one line on
stderr, ``dispatchctl: error: <field>: <reason>``, with the exit status of
``controller.cli.base``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from controller import __version__
from controller.cli import daemon, jobs, settings, slurm
from controller.cli.base import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    Command,
    Handler,
    Streams,
    UsageError,
)
from controller.errors import DispatchError, ErrInvalid, ErrUnsupported

COMMANDS: dict[str, Command] = {**jobs.COMMANDS, **daemon.COMMANDS, **slurm.COMMANDS,
                                **settings.COMMANDS}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser(commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    table = COMMANDS if commands is None else commands
    parser = _Parser(prog=PROG, description="Run desired batch jobs on Slurm and Grid "
                                                "Engine clusters.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # --config goes before the command or after it (as kubectl takes its global flags);
    # after it wins
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="configuration TOML (default: built-in defaults)")
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
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
    return " ".join(text.split())


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
    except DispatchError as exc:  # not found, unreachable database or Slurm host, ...
        print(f"{PROG}: error: {_one_line(str(exc))}", file=streams.stderr)
        return EXIT_FAILURE
