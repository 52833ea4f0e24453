r"""The Start script and the batch script of one submission (SPEC §3). Pure: values in, text out.

``render_start_script`` turns a StartRequest into the ONE POSIX sh script that
Start runs on the Slurm host (``sh -c SCRIPT`` or ``sh -s`` with the script on
stdin; either works). Golden copies live in ``testdata/golden/start/``.

The Start script
----------------
Runs under ``set -eu``, so every step stops the script when it fails:

1. ``D=<output.dir>/<ULID>`` (``~`` becomes ``"$HOME"`` of the user running the
   script on the Slurm host), then ``mkdir -p`` of ``D`` and of the directories
   of ``dispatch.Output`` paths unless they all exist (``[`` is a shell builtin,
   ``mkdir`` a process: a Start batch makes every script's directories with one
   ``mkdir -p`` first, ``startbatch.batch_script``, ``start_dirs``);
2. the manifest ``D/s<N>.manifest`` (see *Output files*), written with one
   ``printf``. It is complete before sbatch runs, so before any Slurm job of the
   submission exists (a reader holds a ref); its bytes depend only on the request,
   so a Start of the same submission again writes the same line; a reader that
   meets it without its newline (written this instant) gets a TransientError
   (``output.Outputs``). It used to go to a temporary name and be renamed: with the
   per-script ``mkdir``, two processes per job beside sbatch, and Start batches ran at
   0.78x a raw ``sbatch --hold`` loop, 1.08x without them (``bench/burst/starts.py``);
3. ``sbatch --parsable <options> /dev/stdin "$D" <pass arguments>`` with the
   batch script in a quoted here-document. sbatch opens the script file it is
   given and reads it to the end, so ``/dev/stdin`` is the here-document; the
   words after it become the batch script's arguments, which slurmctld stores
   with the job and hands to every execution of it (requeues included).

The here-document delimiter is ``DISPATCH_EOF``, or ``DISPATCH_EOF_<i>`` for the
first ``i`` such that no line of the body equals it (values never span lines, see
below, so in practice it is always ``DISPATCH_EOF``); rendering is refused when
no candidate is free.

sbatch options, in this fixed order
-----------------------------------
``--parsable``, then:

========  =====================================================================
identity  ``--job-name=dj-<ULID>``, ``--comment=dispatch:s=<N>;a=<a>``
gate      ``--hold`` when ``request.gate``
env       ``--export=NIL``
workdir   ``--chdir=<WorkDir>``
output    ``--output=D/s<N>-%j.slurm``, ``--error=`` the same, ``--open-mode=append``
resources ``--nodes``, ``--ntasks-per-node``, ``--cpus-per-task``,
          ``--gpus-per-node`` (omitted when 0), ``--mem=<MiB>``,
          ``--time=<minutes, rounded up>``
requeue   ``--requeue`` or ``--no-requeue`` (``JobSpec.requeue``)
grace     ``--signal=B:TERM@<stop_grace_s>`` (at most 65535, Slurm's limit)
placement ``--partition``, ``--account``, ``--qos``, ``--reservation``,
          ``--constraint``, ``--nodelist``, ``--exclude``, ``--exclusive``:
          ``slurm.Placement`` merged field by field over the configured
          defaults; ``request.extra_exclude`` is appended to ``--exclude``
slurm.Res ``--gres``, ``--licenses``, ``--mem-per-cpu``, ``--mem-per-gpu``,
          ``--tmp`` (MiB), ``--time-min`` (minutes, rounded up)
========  =====================================================================

Each option is one word quoted with ``shlex.quote`` (``'--comment=dispatch:s=1;a=0'``);
``--output``/``--error`` are double-quoted because they expand ``$D``. ``JobSpec.name``,
``labels`` and ``checkpoint`` never reach sbatch. ``--mem`` together with
``--mem-per-cpu`` or ``--mem-per-gpu`` is refused here (sbatch would refuse it).

environment.pass: how the host's values reach the job
-----------------------------------------------------
The batch script is stored by slurmctld and runs later on a compute node under
``--export=NIL``, and it sits in a *quoted* here-document, so nothing in it can
expand on the host. The host's values therefore travel as the batch script's
arguments: the Start script passes, for each pass variable ``V``, the word
``"${V+=}${V-}"`` -- ``=`` followed by the value when ``V`` is set on the host,
an empty word when it is not. The batch script then does, for argument ``k``::

    case ${k} in =*) V=${k#=}; export V ;; *) unset V ;; esac

so the job sees exactly the host's value at Start (any bytes but NUL, trailing
newlines included), or no ``V`` when the host had none. Argument 1 is ``D``,
resolved on the host, because ``~`` cannot be resolved on the compute node
(``--export=NIL`` leaves no ``HOME`` there). The rendered text does not depend on
the host, so ``--dry-run`` prints exactly what runs. Like every Env value, pass
values are stored by slurmctld (as job arguments): no secrets.
Checked on real Slurm 22.05: the job saw the exact argv, Env and pass values,
and after ``scontrol requeue`` it ran again with the same arguments (``r1`` files,
``DISPATCH_EPOCH`` N*1000000+1).

The batch script (SPEC §3.2)
----------------------------
identity variables; ``R=${SLURM_RESTART_COUNT:-0}``, refused (exit 125, message on
stderr, before anything else runs) unless ``SLURM_JOB_ID`` is a decimal and ``R``
a canonical decimal below 1,000,000; ``DISPATCH_ATTEMPT=s<N>-<jobid>-r<R>``,
``DISPATCH_EPOCH=$((N * 1000000 + R))``; ``exec`` redirection of stdout/stderr to
this execution's files; the pass variables; ``SLURM_EXPORT_ENV=ALL``; the Env
variables sorted by name; ``exec`` of the command. Never srun.

Values are single-quoted literals, and every value is kept on one line: a
newline or carriage return in a value is written as ``"$DISPATCH_NL"`` or
``"$DISPATCH_CR"`` between single-quoted pieces (shell variables set just before
the Env exports, never exported). So every line of the batch script starts with
our own text, which

* keeps CR LF out of the script (sbatch refuses a script containing it);
* means no line of a value can end the here-document early;
* avoids a dash 0.5.12 bug (Debian 12's /bin/sh): in a here-document, a line that
  starts like the delimiter and continues with a byte >= 0x80 loses that byte
  (``D`` + ``é`` arrives as ``D`` + the second byte of ``é``).

Output files
------------
``D = <output.dir>/<ULID>``; manifest ``D/s<N>.manifest``, one line of JSON::

    {"version": 1, "stdout": {"prefix": "s3-", "suffix": ".out"},
                   "stderr": {"prefix": "s3-", "suffix": ".err"}}

A prefix is relative to the manifest's directory, or absolute (``dispatch.Output``:
``P.s<N>-`` with no suffix). An execution of Slurm job J with restart count R
writes ``<prefix><J>-r<R><suffix>``; ``sort_execution_files`` lists them in
restart order. Slurm's own messages go to ``D/s<N>-<J>.slurm``.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.errors import ErrInvalid
from controller.model.ids import parse_job_id
from controller.model.obs import StartRequest
from controller.model.spec import JobSpec, Placement, check_env_name
from controller.slurm.naming import (
    EPOCH_BOUND,
    check_attempt,
    check_submission,
    discovery_name,
    format_comment,
)

MAX_SCRIPT_BYTES = 90 * 1024
DEFAULT_OUTPUT_DIR = "~/.dispatch/output"
DEFAULT_PASS = ("PATH",)
MANIFEST_VERSION = 1
HEREDOC_DELIMITER = "DISPATCH_EOF"
MAX_SIGNAL_GRACE_S = 65_535  # sbatch --signal=...@<sig_time> limit
SETUP_FAILED_EXIT = 125  # the batch script refused to run the command
# shell variables holding the characters a value may not carry literally (never exported)
_LINE_BREAK_VARS = {"\n": "DISPATCH_NL", "\r": "DISPATCH_CR"}
_LINE_BREAK_RE = re.compile(r"([\n\r])")
_MAX_DELIMITER_TRIES = 1000
_BAD_OUTPUT_DIR_CHARS = {"%": "%", "\\": "a backslash", "\n": "a newline", "\t": "a tab"}
_EXECUTION_RE = re.compile(r"(0|[1-9][0-9]*)-r(0|[1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class StartSettings:
    """The configuration the Start script depends on (``Config.start_settings()``)."""

    output_dir: str = DEFAULT_OUTPUT_DIR
    pass_names: tuple[str, ...] = DEFAULT_PASS
    defaults: Placement = field(default_factory=Placement)


# ---------------------------------------------------------------- paths


def check_output_dir(path: str) -> str:
    """Validate ``output.dir``: absolute or ``~``/``~/...``; no %, \\, newline, tab.

    ``%`` and ``\\`` would be read by Slurm as ``--output`` patterns. Returns the
    path without trailing slashes.
    """
    for char, name in _BAD_OUTPUT_DIR_CHARS.items():
        if char in path:
            raise ErrInvalid(f"must not contain {name}", field="output.dir")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise ErrInvalid("must not contain control characters", field="output.dir")
    if not (path.startswith(("/", "~/")) or path == "~"):
        raise ErrInvalid('must be an absolute path or start with "~/"', field="output.dir")
    stripped = path.rstrip("/")
    return stripped or "/"


def shell_path(path: str) -> str:
    """A shell word for ``path``; a leading ``~`` becomes ``"$HOME"`` where the word runs."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:]) if path[2:] else '"$HOME"'
    return shlex.quote(path)


