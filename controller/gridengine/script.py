r"""The Start script and the batch script of one Grid Engine submission. Pure: values
in, text out (golden copies in ``testdata/golden/gridengine/``).

The Start script runs under ``set -eu`` on the submit host:

1. ``D=<output.dir>/<ULID>`` and ``mkdir -p`` of ``D`` and the ``dispatch.Output``
   directories (as on Slurm: ``controller.slurm.script``'s layout, shared);
2. the manifest ``D/s<N>.manifest`` (the same JSON line as on Slurm);
3. the batch script written to ``D/s<N>.job`` from a quoted here-document (qsub
   refuses ``/dev/stdin``: "no script in your request"), then
   ``J=$(qsub -terse <options> "$D/s<N>.job" "$D" <pass arguments>)`` -- qsub copies
   the script into qmaster's spool, so the file is a record, not what runs;
4. ``printf 'DISPATCH_ID %s\n' "$J"`` and the read-back ``qstat -j "$J" -xml`` (the
   submission time is the identity anchor), in the same round trip.

qsub options, in this fixed order::

    -terse -N dj-<ULID> -A dispatch;s=<N>;a=<a> [-h] -S /bin/sh -wd <workdir>
    -j y -o "$D/s<N>-$JOB_ID.ge" -r y|n [-l h_rt=<s>] [-l h_vmem=<MiB per slot>M]
    [-pe <pe> <slots>] [-q <queue>] [-P <project>] [-l h=<expression>] [-w e]

``-o`` is Grid Engine's own output file (its ``$JOB_ID`` pseudo variable, kept from
the shell by ``\$``): the shepherd creates it when the job starts, so it is the
evidence that a job started (``started_evidence``), and an unwritable ``D`` puts the
job in ``Eqw`` (failed 26). Slots are ``tasks_per_node * cpus_per_task``; ``h_vmem``
is per slot (GE's limit is per process, ``setrlimit``). Node exclusion and the node
list are one ``hostname`` expression: ``h=(a|b)&!c&!d``; with the nodes a resubmission
excludes, ``-w e`` makes qsub refuse a job no host could run (Grid Engine would keep it
``qw`` forever), and the resubmission goes again without the exclusion, as on Slurm.
Refused (ErrUnsupported), because Grid Engine has no equivalent we would trust:
``nodes`` > 1, GPUs, the ``slurm.Resources`` extension, and ``slurm.Placement`` fields
other than ``nodelist`` and ``exclude``. ``stop_grace_s`` is not passed (GE has no
per-job grace: a ``qdel`` kills at once; ``Capabilities.lacks`` says so).

The batch script is the Slurm one's (SPEC §3.2) with Grid Engine's variables:
``JOB_ID`` for the job id and ``RESTARTED`` (1 after a reschedule) for the restart
count, so an execution's files are ``D/s<N>-<J>-r0.out`` / ``-r1``; the host's pass
values arrive as arguments, and the command is ``exec``'d. A command that exits 100
puts the job in Grid Engine's error state (``Eqw``, failed 30): reported as a launch
failure.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from controller.errors import ErrInvalid, ErrUnsupported
from controller.gridengine.naming import format_account
from controller.model.obs import StartRequest
from controller.model.spec import Placement, SlurmResources
from controller.slurm.naming import discovery_name
from controller.slurm.script import (
    MAX_SCRIPT_BYTES,
    BatchDialect,
    StartSettings,
    batch_script,
    check_request,
    output_layout,
    shell_path,
)

HEREDOC_DELIMITER = "DISPATCH_EOF"
ID_LINE = "DISPATCH_ID"
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_WORD_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")


@dataclass(frozen=True, slots=True)
class GridEngineSettings:
    """What a Grid Engine cluster's configuration adds to the Start script."""

    queue: str = ""
    pe: str = "smp"
    project: str = ""


def _hosts(text: str, field: str) -> list[str]:
    hosts = [h for h in text.split(",") if h]
    for host in hosts:
        if _HOST_RE.fullmatch(host) is None:
            raise ErrInvalid("must be host names", field=field)
    return hosts


def host_expression(nodelist: str, exclude: list[str]) -> str:
    """``(a|b)&!c&!d``: the ``-l h=`` expression of a node list and exclusions."""
    parts = []
    wanted = _hosts(nodelist, "extensions.slurm.Placement.nodelist")
    if wanted:
        parts.append(wanted[0] if len(wanted) == 1 else "(" + "|".join(wanted) + ")")
    parts += ["!" + h for h in dict.fromkeys(exclude)]
    return "&".join(parts)


def _check(request: StartRequest, settings: StartSettings, ge: GridEngineSettings) -> None:
    check_request(request, settings)
    spec = request.spec
    res = spec.resources
    if res.nodes is not None and res.nodes > 1:
        raise ErrUnsupported("Grid Engine: jobs on several nodes are not supported",
                             field="resources.nodes")
    if res.gpus_per_node:
        raise ErrUnsupported("Grid Engine: GPUs are not supported",
                             field="resources.gpus_per_node")
    if spec.slurm_resources != SlurmResources():
        raise ErrUnsupported("Grid Engine has no slurm.Resources",
                             field="extensions.slurm.Resources")
    placement = spec.placement
    for key in ("partition", "account", "qos", "reservation", "constraint", "exclusive"):
        if getattr(placement, key):
            raise ErrUnsupported("Grid Engine has no such placement",
                                 field=f"extensions.slurm.Placement.{key}")
    for key, value in (("queue", ge.queue), ("pe", ge.pe), ("project", ge.project)):
        if value and _WORD_RE.fullmatch(value) is None:
            raise ErrInvalid("must be one word", field=f"gridengine.{key}")


