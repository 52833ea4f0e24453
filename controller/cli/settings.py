"""``dispatchctl config``: the effective configuration (or the defaults) as a commented
TOML file, secrets masked, or the README's key table -- printed from the settings' one
definition (``controller.config``)."""

from __future__ import annotations

import argparse

from controller.cli.base import EXIT_OK, Command, Streams, config_of
from controller.config import render_markdown, render_toml


def _configure_config(parser: argparse.ArgumentParser) -> None:
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--defaults", action="store_true",
                       help="every key with its default (ignores --config)")
    shown.add_argument("--markdown", action="store_true",
                       help="the README's table of every key (ignores --config)")


def _config(args: argparse.Namespace, streams: Streams) -> int:
    if args.markdown:
        print(render_markdown(), file=streams.stdout)
    else:
        streams.stdout.write(render_toml(None if args.defaults else config_of(args)))
    return EXIT_OK


COMMANDS: dict[str, Command] = {
    "config": Command("print the configuration (secrets masked) or, with --defaults, "
                      "every key and its default", _configure_config, _config),
}
