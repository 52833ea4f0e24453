"""The job document and JobSpec: what a client asks to run, validated (SPEC §3.3).

``parse_job_document`` turns the JSON form clients write (see
``controller/schema/job.schema.json``) into a frozen ``JobSpec`` or raises
``ErrInvalid``/``ErrUnsupported`` naming the offending field. It performs no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.errors import ErrInvalid, ErrUnsupported
from controller.model.setting import setting

SHELL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIX = "DISPATCH_"
# Names the batch script's shell will not set, so a job asking for them could never start:
# dash (Debian's /bin/sh) exits "Illegal number" for a non-numeric OPTIND, and bash (/bin/sh
# on other distributions) exits on an assignment to one of its read-only variables.
SHELL_RESERVED_ENV = frozenset({"OPTIND", "BASHOPTS", "BASH_VERSINFO", "EUID", "PPID",
                                "SHELLOPTS", "UID"})
LABEL_KEY_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
LABEL_VALUE_RE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
# a configured cluster's name (``[[clusters]] name``) and a job document's ``cluster``
CLUSTER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_CLUSTERS = 16  # acceptable clusters one job may list

MAX_COMMAND_ARGS = 4096
MAX_STRING = 65_536
MAX_INT = 2**31 - 1

_TOP_KEYS = frozenset({"name", "labels", "command", "workdir", "env", "resources",
                       "extensions", "requeue", "stop_grace_s", "cluster"})
_RESOURCE_KEYS = ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node", "memory_mb",
                  "time_limit_s")


def _word(value: object, path: str) -> str:
    return _slurm_word(value, path)  # defined below, with the document's other checks


@dataclass(frozen=True, slots=True)
class Resources:
    nodes: int | None = None
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    memory_mb: int | None = None
    time_limit_s: int | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Default Slurm placement: a job's own Placement overrides each non-empty field.

    The ``slurm.Placement`` extension of a job document and the ``[defaults]`` settings
    group (SPEC §3.1)."""

    partition: str = setting("", doc="sbatch --partition", check=_word)
    account: str = setting("", doc="sbatch --account", check=_word)
    qos: str = setting("", doc="sbatch --qos", check=_word)
    reservation: str = setting("", doc="sbatch --reservation", check=_word)
    constraint: str = setting("", doc="sbatch --constraint (node features)", check=_word)
    nodelist: str = setting("", doc="sbatch --nodelist", check=_word)
    exclude: str = setting("", doc="sbatch --exclude", check=_word)
    exclusive: bool = setting(False, doc="sbatch --exclusive (whole nodes)")

    def merged_over(self, defaults: Placement) -> Placement:
        """Each non-empty field of self replaces the same field of ``defaults``."""
        return Placement(
            partition=self.partition or defaults.partition,
            account=self.account or defaults.account,
            qos=self.qos or defaults.qos,
            reservation=self.reservation or defaults.reservation,
            constraint=self.constraint or defaults.constraint,
            nodelist=self.nodelist or defaults.nodelist,
            exclude=self.exclude or defaults.exclude,
            exclusive=self.exclusive or defaults.exclusive,
        )


@dataclass(frozen=True, slots=True)
class SlurmResources:
    """The ``slurm.Resources`` extension: what JobSpec has no field for."""

    gres: str = ""
    licenses: str = ""
    mem_per_cpu_mb: int | None = None
    mem_per_gpu_mb: int | None = None
    tmp_mb: int | None = None
    time_min_s: int | None = None


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """The ``dispatch.Output`` extension: absolute stdout/stderr path prefixes."""

    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class SharedCheckpoint:
    """The ``dispatch.SharedCheckpoint`` extension; needs nothing from Slurm."""

    path: str


@dataclass(frozen=True, slots=True)
class JobSpec:
    command: tuple[str, ...]
    workdir: str
    env: tuple[tuple[str, str], ...] = ()  # sorted by name
    resources: Resources = field(default_factory=Resources)
    placement: Placement = field(default_factory=Placement)
    slurm_resources: SlurmResources = field(default_factory=SlurmResources)
    output: OutputSpec | None = None
    checkpoint: SharedCheckpoint | None = None
    name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    requeue: bool = False  # Slurm's own requeue, opt-in (SPEC §6.3)
    stop_grace_s: int | None = None
    # the clusters the job may run on, in order of preference (the first that accepts
    # it wins); empty: the configured default cluster
    clusters: tuple[str, ...] = ()


# ---------------------------------------------------------------- decoding helpers