def slots(request: StartRequest) -> int:
    res = request.spec.resources
    return (res.tasks_per_node or 1) * (res.cpus_per_task or 1)


def qsub_options(request: StartRequest, settings: StartSettings,
                 ge: GridEngineSettings) -> list[str]:
    """The qsub options as shell words, in the documented order (``$D`` expands)."""
    spec = request.spec
    n = request.submission
    words = ["-terse", "-N", discovery_name(request.job_id),
             "-A", shlex.quote(format_account(n, request.attempt))]
    if request.gate:
        words.append("-h")
    words += ["-S", "/bin/sh", "-wd", shlex.quote(spec.workdir),
              "-j", "y", "-o", f'"$D/s{n}-\\$JOB_ID.ge"',
              "-r", "y" if spec.requeue else "n"]
    res = spec.resources
    count = slots(request)
    if res.time_limit_s is not None:
        words += ["-l", f"h_rt={res.time_limit_s}"]
    if res.memory_mb is not None:
        words += ["-l", f"h_vmem={math.ceil(res.memory_mb / count)}M"]
    if count > 1:
        if not ge.pe:
            raise ErrUnsupported("several slots need gridengine.pe", field="gridengine.pe")
        words += ["-pe", ge.pe, str(count)]
    if ge.queue:
        words += ["-q", ge.queue]
    if ge.project:
        words += ["-P", ge.project]
    placement = spec.placement.merged_over(Placement(nodelist=settings.defaults.nodelist,
                                                     exclude=settings.defaults.exclude))
    exclude = _hosts(placement.exclude, "extensions.slurm.Placement.exclude")
    for i, node in enumerate(request.extra_exclude):
        if _HOST_RE.fullmatch(node) is None:
            raise ErrInvalid("must be a host name", field=f"extra_exclude[{i}]")
    expression = host_expression(placement.nodelist, [*exclude, *request.extra_exclude])
    if expression:
        words += ["-l", shlex.quote(f"h={expression}")]
    if request.extra_exclude:
        # qsub accepts a job that no host can ever run (it would wait forever); with
        # -w e it refuses one ("no suitable queues"), so a resubmission whose exclusion
        # leaves nothing is submitted again without it, as on Slurm
        words += ["-w", "e"]
    return words


# Grid Engine exports the job's id, and RESTARTED=1 in a job it restarted
GRIDENGINE_BATCH = BatchDialect(
    job_id_var="JOB_ID", restart=("case ${RESTARTED:-0} in 1) R=1 ;; *) R=0 ;; esac",))


def render_batch_script(request: StartRequest, settings: StartSettings) -> str:
    """The batch script qsub stores. Arguments: D, then one per pass variable."""
    return batch_script(request, settings, GRIDENGINE_BATCH)


def render_start_script(request: StartRequest, settings: StartSettings,
                        ge: GridEngineSettings) -> str:
    """The one sh script Start runs on the submit host (module docstring)."""
    _check(request, settings, ge)
    spec = request.spec
    n = request.submission
    layout = output_layout(settings, request.job_id, n, spec)
    body = render_batch_script(request, settings)
    delimiter = HEREDOC_DELIMITER
    i = 0
    while delimiter in body.split("\n"):
        i += 1
        delimiter = f"{HEREDOC_DELIMITER}_{i}"
    dirs = ['"$D"']
    if spec.output is not None:
        for path in (spec.output.stdout, spec.output.stderr):
            parent = shlex.quote(path.rsplit("/", 1)[0] or "/")
            if parent not in dirs:
                dirs.append(parent)
    pass_args = [f'"${{{name}+=}}${{{name}-}}"' for name in settings.pass_names]
    lines = [
        "#!/bin/sh",
        f"# dispatch Start (Grid Engine): job {request.job_id} generation "
        f"{request.generation} submission {n} attempt {request.attempt}",
        "set -eu",
        f"D={shell_path(layout.directory)}",
        " && ".join(f"[ -d {d} ]" for d in dirs) + f" || mkdir -p -- {' '.join(dirs)}",
        f"printf '%s\\n' {shlex.quote(layout.manifest_json())} >\"$D/s{n}.manifest\"",
        f"cat >\"$D/s{n}.job\" <<'{delimiter}'",
    ]
    script = "\n".join(lines) + "\n" + body + delimiter + "\n" + "\n".join([
        "J=$(qsub " + " ".join(qsub_options(request, settings, ge))
        + f' "$D/s{n}.job" "$D"' + "".join(" " + a for a in pass_args) + ")",
        f"printf '{ID_LINE} %s\\n' \"$J\"",
        'exec qstat -j "$J" -xml',
    ]) + "\n"
    size = len(script.encode("utf-8"))
    if size > MAX_SCRIPT_BYTES:
        raise ErrInvalid(f"the Start script would be {size} bytes, over the "
                         f"{MAX_SCRIPT_BYTES}-byte (90 KiB) limit", field="job")
    return script
