"""The sh scripts that Output, started_evidence and missing_paths run on the Slurm host,
and the reading of what they print (golden-tested: ``tests/test_output_scripts_golden.py``).

* ``cat_script``: a manifest's text;
* ``read_new_script``: the execution files of one job under a prefix and suffix, each
  from the offset already read, at most ``OUTPUT_CHUNK`` bytes per file per call, in
  base64 (``tail -c +N | head -c M | base64``), so binary output survives any transport;
  ``take_new_bytes`` reads its output;
* ``missing_paths_scripts``: ``[ -e <path> ] || echo <i>`` per path, ~60 KB per script;
  ``missing_indexes`` reads its output;
* ``owner_read_script``, ``owner_write_script``: the deployment's ownership marker,
  ``<output.dir>/.owners/<deployment id>@<cluster>`` (``controller.reconcile.ownership``).

Pure: quoting happens here (``shlex.quote``, ``script.shell_path`` for ``~``), nothing
runs; ``controller.slurm.output`` runs the scripts through the runner.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from controller.errors import ErrInvalid, ProtocolError
from controller.slurm import script

MISSING_PATHS_SCRIPT_LIMIT: Final = 60_000  # bytes of one missing_paths script
OUTPUT_CHUNK: Final = 4 * 1024 * 1024  # bytes of one file read per output poll


def cat_script(path: str) -> str:
    """The text of the file at ``path`` (a manifest) on stdout."""
    return f"exec cat -- {script.shell_path(path)}\n"


def read_new_script(directory: str, prefix: str, suffix: str,
                    offsets: Mapping[str, int]) -> str:
    """Per file ``<prefix>*<suffix>`` of ``directory`` (none when it does not exist):
    a line ``<offset> <count> <name>``, then a line of the base64 of its ``count`` bytes
    from ``offset`` (``offsets[name]``, else 0), ``count`` at most ``OUTPUT_CHUNK``."""
    cases = "".join(f"  {shlex.quote(name)}) off={offset} ;;\n"
                    for name, offset in sorted(offsets.items()))
    pattern = shlex.quote(prefix) + "*" + (shlex.quote(suffix) if suffix else "")
    return (
        f"cd -- {script.shell_path(directory)} 2>/dev/null || exit 0\n"
        f"for f in {pattern}; do\n"
        ' [ -f "$f" ] || continue\n'
        ' case $f in *"\n"*) continue ;; esac\n'
        " off=0\n"
        + (f" case $f in\n{cases} esac\n" if cases else "")
        + ' size=$(wc -c <"$f") || continue\n'
        " n=$((size - off))\n"
        f" [ \"$n\" -gt {OUTPUT_CHUNK} ] && n={OUTPUT_CHUNK}\n"
        ' [ "$n" -lt 0 ] && n=0\n'
        " printf '%s %s %s\\n' \"$off\" \"$n\" \"$f\"\n"
        ' if [ "$n" -gt 0 ]; then tail -c +$((off + 1)) -- "$f" | head -c "$n" |'
        " base64 | tr -d '\\n'; fi\n"
        " printf '\\n'\n"
        "done\n")


def take_new_bytes(stdout: str, *, prefix: str, suffix: str, slurm_id: int,
                   offsets: dict[str, int]) -> tuple[list[bytes], bool]:
    """The new bytes that ``read_new_script`` printed for the execution files of
    ``slurm_id``, in restart order, advancing ``offsets``; and whether a file has more
    than one chunk still to read. A file of another job, or read from an offset that is
    not ``offsets``', is skipped."""
    lines = stdout.split("\n")
    data: dict[str, bytes] = {}
    more = False
    for header, body in zip(lines[0::2], lines[1::2], strict=False):
        parts = header.split(" ", 2)
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts[:2]):
            continue
        off, count, name = int(parts[0]), int(parts[1]), parts[2]
        parsed = script.parse_execution_file(name, prefix, suffix)
        if parsed is None or parsed[0] != slurm_id or off != offsets.get(name, 0):
            continue
        try:
            chunk = base64.b64decode(body, validate=True)
        except ValueError as exc:
            raise ProtocolError(f"output: unreadable bytes of {name}: {exc}") from exc
        data[name] = chunk
        more = more or count >= OUTPUT_CHUNK
    chunks: list[bytes] = []
    for name in script.sort_execution_files(data, prefix, suffix):
        offsets[name] = offsets.get(name, 0) + len(data[name])
        if data[name]:
            chunks.append(data[name])
    return chunks, more