def _check_keys(obj: Mapping[str, Any], allowed: frozenset[str] | tuple[str, ...],
                path: str) -> None:
    for key in obj:
        if key not in allowed:
            raise ErrInvalid("unknown field", field=f"{path}.{key}" if path else str(key))


def _obj(value: object, path: str) -> Mapping[str, Any]:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ErrInvalid("must be an object", field=path)
    for key in value:
        if type(key) is not str:
            raise ErrInvalid("keys must be strings", field=path)
    return value


def _text(value: object, path: str, *, allow_empty: bool = True, max_len: int = MAX_STRING,
          single_line: bool = False) -> str:
    if not isinstance(value, str):
        raise ErrInvalid("must be a string", field=path)
    if "\x00" in value:
        raise ErrInvalid("must not contain NUL", field=path)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): no script can hold it
            raise ErrInvalid("must be valid Unicode (no lone surrogates)", field=path) from None
    if not allow_empty and not value:
        raise ErrInvalid("must not be empty", field=path)
    if len(value) > max_len:
        raise ErrInvalid(f"longer than {max_len} characters", field=path)
    if single_line and any(c in value for c in "\n\r\t"):
        raise ErrInvalid("must not contain newline, carriage return or tab", field=path)
    return value


def _slurm_word(value: object, path: str) -> str:
    """A placement value passed to sbatch: printable, one line, no spaces or quotes needed."""
    text = _text(value, path, max_len=1024, single_line=True)
    if any(not c.isprintable() for c in text):
        raise ErrInvalid("must be printable", field=path)
    return text


