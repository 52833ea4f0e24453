"""Configuration: one tree of frozen dataclasses, decoded from one TOML file by one decoder.

Every key is a dataclass field made with ``controller.model.setting.setting``: its
default, unit, bounds, meaning and whether it is secret are written there and nowhere
else. ``parse_config`` (the one generic decoder, driven by those fields),
``Config.redacted()``, ``dispatchctl config --defaults`` and the key table in the README
(``render_markdown``, kept equal by ``tests/test_config.py``) all read them.

The groups, in file order: ``[cluster]``, ``[transport]``, ``[output]``,
``[environment]``, ``[defaults]`` (``controller.model.spec.Placement``), ``[database]``,
``[daemon]``, ``[reconcile]`` (``controller.reconcile.settings.ReconcileConfig``) and
``[slurm]``. Every key has a default, so ``load_config(None)`` (no file at all) is a
working configuration for a local Slurm.

Several clusters (shards) are ``[[clusters]]`` entries (``ClusterEntry``), each named,
instead of ``[cluster] name``: an entry's ``transport``, ``output``, ``environment``,
``defaults`` and ``slurm`` subtables overlay the top-level group of that name key by key
and go through the same decoder. The first entry is the default cluster, and the
top-level groups of the decoded ``Config`` are its. Without ``[[clusters]]``,
``Config.clusters`` is the one entry the top-level groups describe.

Unknown groups or keys, wrong types and values out of bounds are refused with
``ErrInvalid`` naming the dotted key (``daemon.tick_interval``). Keys that moved
(``MOVED``) are still accepted where they were, with a logged warning. Paths other than
``output.dir`` are kept as written; whoever opens them expands ``~`` on the
controller's host.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from controller.errors import ErrInvalid
from controller.gridengine.accounting import DEFAULT_ACCOUNTING_FILE
from controller.gridengine.script import GridEngineSettings
from controller.gridengine.verify import UNHEARD_GRACE_S
from controller.model.setting import MASK, Setting, redact_url, setting, setting_of
from controller.model.spec import CLUSTER_NAME_RE, Placement, check_env_name
from controller.reconcile.settings import ReconcileConfig
from controller.runner.base import DEFAULT_COMMAND_TIMEOUT_S
from controller.slurm.script import (
    DEFAULT_OUTPUT_DIR,
    DEFAULT_PASS,
    StartSettings,
    check_output_dir,
)

log = logging.getLogger("dispatch.config")

_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_URL_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

# ---------------------------------------------------------------- checks of single keys


def _pattern(regex: re.Pattern[str], what: str) -> Any:
    def check(value: str, path: str) -> str:
        if regex.fullmatch(value) is None:
            raise ErrInvalid(f"must be {what}", field=path)
        return value
    return check


def _host(value: str, path: str) -> str:
    if value.startswith("-") or any(c.isspace() for c in value):
        raise ErrInvalid("must be a host name or address", field=path)
    return value


def _output_dir(value: str, path: str) -> str:
    try:
        return check_output_dir(value)
    except ErrInvalid as exc:  # it names output.dir; the file may have written it elsewhere
        raise ErrInvalid(exc.reason, field=path) from exc


def _pass_names(value: tuple[str, ...], path: str) -> tuple[str, ...]:
    for i, name in enumerate(value):
        check_env_name(name, f"{path}[{i}]")
        if name in value[:i]:
            raise ErrInvalid(f"{name} is listed twice", field=f"{path}[{i}]")
    return value


def _database_url(value: str, path: str) -> str:
    if _URL_SCHEME_RE.match(value) is None:
        raise ErrInvalid("must be a database URL such as sqlite:///dispatch.db", field=path)
    return value


_USER = _pattern(_USER_RE, "a user name")

# A group's key (its TOML name) -> its dotted path as the file wrote it
# (``transport.host``, ``clusters[1].transport.host``); given to a group's ``validate``.
KeyPath = Callable[[str], str]

# ---------------------------------------------------------------- the groups


class SchedulerKind(enum.Enum):
    """Which scheduler a cluster runs: its adapter (``controller.wiring.ADAPTERS``)."""

    SLURM = "slurm"
    GRIDENGINE = "gridengine"


_GE_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}|")


class TransportKind(enum.Enum):
    """How a command reaches the Slurm host."""

    LOCAL = "local"
    SSH = "ssh"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The Slurm cluster this controller acts on."""

    name: str = setting("lab", doc="the cluster's name: ObjectRef.cluster of its objects",
                        check=_pattern(CLUSTER_NAME_RE,
                                       "1-64 of [A-Za-z0-9_.-], starting alphanumeric"))
    kind: SchedulerKind = setting(SchedulerKind.SLURM,
                                  doc='the scheduler: "slurm" or "gridengine" (Son of Grid '
                                      'Engine 8.1)')


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """How Slurm commands reach the Slurm host."""

    kind: TransportKind = setting(TransportKind.LOCAL,
                                  doc='"local" (a subprocess) or "ssh" (one connection)')
    host: str | None = setting(None, doc="ssh: the Slurm login host (required for ssh)",
                               check=_host)
    port: int = setting(22, minimum=1, maximum=65535, doc="ssh: the login host's port")
    user: str | None = setting(None, doc="ssh: remote user; empty: the controller's user",
                               check=_USER)
    key_file: str | None = setting(None, doc="ssh: private key; empty: the client's defaults")
    known_hosts: str | None = setting(
        None, doc="ssh: known_hosts file; empty: ~/.ssh/known_hosts (host keys are always "
                  "checked)")
    run_as: str | None = setting(None, doc="local: run Slurm commands as this user "
                                           "(runuser -u)", check=_USER)
    command_timeout_s: float = setting(DEFAULT_COMMAND_TIMEOUT_S, unit="s", positive=True,
                                       doc="every Slurm command is killed after this")

    def validate(self, path: KeyPath) -> None:
        if self.kind is TransportKind.SSH and self.host is None:
            raise ErrInvalid(f"is required when {path('kind')} is ssh", field=path("host"))
        if self.kind is TransportKind.LOCAL:
            for key in ("host", "user"):
                if getattr(self, key) is not None:
                    raise ErrInvalid(f"applies only when {path('kind')} is ssh",
                                     field=path(key))
        if self.kind is TransportKind.SSH and self.run_as is not None:
            raise ErrInvalid(f"applies only when {path('kind')} is local",
                             field=path("run_as"))