def output_dir(settings: StartSettings, job_id: str) -> str:
    """``D = <output.dir>/<ULID>`` as configured (``~`` unresolved)."""
    base = check_output_dir(settings.output_dir)
    return posixpath.join(base, parse_job_id(job_id, field="job_id"))


def manifest_path(settings: StartSettings, job_id: str, submission: int) -> str:
    """``D/s<N>.manifest`` as configured (``~`` unresolved)."""
    check_submission(submission)
    return posixpath.join(output_dir(settings, job_id), f"s{submission}.manifest")


# ---------------------------------------------------------------- output layout


@dataclass(frozen=True, slots=True)
class StreamFiles:
    """Where one stream of one submission goes: ``<prefix><jobid>-r<R><suffix>``.

    ``prefix`` is relative to the manifest's directory, or absolute.
    """

    prefix: str
    suffix: str

    def file_name(self, slurm_job_id: int, restart: int) -> str:
        return f"{self.prefix}{slurm_job_id}-r{restart}{self.suffix}"

    def locate(self, directory: str) -> tuple[str, str]:
        """(directory to list, basename prefix) for a manifest that lives in ``directory``."""
        full = self.prefix if self.prefix.startswith("/") else posixpath.join(directory,
                                                                              self.prefix)
        return posixpath.dirname(full) or "/", posixpath.basename(full)