def _positive_int(value: object, path: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise ErrInvalid("must be an integer", field=path)
    if value < minimum or value > MAX_INT:
        raise ErrInvalid(f"must be between {minimum} and {MAX_INT}", field=path)
    return value


def _optional_int(obj: Mapping[str, Any], key: str, path: str, *, minimum: int = 1) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    return _positive_int(value, f"{path}.{key}", minimum=minimum)


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ErrInvalid("must be true or false", field=path)
    return value


def absolute_path(value: object, path: str) -> str:
    text = _text(value, path, allow_empty=False, max_len=4096, single_line=True)
    if not text.startswith("/"):
        raise ErrInvalid("must be an absolute path", field=path)
    return text


def check_env_name(name: str, path: str) -> None:
    """Env and pass names: shell identifiers outside the reserved DISPATCH_ namespace."""
    if SHELL_NAME_RE.fullmatch(name) is None:
        raise ErrInvalid("not a shell identifier", field=path)
    if name.startswith(RESERVED_ENV_PREFIX):
        raise ErrInvalid(f"names starting {RESERVED_ENV_PREFIX} are reserved", field=path)
    if name in SHELL_RESERVED_ENV:
        raise ErrInvalid("the batch script's shell cannot set this variable", field=path)


# ---------------------------------------------------------------- sections


def _resources(value: object) -> Resources:
    obj = _obj(value, "resources")
    _check_keys(obj, _RESOURCE_KEYS, "resources")
    return Resources(
        nodes=_optional_int(obj, "nodes", "resources"),
        tasks_per_node=_optional_int(obj, "tasks_per_node", "resources"),
        cpus_per_task=_optional_int(obj, "cpus_per_task", "resources"),
        gpus_per_node=_optional_int(obj, "gpus_per_node", "resources", minimum=0),
        memory_mb=_optional_int(obj, "memory_mb", "resources"),
        time_limit_s=_optional_int(obj, "time_limit_s", "resources"),
    )


_PLACEMENT_TEXT = ("partition", "account", "qos", "reservation", "constraint", "nodelist",
                   "exclude")


def parse_placement(value: object, path: str) -> Placement:
    obj = _obj(value, path)
    _check_keys(obj, (*_PLACEMENT_TEXT, "exclusive"), path)
    texts = {k: _slurm_word(obj[k], f"{path}.{k}") for k in _PLACEMENT_TEXT if k in obj}
    exclusive = _bool(obj["exclusive"], f"{path}.exclusive") if "exclusive" in obj else False
    return Placement(**texts, exclusive=exclusive)


def _slurm_resources(value: object, path: str) -> SlurmResources:
    obj = _obj(value, path)
    _check_keys(obj, ("gres", "licenses", "mem_per_cpu_mb", "mem_per_gpu_mb", "tmp_mb",
                      "time_min_s"), path)
    return SlurmResources(
        gres=_slurm_word(obj["gres"], f"{path}.gres") if "gres" in obj else "",
        licenses=_slurm_word(obj["licenses"], f"{path}.licenses") if "licenses" in obj else "",
        mem_per_cpu_mb=_optional_int(obj, "mem_per_cpu_mb", path),
        mem_per_gpu_mb=_optional_int(obj, "mem_per_gpu_mb", path),
        tmp_mb=_optional_int(obj, "tmp_mb", path),
        time_min_s=_optional_int(obj, "time_min_s", path),
    )


def _output(value: object, path: str) -> OutputSpec:
    obj = _obj(value, path)
    _check_keys(obj, ("stdout", "stderr"), path)
    for key in ("stdout", "stderr"):
        if key not in obj:
            raise ErrInvalid("is required", field=f"{path}.{key}")
    return OutputSpec(stdout=absolute_path(obj["stdout"], f"{path}.stdout"),
                      stderr=absolute_path(obj["stderr"], f"{path}.stderr"))


def _checkpoint(value: object, path: str) -> SharedCheckpoint:
    obj = _obj(value, path)
    _check_keys(obj, ("path",), path)
    if "path" not in obj:
        raise ErrInvalid("is required", field=f"{path}.path")
    return SharedCheckpoint(path=absolute_path(obj["path"], f"{path}.path"))


def _extensions(value: object) -> tuple[Placement, SlurmResources, OutputSpec | None,
                                        SharedCheckpoint | None]:
    obj = _obj(value, "extensions")
    placement, slurm_res = Placement(), SlurmResources()
    output: OutputSpec | None = None
    checkpoint: SharedCheckpoint | None = None
    for namespace, names in obj.items():
        ns_path = f"extensions.{namespace}"
        if namespace not in ("slurm", "dispatch"):
            raise ErrUnsupported("unknown extension namespace", field=ns_path)
        for name, body in _obj(names, ns_path).items():
            path = f"{ns_path}.{name}"
            match (namespace, name):
                case ("slurm", "Placement"):
                    placement = parse_placement(body, path)
                case ("slurm", "Resources"):
                    slurm_res = _slurm_resources(body, path)
                case ("dispatch", "Output"):
                    output = _output(body, path)
                case ("dispatch", "SharedCheckpoint"):
                    checkpoint = _checkpoint(body, path)
                case ("dispatch", "Image"):
                    raise ErrUnsupported("container images are not supported on Slurm",
                                         field=path)
                case _:
                    raise ErrUnsupported("unknown extension", field=path)
    return placement, slurm_res, output, checkpoint


def parse_clusters(value: object, path: str = "cluster") -> tuple[str, ...]:
    """``cluster``: one cluster name, or a list of acceptable ones in order of preference
    (no repeats). Whether the configuration knows them is the daemon's business."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise ErrInvalid("must be a cluster name or a non-empty list of them", field=path)
    if len(names) > MAX_CLUSTERS:
        raise ErrInvalid(f"more than {MAX_CLUSTERS} clusters", field=path)
    out: list[str] = []
    for i, name in enumerate(names):
        where = path if isinstance(value, str) else f"{path}[{i}]"
        if not isinstance(name, str) or CLUSTER_NAME_RE.fullmatch(name) is None:
            raise ErrInvalid("must be a cluster name: 1-64 of [A-Za-z0-9_.-], starting "
                             "alphanumeric", field=where)
        if name in out:
            raise ErrInvalid(f"{name} is listed twice", field=where)
        out.append(name)
    return tuple(out)


def _labels(value: object) -> tuple[tuple[str, str], ...]:
    obj = _obj(value, "labels")
    out: list[tuple[str, str]] = []
    for key, val in obj.items():
        if len(key) > 63 or LABEL_KEY_RE.fullmatch(key) is None:
            raise ErrInvalid("label keys are 1-63 of [A-Za-z0-9._/-], alphanumeric at the ends",
                             field=f"labels.{key}")
        text = _text(val, f"labels.{key}", max_len=63)
        if LABEL_VALUE_RE.fullmatch(text) is None:
            raise ErrInvalid("label values are 0-63 of [A-Za-z0-9._-], alphanumeric at the ends",
                             field=f"labels.{key}")
        out.append((key, text))
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True, eq=False)
class JobDocument:
    """A job document that has been validated: as written (stored verbatim) and its spec.

    ``JobDocument.parse`` is the one validation a client's document goes through on its
    way to the database (``dispatchctl submit``, ``Client.submit``, ``repo.insert_job``)."""

    document: Mapping[str, Any]
    spec: JobSpec

    @classmethod
    def parse(cls, doc: object) -> JobDocument:
        spec = parse_job_document(doc)
        assert isinstance(doc, Mapping)  # parse_job_document refuses anything else
        return cls(doc, spec)


_NO_RESOURCES = Resources()
_NO_EXTENSIONS: tuple[Placement, SlurmResources, None, None] = (
    Placement(), SlurmResources(), None, None)


def parse_job_document(doc: object) -> JobSpec:
    """Validate a job document (decoded JSON) and return its JobSpec.

    Raises ErrInvalid (bad value, naming the field) or ErrUnsupported (an
    extension this adapter cannot honour).
    """
    obj = _obj(doc, "job")
    _check_keys(obj, _TOP_KEYS, "")
    if "command" not in obj:
        raise ErrInvalid("is required", field="command")
    raw_cmd = obj["command"]
    if not isinstance(raw_cmd, list) or not raw_cmd:
        raise ErrInvalid("must be a non-empty list of strings", field="command")
    if len(raw_cmd) > MAX_COMMAND_ARGS:
        raise ErrInvalid(f"more than {MAX_COMMAND_ARGS} arguments", field="command")
    command = tuple(_text(arg, f"command[{i}]") for i, arg in enumerate(raw_cmd))
    if not command[0]:
        raise ErrInvalid("the program must not be empty", field="command[0]")
    if "workdir" not in obj:
        raise ErrInvalid("is required", field="workdir")
    workdir = absolute_path(obj["workdir"], "workdir")

    env_items: list[tuple[str, str]] = []
    for key, val in (_obj(obj["env"], "env").items() if "env" in obj else ()):
        check_env_name(key, f"env.{key}")
        env_items.append((key, _text(val, f"env.{key}")))

    # an absent section is its default, shared (a new leader validates every row)
    placement, slurm_res, output, checkpoint = (
        _extensions(obj["extensions"]) if "extensions" in obj else _NO_EXTENSIONS)
    grace = obj.get("stop_grace_s")
    return JobSpec(
        command=command,
        workdir=workdir,
        env=tuple(sorted(env_items)),
        resources=_resources(obj["resources"]) if "resources" in obj else _NO_RESOURCES,
        placement=placement,
        slurm_resources=slurm_res,
        output=output,
        checkpoint=checkpoint,
        name=_text(obj["name"], "name", max_len=256, single_line=True) if "name" in obj
        else "",
        labels=_labels(obj["labels"]) if "labels" in obj else (),
        requeue=_bool(obj["requeue"], "requeue") if "requeue" in obj else False,
        stop_grace_s=None if grace is None else _positive_int(grace, "stop_grace_s",
                                                              minimum=1),
        clusters=parse_clusters(obj["cluster"]) if "cluster" in obj else (),
    )


def spec_to_document(spec: JobSpec) -> dict[str, Any]:
    """The canonical job document of a spec (inverse of parse_job_document)."""
    doc: dict[str, Any] = {"command": list(spec.command), "workdir": spec.workdir}
    if spec.name:
        doc["name"] = spec.name
    if spec.labels:
        doc["labels"] = dict(spec.labels)
    if spec.env:
        doc["env"] = dict(spec.env)
    res = {k: getattr(spec.resources, k) for k in _RESOURCE_KEYS
           if getattr(spec.resources, k) is not None}
    if res:
        doc["resources"] = res
    ext: dict[str, dict[str, Any]] = {}
    pl = {k: getattr(spec.placement, k) for k in _PLACEMENT_TEXT if getattr(spec.placement, k)}
    if spec.placement.exclusive:
        pl["exclusive"] = True
    if pl:
        ext.setdefault("slurm", {})["Placement"] = pl
    sr = {k: getattr(spec.slurm_resources, k) for k in
          ("gres", "licenses", "mem_per_cpu_mb", "mem_per_gpu_mb", "tmp_mb", "time_min_s")
          if getattr(spec.slurm_resources, k) not in ("", None)}
    if sr:
        ext.setdefault("slurm", {})["Resources"] = sr
    if spec.output:
        ext.setdefault("dispatch", {})["Output"] = {"stdout": spec.output.stdout,
                                                    "stderr": spec.output.stderr}
    if spec.checkpoint:
        ext.setdefault("dispatch", {})["SharedCheckpoint"] = {"path": spec.checkpoint.path}
    if ext:
        doc["extensions"] = ext
    if spec.requeue:
        doc["requeue"] = True
    if spec.stop_grace_s is not None:
        doc["stop_grace_s"] = spec.stop_grace_s
    if spec.clusters:
        doc["cluster"] = spec.clusters[0] if len(spec.clusters) == 1 else list(spec.clusters)
    return doc