@dataclass(frozen=True, slots=True)
class OutputConfig:
    """Where job output goes."""

    dir: str = setting(DEFAULT_OUTPUT_DIR, check=_output_dir,
                       doc='on the Slurm host; absolute or "~/..." (that user\'s home); '
                           "no %, backslash, newline or tab")


@dataclass(frozen=True, slots=True)
class EnvironmentConfig:
    """What every job inherits."""

    pass_names: tuple[str, ...] = setting(DEFAULT_PASS, key="pass", check=_pass_names,
                                          doc="variables of the Slurm host every job "
                                              "inherits (SPEC §3.2)")


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    """The desired-state database (DISPATCH_DATABASE_URL overrides url)."""

    url: str = setting("sqlite:///dispatch.db", secret=True, check=_database_url,
                       doc="SQLAlchemy URL; its password is never logged")


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The daemon loop, its HTTP endpoint and the leader lease."""

    tick_interval_s: float = setting(5.0, unit="s", positive=True, doc="reconcile period")
    metrics_host: str = setting("127.0.0.1",
                                doc="address of /metrics, /healthz and /readyz")
    metrics_port: int = setting(9464, minimum=1, maximum=65535,
                                doc="port of /metrics, /healthz and /readyz")
    cluster_stats_interval_s: float = setting(60.0, unit="s", positive=True,
                                              doc="how often cluster-wide gauges are refreshed")
    lease_ttl_s: float = setting(30.0, unit="s", positive=True,
                                 doc="a standby takes over this long after the leader's last "
                                     "renewal")
    lease_margin_s: float = setting(5.0, unit="s", minimum=0,
                                    doc="the leader makes no Slurm write in the last "
                                        "lease_margin_s of its lease")
    standby_shadow_s: float = setting(
        60.0, unit="s", minimum=0,
        doc="a daemon that holds no shard makes a read-only shadow tick of each shard it "
            "may take (the changed rows, one live read, no write) this often; any "
            "daemon below its share does at every tick while a lease goes unrenewed: a "
            "takeover starts from memory; 0: only then")

    def validate(self, path: KeyPath) -> None:
        ttl, margin = path("lease_ttl_s"), path("lease_margin_s")
        if self.lease_margin_s >= self.lease_ttl_s:
            raise ErrInvalid(f"must be shorter than {ttl}", field=margin)
        if self.tick_interval_s >= self.lease_ttl_s - self.lease_margin_s:
            raise ErrInvalid(f"must be shorter than {ttl} - {margin} "
                             "(the lease is renewed every tick)", field=path("tick_interval_s"))


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """How hard the controller may press on Slurm."""

    rate_per_s: float = setting(20.0, unit="1/s", positive=True,
                                doc="one budget over all Slurm commands to the cluster")


@dataclass(frozen=True, slots=True)
class GridEngineConfig:
    """A Grid Engine cluster's submission (kind = "gridengine")."""

    queue: str = setting("", doc="gridengine: qsub -q; empty: the cell chooses",
                         check=_pattern(_GE_WORD, "a queue name"))
    pe: str = setting("smp", doc="gridengine: qsub -pe for a job of more than one slot",
                      check=_pattern(_GE_WORD, "a parallel environment name"))
    project: str = setting("", doc="gridengine: qsub -P", check=_pattern(_GE_WORD,
                                                                        "a project name"))
    unheard_grace_s: float = setting(UNHEARD_GRACE_S, unit="s", minimum=0,
                                     doc="gridengine: a host whose execd is unheard ('u') "
                                         "this long has its running jobs' processes "
                                         "looked for; none: node-lost")
    accounting_file: str = setting(DEFAULT_ACCOUNTING_FILE,
                                   doc="gridengine: the accounting file on the submit host "
                                       "(followed by offset)")

    def settings(self) -> GridEngineSettings:
        return GridEngineSettings(queue=self.queue, pe=self.pe, project=self.project)