@dataclass(frozen=True, slots=True)
class OutputLayout:
    """The output files of one submission (SPEC §3.4)."""

    directory: str  # D as configured (``~`` unresolved)
    submission: int
    stdout: StreamFiles
    stderr: StreamFiles

    @property
    def manifest_path(self) -> str:
        return posixpath.join(self.directory, f"s{self.submission}.manifest")

    @property
    def slurm_log_pattern(self) -> str:
        """Slurm's own ``--output``/``--error`` file, with ``%j`` for the job id."""
        return posixpath.join(self.directory, f"s{self.submission}-%j.slurm")

    def manifest_json(self) -> str:
        """The manifest's one line (without the newline)."""
        return json.dumps({
            "version": MANIFEST_VERSION,
            "stdout": {"prefix": self.stdout.prefix, "suffix": self.stdout.suffix},
            "stderr": {"prefix": self.stderr.prefix, "suffix": self.stderr.suffix},
        }, ensure_ascii=False)


def output_layout(settings: StartSettings, job_id: str, submission: int,
                  spec: JobSpec) -> OutputLayout:
    """The layout Start will create for this submission."""
    check_submission(submission)
    directory = output_dir(settings, job_id)
    if spec.output is not None:
        stdout = StreamFiles(f"{spec.output.stdout}.s{submission}-", "")
        stderr = StreamFiles(f"{spec.output.stderr}.s{submission}-", "")
    else:
        stdout = StreamFiles(f"s{submission}-", ".out")
        stderr = StreamFiles(f"s{submission}-", ".err")
    return OutputLayout(directory=directory, submission=submission, stdout=stdout,
                        stderr=stderr)