def missing_paths_scripts(paths: Sequence[str]) -> Iterator[tuple[int, int, str]]:
    """``(start, end, script)`` per script of at most ~``MISSING_PATHS_SCRIPT_LIMIT``
    bytes (at least one path each) that prints the index, from ``start``, of each of
    ``paths[start:end]`` that does not exist. ErrInvalid for an empty path or one with
    a NUL, when the script that would hold it is made."""
    start = 0
    while start < len(paths):
        lines: list[str] = []
        size = 0
        end = start
        while end < len(paths) and (not lines or size < MISSING_PATHS_SCRIPT_LIMIT):
            path = paths[end]
            if not path or "\0" in path:
                raise ErrInvalid(f"not a path: {path!r:.60}", field=f"paths[{end}]")
            word = script.shell_path(path) if path.startswith("~") else shlex.quote(path)
            line = f"[ -e {word} ] || echo {end - start}"
            lines.append(line)
            size += len(line) + 1
            end += 1
        yield start, end, "\n".join(lines) + "\n"
        start = end


def missing_indexes(stdout: str, count: int) -> list[int]:
    """The indexes a ``missing_paths_scripts`` script of ``count`` paths printed."""
    indexes: list[int] = []
    for token in stdout.split():
        if not (token.isascii() and token.isdigit()) or int(token) >= count:
            raise ProtocolError(f"missing_paths: unexpected output {token!r:.40}")
        indexes.append(int(token))
    return indexes


OWNERS_DIR: Final = ".owners"  # under output.dir: one marker file per deployment


_CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def owner_path(output_dir: str, deployment: str, cluster: str) -> str:
    """The marker of ``deployment`` (a hex id) on ``cluster`` under ``output_dir`` (``~``
    unresolved): one file per cluster, since clusters often share a home directory."""
    if not deployment or not all(c in "0123456789abcdef" for c in deployment):
        raise ErrInvalid(f"not a deployment id: {deployment!r:.40}", field="deployment")
    if not _CLUSTER_NAME.fullmatch(cluster) or cluster.startswith("."):
        raise ErrInvalid(f"not a cluster name: {cluster!r:.40}", field="cluster")
    return f"{output_dir.rstrip('/')}/{OWNERS_DIR}/{deployment}@{cluster}"


def owner_read_script(output_dir: str, deployment: str, cluster: str) -> str:
    """The marker's token on stdout; nothing when there is no marker."""
    path = script.shell_path(owner_path(output_dir, deployment, cluster))
    return f"if [ -e {path} ]; then exec cat -- {path}; fi\n"


def owner_write_script(output_dir: str, deployment: str, cluster: str, token: str) -> str:
    """Write ``token`` (hex) as the marker, atomically (a temporary file renamed)."""
    if not token or not all(c in "0123456789abcdef" for c in token):
        raise ErrInvalid(f"not a token: {token!r:.40}", field="token")
    path = owner_path(output_dir, deployment, cluster)
    directory = script.shell_path(path.rsplit("/", 1)[0])
    new, final = script.shell_path(path + ".new"), script.shell_path(path)
    return (f"mkdir -p -- {directory} && printf '%s\\n' {token} > {new}"
            f" && mv -f -- {new} {final}\n")


def owner_token(stdout: str) -> str | None:
    """The token ``owner_read_script`` printed, or None (no marker)."""
    token = stdout.strip()
    if not token:
        return None
    if not all(c in "0123456789abcdef" for c in token) or len(token) > 64:
        raise ProtocolError(f"ownership marker: not a token: {token[:40]!r}")
    return token