@dataclass(frozen=True, slots=True)
class ClusterEntry:
    """One cluster the controller drives (a shard), of one scheduler kind."""

    name: str
    transport: TransportConfig
    output: OutputConfig
    environment: EnvironmentConfig
    defaults: Placement
    slurm: SlurmConfig
    gridengine: GridEngineConfig = field(default_factory=GridEngineConfig)
    kind: SchedulerKind = SchedulerKind.SLURM

    def start_settings(self) -> StartSettings:
        """The part the Start script needs (``controller.slurm.script``)."""
        return StartSettings(output_dir=self.output.dir,
                             pass_names=self.environment.pass_names,
                             defaults=self.defaults)


CLUSTERS: Final = "clusters"  # the array of tables of several clusters
# The groups an entry may override, in file order: every field of ClusterEntry but its name.
ENTRY_GROUPS: Final[tuple[str, ...]] = tuple(f.name for f in fields(ClusterEntry)
                                             if f.name not in ("name", "kind"))


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration; ``clusters`` left empty is the one cluster the top-level
    groups describe (so ``Config()`` is one cluster named "lab")."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    defaults: Placement = field(default_factory=Placement)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    gridengine: GridEngineConfig = field(default_factory=GridEngineConfig)
    # every cluster, the default first; never empty once constructed
    clusters: tuple[ClusterEntry, ...] = ()

    def __post_init__(self) -> None:
        if not self.clusters:
            object.__setattr__(self, CLUSTERS, (self._top_level_cluster(),))

    def _top_level_cluster(self) -> ClusterEntry:
        return ClusterEntry(self.cluster.name, kind=self.cluster.kind,
                            **{group: getattr(self, group) for group in ENTRY_GROUPS})

    @property
    def default_cluster(self) -> ClusterEntry:
        """Where a job that names no cluster goes: the first entry."""
        return self.clusters[0]

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self.clusters)

    def cluster_named(self, name: str) -> ClusterEntry:
        """The entry called ``name``; ErrInvalid (field ``cluster``) if there is none."""
        for entry in self.clusters:
            if entry.name == name:
                return entry
        raise ErrInvalid(f"no cluster {name!r} is configured (configured: "
                         f"{', '.join(self.cluster_names)})", field="cluster")

    def start_settings(self) -> StartSettings:
        """The default cluster's part the Start script needs (``controller.slurm.script``)."""
        return self.default_cluster.start_settings()

    def redacted(self) -> dict[str, Any]:
        """The configuration as plain TOML-shaped data for logs, secrets masked: every
        group, and ``clusters`` as a list of entries (name and their groups)."""
        shown: dict[str, Any] = {group: _plain_group(group, getattr(self, group))
                                 for group in _groups()}
        shown[CLUSTERS] = [{"name": entry.name, "kind": entry.kind.value,
                            **{group: _plain_group(group, getattr(entry, group))
                               for group in ENTRY_GROUPS}}
                           for entry in self.clusters]
        return shown