def parse_manifest(text: str) -> tuple[StreamFiles, StreamFiles]:
    """(stdout, stderr) from a manifest's text; ErrInvalid when it is not one we wrote."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ErrInvalid(f"not JSON: {exc}", field="manifest") from exc
    if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
        raise ErrInvalid(f"not a version {MANIFEST_VERSION} manifest", field="manifest")
    streams: list[StreamFiles] = []
    for name in ("stdout", "stderr"):
        part = doc.get(name)
        if (not isinstance(part, dict) or not isinstance(part.get("prefix"), str)
                or not isinstance(part.get("suffix"), str)):
            raise ErrInvalid("needs prefix and suffix strings", field=f"manifest.{name}")
        streams.append(StreamFiles(part["prefix"], part["suffix"]))
    return streams[0], streams[1]


def parse_execution_file(name: str, prefix: str, suffix: str) -> tuple[int, int] | None:
    """(slurm job id, restart count) of ``<prefix><J>-r<R><suffix>``, or None."""
    if not name.startswith(prefix) or not name.endswith(suffix):
        return None
    middle = name[len(prefix):len(name) - len(suffix)]
    match = _EXECUTION_RE.fullmatch(middle)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def sort_execution_files(names: Iterable[str], prefix: str, suffix: str) -> list[str]:
    """The names that are execution files of this prefix/suffix, in restart order.

    Numerically, so ``r10`` follows ``r9``; other names are dropped. One submission
    is one Slurm job, so the job id only breaks ties.
    """
    keyed: list[tuple[int, int, str]] = []
    for name in names:
        parsed = parse_execution_file(name, prefix, suffix)
        if parsed is not None:
            keyed.append((parsed[1], parsed[0], name))
    return [name for _, _, name in sorted(keyed)]


# ---------------------------------------------------------------- quoting


def _literal(value: str) -> str:
    """One shell word for ``value``, on one line (see the module docstring)."""
    if "\n" not in value and "\r" not in value:
        return shlex.quote(value)
    words = []
    for piece in _LINE_BREAK_RE.split(value):
        if piece in _LINE_BREAK_VARS:
            words.append(f'"${_LINE_BREAK_VARS[piece]}"')
        elif piece:
            words.append(shlex.quote(piece))
    return "".join(words)


def _option(name: str, value: object | None = None) -> str:
    return shlex.quote(name if value is None else f"{name}={value}")


def _minutes(seconds: int) -> int:
    return max(1, math.ceil(seconds / 60))


# ---------------------------------------------------------------- refusals


def check_request(request: StartRequest, settings: StartSettings) -> None:
    """What every scheduler's Start refuses alike: a malformed job id, submission or
    attempt, an output directory or workdir that is not absolute, a bad pass name."""
    parse_job_id(request.job_id, field="job_id")
    check_submission(request.submission)
    check_attempt(request.attempt)
    check_output_dir(settings.output_dir)
    if not request.spec.workdir.startswith("/"):
        raise ErrInvalid("must be an absolute path", field="workdir")
    for i, name in enumerate(settings.pass_names):
        check_env_name(name, f"environment.pass[{i}]")


def _check_request(request: StartRequest, settings: StartSettings) -> None:
    check_request(request, settings)
    spec = request.spec
    if len(set(settings.pass_names)) != len(settings.pass_names):
        raise ErrInvalid("a name is listed twice", field="environment.pass")
    for i, node in enumerate(request.extra_exclude):
        if not node or any(not c.isprintable() or c.isspace() for c in node):
            raise ErrInvalid("must be a node name", field=f"extra_exclude[{i}]")
    if spec.stop_grace_s is not None and spec.stop_grace_s > MAX_SIGNAL_GRACE_S:
        raise ErrInvalid(f"Slurm allows at most {MAX_SIGNAL_GRACE_S}", field="stop_grace_s")
    res = spec.slurm_resources
    if spec.resources.memory_mb is not None:
        for key, value in (("mem_per_cpu_mb", res.mem_per_cpu_mb),
                           ("mem_per_gpu_mb", res.mem_per_gpu_mb)):
            if value is not None:
                raise ErrInvalid("cannot be combined with resources.memory_mb",
                                 field=f"extensions.slurm.Resources.{key}")
    if res.mem_per_cpu_mb is not None and res.mem_per_gpu_mb is not None:
        raise ErrInvalid("cannot be combined with mem_per_cpu_mb",
                         field="extensions.slurm.Resources.mem_per_gpu_mb")


# ---------------------------------------------------------------- options


def sbatch_options(request: StartRequest, settings: StartSettings) -> list[str]:
    """The sbatch options after ``--parsable``, as shell words, in the documented order.

    ``--output`` and ``--error`` refer to ``$D``, set by the Start script.
    """
    spec = request.spec
    n = request.submission
    words = [
        _option("--job-name", discovery_name(request.job_id)),
        _option("--comment", format_comment(n, request.attempt)),
    ]
    if request.gate:
        words.append(_option("--hold"))
    words.append(_option("--export", "NIL"))
    words.append(_option("--chdir", spec.workdir))
    words.append(f'"--output=$D/s{n}-%j.slurm"')
    words.append(f'"--error=$D/s{n}-%j.slurm"')
    words.append(_option("--open-mode", "append"))

    res = spec.resources
    for name, value in (("--nodes", res.nodes), ("--ntasks-per-node", res.tasks_per_node),
                        ("--cpus-per-task", res.cpus_per_task)):
        if value is not None:
            words.append(_option(name, value))
    if res.gpus_per_node:
        words.append(_option("--gpus-per-node", res.gpus_per_node))
    if res.memory_mb is not None:
        words.append(_option("--mem", res.memory_mb))
    if res.time_limit_s is not None:
        words.append(_option("--time", _minutes(res.time_limit_s)))

    words.append(_option("--requeue" if spec.requeue else "--no-requeue"))
    if spec.stop_grace_s is not None:
        words.append(_option("--signal", f"B:TERM@{spec.stop_grace_s}"))

    placement = spec.placement.merged_over(settings.defaults)
    extra = list(dict.fromkeys(request.extra_exclude))
    exclude = ",".join([placement.exclude, *extra] if placement.exclude else extra)
    for name, text in (("--partition", placement.partition), ("--account", placement.account),
                       ("--qos", placement.qos), ("--reservation", placement.reservation),
                       ("--constraint", placement.constraint),
                       ("--nodelist", placement.nodelist), ("--exclude", exclude)):
        if text:
            words.append(_option(name, text))
    if placement.exclusive:
        words.append(_option("--exclusive"))

    sres = spec.slurm_resources
    for name, text in (("--gres", sres.gres), ("--licenses", sres.licenses)):
        if text:
            words.append(_option(name, text))
    for name, number in (("--mem-per-cpu", sres.mem_per_cpu_mb),
                         ("--mem-per-gpu", sres.mem_per_gpu_mb), ("--tmp", sres.tmp_mb)):
        if number is not None:
            words.append(_option(name, number))
    if sres.time_min_s is not None:
        words.append(_option("--time-min", _minutes(sres.time_min_s)))
    return words


# ---------------------------------------------------------------- the batch script


def _restart_count_patterns() -> str:
    """``0|[1-9]|[1-9][0-9]|...``: the canonical decimals below EPOCH_BOUND."""
    digits = len(str(EPOCH_BOUND - 1))
    return "|".join(["0", *("[1-9]" + "[0-9]" * k for k in range(digits))])


@dataclass(frozen=True, slots=True)
class BatchDialect:
    """What a scheduler's batch script reads of its own job (``batch_script``): the
    variable holding the job's id, the lines that set ``R`` (the execution's restart
    count) from what the scheduler exports (``{fail}`` in them: what ends a line that
    refuses a value), the lines after the pass variables, and how
    the header names an unset pass variable."""

    job_id_var: str
    restart: tuple[str, ...]
    environment: tuple[str, ...] = ()
    unset: str = "unset"


def batch_script(request: StartRequest, settings: StartSettings, dialect: BatchDialect) -> str:
    """The batch script the scheduler stores (SPEC §3.2), in ``dialect``: the same one for
    Slurm and Grid Engine but for what each exports of the job. Arguments: D, then one
    per pass variable."""
    spec = request.spec
    n = request.submission
    layout = output_layout(settings, request.job_id, n, spec)
    var = dialect.job_id_var
    execution = "${" + var + "}-r${R}"

    def target(stream: StreamFiles) -> str:
        if stream.prefix.startswith("/"):
            return f'{shlex.quote(stream.prefix)}"{execution}"'
        return f'"$1/{stream.prefix}{execution}{stream.suffix}"'

    fail = f">&2; exit {SETUP_FAILED_EXIT} ;;"
    pass_list = " ".join(settings.pass_names) or "none"
    lines = [
        "#!/bin/sh",
        f"# arguments: the output directory, then per environment.pass variable ({pass_list})"
        f" =value, or empty when {dialect.unset}",
        f"DISPATCH_JOB_ID={shlex.quote(parse_job_id(request.job_id, field='job_id'))}",
        f"DISPATCH_SUBMISSION={n}",
        f"case ${{{var}:-}} in",
        f"''|*[!0-9]*) printf 'dispatch: {var}=%s is not a job id\\n' "
        f'"${{{var}:-}}" {fail}',
        "esac",
        *(line.replace("{fail}", fail) for line in dialect.restart),
        f"DISPATCH_ATTEMPT=s{n}-{execution}",
        f"DISPATCH_EPOCH=$(({n} * {EPOCH_BOUND} + R))",
        "export DISPATCH_JOB_ID DISPATCH_SUBMISSION DISPATCH_ATTEMPT DISPATCH_EPOCH",
        f"exec >>{target(layout.stdout)} 2>>{target(layout.stderr)}",
    ]
    for position, name in enumerate(settings.pass_names, start=2):
        lines.append(f"case ${{{position}}} in =*) {name}=${{{position}#=}}; export {name} ;; "
                     f"*) unset {name} ;; esac")
    lines += dialect.environment
    literal_values = [value for _, value in spec.env] + list(spec.command)
    if any("\n" in value for value in literal_values):
        lines += ["DISPATCH_NL='", "'"]
    if any("\r" in value for value in literal_values):
        lines.append("DISPATCH_CR=$(printf '\\r')")
    for name, value in sorted(spec.env):
        lines.append(f"export {name}={_literal(value)}")
    lines.append("exec " + " ".join(_literal(arg) for arg in spec.command))
    return "\n".join(lines) + "\n"


# Slurm exports the job's id and, once it requeued the job, its restart count
SLURM_BATCH = BatchDialect(
    job_id_var="SLURM_JOB_ID",
    restart=("R=${SLURM_RESTART_COUNT:-0}",
             "case $R in",
             f"{_restart_count_patterns()}) ;;",
             "*) printf 'dispatch: SLURM_RESTART_COUNT=%s is not a restart count below "
             f"{EPOCH_BOUND}\\n' \"$R\" {{fail}}",
             "esac"),
    environment=("export SLURM_EXPORT_ENV=ALL",),
    unset="unset on the host")


def render_batch_script(request: StartRequest, settings: StartSettings) -> str:
    """The batch script sbatch stores (SPEC §3.2). Arguments: D, then one per pass variable."""
    return batch_script(request, settings, SLURM_BATCH)


def _delimiter(body: str) -> str:
    lines = set(body.split("\n"))
    candidates = [HEREDOC_DELIMITER] + [f"{HEREDOC_DELIMITER}_{i}"
                                        for i in range(1, _MAX_DELIMITER_TRIES)]
    for candidate in candidates:
        if candidate not in lines:
            return candidate
    raise ErrInvalid("the batch script contains every here-document delimiter we could use")


# ---------------------------------------------------------------- the Start script


def _output_parents(spec: JobSpec) -> list[str]:
    """Shell words of the directories of ``dispatch.Output`` paths (none without one)."""
    parents: list[str] = []
    if spec.output is not None:
        for path in (spec.output.stdout, spec.output.stderr):
            parent = shlex.quote(posixpath.dirname(path) or "/")
            if parent not in parents:
                parents.append(parent)
    return parents


def start_dirs(request: StartRequest, settings: StartSettings) -> tuple[str, ...]:
    """Shell words of the directories a Start script makes (``D`` and the directories of
    ``dispatch.Output`` paths), as a Start batch's one ``mkdir -p`` makes them first."""
    layout = output_layout(settings, request.job_id, request.submission, request.spec)
    return (shell_path(layout.directory), *_output_parents(request.spec))


