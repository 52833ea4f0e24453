"""Seed 003's checks: is a job that Grid Engine lists running really running?

Grid Engine keeps a job ``r`` when its host's execd is gone (the queue instance turns
``u`` after ``max_unheard``; with Debian's ``reschedule_unknown 0`` it stays so until
execd returns) and past its run-time limit when the limit could not be enforced. For
such a job the adapter looks at the host itself: ``probe_script`` runs on the submit
host and, for the job's host (itself, or over ``ssh -o BatchMode=yes``), lists the
``DISPATCH_ATTEMPT`` of every process of the user -- the batch script exports it
(``s<N>-<job number>-r<R>``) and the command inherits it -- and whether an ``sge_execd``
runs there. A job whose host answered, runs no execd and has no process of it is dead
(``dead_numbers``); with execd running, the job's end is execd's to report; a host
that does not answer tells nothing (a partition is not a crash): the job stays running,
marked Stale by its host's state, for the operator (Grid Engine itself gives up on such
a host only with ``reschedule_unknown``; its jobs then leave qstat and the adapter
follows them into accounting, or into unknown). Pure: the adapter runs the script.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Final

VERIFY_GRACE_S: Final = 120  # past h_rt by this much: verify the job's processes
# A host unheard this long (seen 'u' by this process's reads) is verified. A restarted
# qmaster shows every host 'u' until its execd's next load report (load_report_time,
# 40 s by default): a job that ended meanwhile has no process and no record yet.
UNHEARD_GRACE_S: Final = 120
ANSWERED: Final = "DISPATCH-PROBE-ANSWERED"
EXECD_ALIVE: Final = "DISPATCH-PROBE-EXECD"
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ATTEMPT_RE = re.compile(r"DISPATCH_ATTEMPT=s[0-9]+-([0-9]+)-r[0-9]+")


def probe_script(host: str) -> str:
    """A sh script: on ``host``, ``ANSWERED`` then every ``DISPATCH_ATTEMPT=...`` of a
    process of this user (nothing printed at all when the host cannot be reached)."""
    if _HOST_RE.fullmatch(host) is None:
        raise ValueError(f"not a host name: {host!r:.60}")
    probe = (f"echo {ANSWERED}; grep -qsx sge_execd /proc/[0-9]*/comm && echo {EXECD_ALIVE}; "
             "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | "
             "grep -E '^DISPATCH_ATTEMPT=s[0-9]+-[0-9]+-r[0-9]+$' | sort -u; exit 0")
    quoted = shlex.quote(host)
    return (f"H={quoted}\n"
            'if [ "$H" = "$(hostname)" ] || [ "$H" = "$(hostname -s)" ]; then\n'
            f"  {probe}\n"
            "fi\n"
            "exec ssh -o BatchMode=yes -o ConnectTimeout=5 -- \"$H\" "
            f"{shlex.quote(probe)} 2>/dev/null\n")


def dead_numbers(output: str, numbers: Iterable[int]) -> frozenset[int]:
    """Of ``numbers`` (jobs on the probed host), those with no process there; none
    when the host did not answer, and none while its execd runs (a job that ended while
    its execd could not reach qmaster -- qmaster restarting -- has no process either,
    and execd will report how it ended)."""
    lines = output.splitlines()
    if ANSWERED not in lines or EXECD_ALIVE in lines:
        return frozenset()
    alive = {int(m.group(1)) for line in lines if (m := _ATTEMPT_RE.fullmatch(line))}
    return frozenset(n for n in numbers if n not in alive)