# Keys that moved, old dotted key -> new: still accepted at the old place (a warning is
# logged); setting both is refused.
MOVED: Final[Mapping[str, str]] = {
    "daemon.unknown_grace_s": "reconcile.unknown_grace_s",
    "daemon.sacct_window_s": "reconcile.sacct_window_s",
    "daemon.slurm_rate_per_s": "slurm.rate_per_s",
}

# ---------------------------------------------------------------- the one decoder


@dataclass(frozen=True, slots=True)
class Key:
    """One documented key: ``group.name``, the dataclass attribute, its Setting."""

    group: str
    name: str
    attr: str
    meta: Setting
    type: Any
    default: Any

    @property
    def dotted(self) -> str:
        return f"{self.group}.{self.name}"


@functools.cache
def _groups() -> dict[str, type[Any]]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in fields(Config) if f.name != CLUSTERS}


@functools.cache
def _keys(group: str) -> tuple[Key, ...]:
    cls = _groups()[group]
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        meta = setting_of(f)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not a setting")
        out.append(Key(group, meta.key or f.name, f.name, meta, hints[f.name], f.default))
    return tuple(out)


def keys() -> list[Key]:
    """Every key of the configuration, in file order."""
    return [key for group in _groups() for key in _keys(group)]


def _decode_value(value: object, key: Key, path: str) -> Any:
    kind, optional = key.type, False
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
        optional = True
    meta = key.meta
    result: Any
    if kind is bool:
        if not isinstance(value, bool):
            raise ErrInvalid("must be true or false", field=path)
        result = value
    elif kind is int or kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ErrInvalid("must be a number", field=path)
        if kind is int and not isinstance(value, int):
            raise ErrInvalid("must be an integer", field=path)
        if not math.isfinite(value):
            raise ErrInvalid("must be a finite number", field=path)
        result = kind(value)
        if meta.positive and result <= 0:
            raise ErrInvalid("must be a positive number", field=path)
        low = -math.inf if meta.minimum is None else meta.minimum
        high = math.inf if meta.maximum is None else meta.maximum
        if not low <= result <= high:
            raise ErrInvalid(f"must be {meta.bounds()}", field=path)
    elif kind is str:
        result = _string(value, path)
        if optional and not result:
            return None
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = [m.value for m in kind]
        if not isinstance(value, str) or value not in choices:
            raise ErrInvalid("must be " + " or ".join(json.dumps(c) for c in choices),
                             field=path)
        result = kind(value)
    elif typing.get_origin(kind) is tuple:
        if not isinstance(value, list):
            raise ErrInvalid("must be a list", field=path)
        result = tuple(_string(v, f"{path}[{i}]") for i, v in enumerate(value))
    else:  # pragma: no cover - a programming error in a group's definition
        raise TypeError(f"{path}: no decoder for {kind!r}")
    return meta.check(result, path) if meta.check is not None else result