def render_start_script(request: StartRequest, settings: StartSettings) -> str:
    """The one POSIX sh script Start runs on the Slurm host (module docstring).

    Raises ErrInvalid (naming the field) for what SPEC §3.3 refuses; nothing is
    rendered then, so nothing can run.
    """
    _check_request(request, settings)
    spec = request.spec
    n = request.submission
    layout = output_layout(settings, request.job_id, n, spec)
    body = render_batch_script(request, settings)
    delimiter = _delimiter(body)

    dirs = ['"$D"', *_output_parents(spec)]
    manifest = f'"$D/s{n}.manifest"'
    pass_args = [f'"${{{name}+=}}${{{name}-}}"' for name in settings.pass_names]
    sbatch_words = ["--parsable", *sbatch_options(request, settings), "/dev/stdin", '"$D"',
                    *pass_args]
    lines = [
        "#!/bin/sh",
        f"# dispatch Start: job {request.job_id} generation {request.generation} "
        f"submission {n} attempt {request.attempt}",
        "set -eu",
        f"D={shell_path(layout.directory)}",
        " && ".join(f"[ -d {d} ]" for d in dirs) + f" || mkdir -p -- {' '.join(dirs)}",
        f"printf '%s\\n' {shlex.quote(layout.manifest_json())} >{manifest}",
        "sbatch " + " \\\n  ".join(sbatch_words) + f" <<'{delimiter}'",
    ]
    script = "\n".join(lines) + "\n" + body + delimiter + "\n"
    size = len(script.encode("utf-8"))
    if size > MAX_SCRIPT_BYTES:
        raise ErrInvalid(f"the Start script would be {size} bytes, over the "
                         f"{MAX_SCRIPT_BYTES}-byte (90 KiB) limit", field="job")
    return script

