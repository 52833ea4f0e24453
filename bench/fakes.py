"""What the benchmarks' fake runners share: the ownership marker's file on the "cluster".

Every reconciler claims its cluster before its first tick acts (``plan.claim``): it
reads ``<output.dir>/.owners/<deployment>@<cluster>`` and writes a token there. A fake
runner hands those scripts to ``Markers.answer``, which keeps the files in a dict, as
the cluster's file system would (a write followed by a read gives the token back).
"""

from __future__ import annotations

import re

from controller.runner.base import CommandResult

# (paths without blanks or quotes: the benchmarks')
_READ = re.compile(r"^if \[ -e (\S+) \]; then exec cat -- \S+; fi\n$")
_WRITE = re.compile(
    r"^mkdir -p -- \S+ && printf '%s\\n' ([0-9a-f]+) > \S+ && mv -f -- \S+ (\S+)\n$")


class Markers:
    """The marker files of one fake cluster, by path."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def answer(self, script: str) -> CommandResult | None:
        """The result of a marker script, or None when ``script`` is not one."""
        if match := _READ.match(script):
            token = self.files.get(match[1])
            return _ok(token + "\n" if token else "")
        if match := _WRITE.match(script):
            self.files[match[2]] = match[1]
            return _ok("")
        return None


def _ok(stdout: str) -> CommandResult:
    return CommandResult(argv=("/bin/sh", "-s"), returncode=0, stdout=stdout, stderr="",
                         duration_s=0.0)