def _string(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ErrInvalid("must be a string", field=path)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ErrInvalid("must not contain control characters", field=path)
    return value


def _path_in(prefix: str, paths: Mapping[str, str]) -> KeyPath:
    """Key -> where the file wrote it: ``paths[key]`` if given, else ``prefix.key``."""
    return lambda name: paths.get(name) or f"{prefix}.{name}"


def _decode_values(group: str, table: Mapping[str, Any], path: KeyPath) -> dict[str, Any]:
    """The keys of ``table`` decoded and checked one by one: dataclass attribute -> value."""
    known = {key.name: key for key in _keys(group)}
    for name in table:
        if name not in known:
            raise ErrInvalid("unknown key", field=path(name))
    return {key.attr: _decode_value(table[name], key, path(name))
            for name, key in known.items() if name in table}


def decode_group(group: str, table: Mapping[str, Any], *, prefix: str | None = None,
                 paths: Mapping[str, str] | None = None) -> Any:
    """Group ``group`` from its TOML table, which the file wrote at ``prefix`` (default:
    ``group``; ``clusters[1].transport`` for an entry's). ``paths`` names keys written
    elsewhere (a ``MOVED`` key, or a top-level key an entry inherits); every error, the
    group's ``validate`` too, names the key where it was written."""
    path = _path_in(prefix or group, paths or {})
    decoded = _groups()[group](**_decode_values(group, table, path))
    validate = getattr(decoded, "validate", None)
    if validate is not None:
        validate(path)
    return decoded


def parse_config(doc: Mapping[str, Any]) -> Config:
    """Decode a configuration document (the TOML as a dict); ErrInvalid names the key."""
    if not isinstance(doc, Mapping):
        raise ErrInvalid("the configuration must be a table")
    groups = _groups()
    for name in doc:
        if name not in groups and name != CLUSTERS:
            raise ErrInvalid("unknown group", field=str(name))
    tables: dict[str, dict[str, Any]] = {}
    for name in groups:
        table = doc.get(name, {})
        if not isinstance(table, Mapping):
            raise ErrInvalid("must be a table", field=name)
        tables[name] = dict(table)
    paths: dict[str, dict[str, str]] = {name: {} for name in groups}
    for old, new in MOVED.items():
        old_group, old_key = old.split(".")
        new_group, new_key = new.split(".")
        if old_key not in tables[old_group]:
            continue
        if new_key in tables[new_group]:
            raise ErrInvalid(f"moved to {new}, which is also set: remove it", field=old)
        log.warning("deprecated configuration key: it moved", extra={"key": old, "to": new})
        tables[new_group][new_key] = tables[old_group].pop(old_key)
        paths[new_group][new_key] = old
    if CLUSTERS not in doc:
        return Config(**{name: decode_group(name, tables[name], paths=paths[name])
                         for name in groups})
    return _parse_clusters(doc[CLUSTERS], tables, paths)


def _parse_clusters(raw: object, tables: Mapping[str, Mapping[str, Any]],
                    paths: Mapping[str, Mapping[str, str]]) -> Config:
    """A document with ``[[clusters]]``: the top-level groups an entry may override are
    the base of every entry; the Config's top-level groups are the first entry's."""
    for key in ("name", "kind"):
        if key in tables["cluster"]:
            raise ErrInvalid(f"with [[{CLUSTERS}]] each entry names its cluster and its "
                             "kind; the first entry is the default", field=f"cluster.{key}")
    if not isinstance(raw, list):
        raise ErrInvalid("must be an array of tables ([[clusters]])", field=CLUSTERS)
    if not raw:
        raise ErrInvalid("must hold at least one cluster", field=CLUSTERS)
    shared = {name: decode_group(name, tables[name], paths=paths[name])
              for name in _groups() if name not in ENTRY_GROUPS}
    for group in ENTRY_GROUPS:  # checked here too: every entry may override them
        _decode_values(group, tables[group], _path_in(group, paths[group]))
    entries: list[ClusterEntry] = []
    for i, item in enumerate(raw):
        entry = _decode_entry(item, f"{CLUSTERS}[{i}]", tables, paths)
        if entry.name in (e.name for e in entries):
            raise ErrInvalid(f"cluster {entry.name} is configured twice",
                             field=f"{CLUSTERS}[{i}].name")
        entries.append(entry)
    first = entries[0]
    shared["cluster"] = ClusterConfig(name=first.name, kind=first.kind)
    return Config(**shared, **{group: getattr(first, group) for group in ENTRY_GROUPS},
                  clusters=tuple(entries))


def _decode_entry(item: object, prefix: str, tables: Mapping[str, Mapping[str, Any]],
                  paths: Mapping[str, Mapping[str, str]]) -> ClusterEntry:
    if not isinstance(item, Mapping):
        raise ErrInvalid("must be a table", field=prefix)
    for key in item:
        if key not in ("name", "kind") and key not in ENTRY_GROUPS:
            raise ErrInvalid("unknown key", field=f"{prefix}.{key}")
    if "name" not in item:
        raise ErrInvalid("is required", field=f"{prefix}.name")
    own_cluster = {key: item[key] for key in ("name", "kind") if key in item}
    cluster = decode_group("cluster", own_cluster, prefix=prefix)
    groups: dict[str, Any] = {}
    for group in ENTRY_GROUPS:
        own = item.get(group, {})
        if not isinstance(own, Mapping):
            raise ErrInvalid("must be a table", field=f"{prefix}.{group}")
        top = _path_in(group, paths[group])
        inherited = {key: top(key) for key in tables[group] if key not in own}
        groups[group] = decode_group(group, {**tables[group], **own},
                                     prefix=f"{prefix}.{group}", paths=inherited)
    return ClusterEntry(cluster.name, kind=cluster.kind, **groups)


def load_config(path: str | None, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and decode the TOML file at ``path``; ``None`` gives the defaults.

    ``DISPATCH_DATABASE_URL`` in ``environ`` (default: the process environment)
    overrides ``database.url``, so a password can come from a Kubernetes Secret.
    """
    env = os.environ if environ is None else environ
    config = _load_file(path)
    url = env.get("DISPATCH_DATABASE_URL", "")
    if url:
        config = replace(config, database=replace(config.database, url=url))
    return config


def _load_file(path: str | None) -> Config:
    if path is None:
        return Config()
    try:
        with open(path, "rb") as handle:
            doc = tomllib.load(handle)
    except OSError as exc:
        raise ErrInvalid(f"cannot read {path}: {exc.strerror or exc}", field="config") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ErrInvalid(f"{path} is not valid TOML: {exc}", field="config") from exc
    return parse_config(doc)


# ---------------------------------------------------------------- documentation


def _plain(value: Any, meta: Setting) -> Any:
    """A decoded value as TOML-shaped data (``None`` is ``""``), a secret masked."""
    if value is None:
        return ""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if meta.secret and isinstance(value, str) and value:
        return redact_url(value) if _URL_SCHEME_RE.match(value) else MASK
    return value


def _plain_group(group: str, value: Any) -> dict[str, Any]:
    """Group ``group``'s decoded dataclass as a plain TOML table, secrets masked."""
    return {key.name: _plain(getattr(value, key.attr), key.meta) for key in _keys(group)}


def toml_value(value: Any) -> str:
    """``value`` (plain data) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _describe(meta: Setting) -> str:
    extra = ", ".join(x for x in (meta.unit and f"unit {meta.unit}",
                                  meta.bounds(), meta.secret and "secret") if x)
    return meta.doc + (f" ({extra})" if extra else "")


# Shown commented out at the end of ``dispatchctl config --defaults``; a test decodes it.
CLUSTERS_EXAMPLE: Final = """\
[[clusters]]
name = "cpu"
[clusters.transport]
kind = "ssh"
host = "login-cpu"
[clusters.defaults]
partition = "batch"

[[clusters]]
name = "gpu"
[clusters.transport]
kind = "ssh"
host = "login-gpu"
[clusters.defaults]
partition = "gpu"
[clusters.slurm]
rate_per_s = 5

[[clusters]]
name = "sge"
kind = "gridengine"
[clusters.transport]
kind = "ssh"
host = "sge-submit"
[clusters.gridengine]
queue = "all.q"
"""


def render_toml(config: Config | None = None) -> str:
    """``config`` (default: the defaults), redacted, as a commented TOML file that
    ``parse_config`` decodes to ``config`` again (secrets aside).

    One cluster is written as the top-level groups, followed by ``CLUSTERS_EXAMPLE``
    commented out; several as the default cluster's groups at the top level and one
    ``[[clusters]]`` entry each, holding only the keys where it differs from the default.
    """
    config = config or Config()
    shown = config.redacted()
    entries: list[dict[str, Any]] = shown[CLUSTERS]
    several = config.clusters != (config._top_level_cluster(),)
    lines = ["# dispatch-controller configuration; every key is optional.", ""]
    for group, cls in _groups().items():
        if several and group == "cluster":
            continue
        table = entries[0][group] if several and group in ENTRY_GROUPS else shown[group]
        lines.append(f"[{group}]  # {(cls.__doc__ or '').splitlines()[0].strip()}")
        for key in _keys(group):
            lines.append(f"# {_describe(key.meta)}")
            lines.append(f"{key.name} = {toml_value(table[key.name])}")
        lines.append("")
    if not several:
        lines += ["# Several clusters: one [[clusters]] entry each, in place of [cluster] "
                  "name. An entry's", "# tables override the groups above key by key; "
                  "the first entry is the default.",
                  *(f"# {line}".rstrip() for line in CLUSTERS_EXAMPLE.splitlines()), ""]
        return "\n".join(lines)
    lines.append("# The clusters, the default first; each entry's tables override the groups "
                 "above.")
    for entry in entries:
        lines += [f"[[{CLUSTERS}]]", f"name = {toml_value(entry['name'])}"]
        if entry["kind"] != SchedulerKind.SLURM.value:
            lines.append(f"kind = {toml_value(entry['kind'])}")
        for group in ENTRY_GROUPS:
            changed = {k: v for k, v in entry[group].items() if v != entries[0][group][k]}
            if changed:
                lines.append(f"[{CLUSTERS}.{group}]")
                lines += [f"{k} = {toml_value(v)}" for k, v in changed.items()]
        lines.append("")
    return "\n".join(lines)


def render_markdown() -> str:
    """The README's key table: key, default, unit, bounds, meaning (from the fields)."""
    rows = ["| key | default | unit | bounds | meaning |", "|---|---|---|---|---|"]
    defaults = Config().redacted()
    for key in keys():
        doc = key.meta.doc.replace("|", "\\|") + (" (secret)" if key.meta.secret else "")
        rows.append(f"| `{key.dotted}` | `{toml_value(defaults[key.group][key.name])}` "
                    f"| {key.meta.unit} | {key.meta.bounds()} | {doc} |")
    name_doc = _keys("cluster")[0].meta.doc
    groups = ", ".join(f"`{group}`" for group in ENTRY_GROUPS)
    rows += [f"| `{CLUSTERS}[].name` | required |  |  | {name_doc}; one `[[{CLUSTERS}]]` entry "
             "per cluster, in place of `cluster.name`; the first is the default cluster |",
             f"| `{CLUSTERS}[].kind` | `\"slurm\"` |  |  | the entry's scheduler, "
             "\"slurm\" or \"gridengine\" (in place of `cluster.kind`) |",
             f"| `{CLUSTERS}[].<group>.<key>` | the top-level key |  |  | a table {groups} "
             "in an entry overrides the top-level group of that name, key by key |"]
    moved = ", ".join(f"`{old}` (now `{new}`)" for old, new in MOVED.items())
    rows += ["", f"Still accepted where they were, with a warning in the log: {moved}."]
    return "\n".join(rows)


__all__ = [
    "CLUSTERS", "CLUSTERS_EXAMPLE", "ENTRY_GROUPS", "MOVED", "ClusterConfig", "ClusterEntry",
    "Config", "DaemonConfig", "DatabaseConfig", "EnvironmentConfig", "Key", "KeyPath",
    "GridEngineConfig", "OutputConfig", "ReconcileConfig", "SchedulerKind", "SlurmConfig",
    "TransportConfig", "TransportKind",
    "decode_group", "keys", "load_config", "parse_config", "redact_url", "render_markdown",
    "render_toml", "toml_value",
]
