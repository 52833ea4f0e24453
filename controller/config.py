"""Configuration: grouped frozen dataclasses decoded from one TOML file.

Every key has a default, so ``load_config(None)`` (no file at all) is a working
configuration for a local Slurm. The file has one table per group::

    [cluster]
    name = "lab"                      # ObjectRef.cluster of every object

    [transport]
    kind = "local"                    # "local" (subprocess) or "ssh"
    host = ""                         # ssh: the Slurm login host (required for ssh)
    port = 22                         # ssh
    user = ""                         # ssh: remote user; empty = the controller's user
    key_file = ""                     # ssh: private key; empty = the client's defaults
    known_hosts = ""                  # ssh: known_hosts file; empty = ~/.ssh/known_hosts.
                                      #      Host-key checking cannot be turned off.
    run_as = ""                       # local: run Slurm commands as this user (runuser -u)
    command_timeout_s = 30            # every Slurm command is killed after this

    [output]
    dir = "~/.dispatch/output"        # on the Slurm host; "~" = that user's home.
                                      # Absolute or "~/..."; no %, \\, newline, tab.

    [environment]
    pass = ["PATH"]                   # host variables every job inherits (SPEC §3.2)

    [defaults]                        # the slurm.Placement keys; a job's Placement
    partition = ""                    # overrides each non-empty field (SPEC §3.1)
    account = ""
    qos = ""
    reservation = ""
    constraint = ""
    nodelist = ""
    exclude = ""
    exclusive = false

    [database]
    url = "sqlite:///dispatch.db"     # SQLAlchemy URL; log it with redact_url()

    [daemon]
    tick_interval_s = 5               # reconcile period
    metrics_host = "127.0.0.1"        # Prometheus endpoint
    metrics_port = 9464
    unknown_grace_s = 300             # missing from squeue and sacct this long -> ended/unknown
    sacct_window_s = 604800           # sacct -S looks back this far (7 days)
    cluster_stats_interval_s = 60     # how often cluster-wide gauges are refreshed
    slurm_rate_per_s = 20             # one global budget over all Slurm commands

Unknown groups or keys and wrong types are refused with ``ErrInvalid`` naming the
dotted key (``daemon.tick_interval``). Paths other than ``output.dir`` are kept as
written; whoever opens them expands ``~`` on the controller's host.
"""

from __future__ import annotations

import enum
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from controller.errors import ErrInvalid
from controller.model.spec import Placement, check_env_name, parse_placement
from controller.slurm.script import DEFAULT_OUTPUT_DIR, StartSettings, check_output_dir

_CLUSTER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_URL_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_MASK = "***"


class TransportKind(enum.Enum):
    """How a command reaches the Slurm host."""

    LOCAL = "local"
    SSH = "ssh"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    name: str = "lab"


@dataclass(frozen=True, slots=True)
class TransportConfig:
    kind: TransportKind = TransportKind.LOCAL
    host: str | None = None
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    run_as: str | None = None
    command_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class OutputConfig:
    dir: str = DEFAULT_OUTPUT_DIR


@dataclass(frozen=True, slots=True)
class EnvironmentConfig:
    pass_names: tuple[str, ...] = ("PATH",)  # the TOML key is ``pass``


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    url: str = "sqlite:///dispatch.db"

    def redacted_url(self) -> str:
        return redact_url(self.url)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    tick_interval_s: float = 5.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    unknown_grace_s: float = 300.0
    sacct_window_s: int = 7 * 24 * 3600
    cluster_stats_interval_s: float = 60.0
    slurm_rate_per_s: float = 20.0
    # the leader lease: a standby takes over within lease_ttl_s of the leader's last
    # renewal; the leader makes no Slurm write in the last lease_margin_s of its lease
    lease_ttl_s: float = 30.0
    lease_margin_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    defaults: Placement = field(default_factory=Placement)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)

    def start_settings(self) -> StartSettings:
        """The part the Start script needs (``controller.slurm.script``)."""
        return StartSettings(output_dir=self.output.dir,
                             pass_names=self.environment.pass_names,
                             defaults=self.defaults)

    def redacted(self) -> dict[str, Any]:
        """The configuration as plain data for logs, with the database password masked."""
        return {
            "cluster": {"name": self.cluster.name},
            "transport": {
                "kind": self.transport.kind.value, "host": self.transport.host,
                "port": self.transport.port, "user": self.transport.user,
                "key_file": self.transport.key_file,
                "known_hosts": self.transport.known_hosts,
                "run_as": self.transport.run_as,
                "command_timeout_s": self.transport.command_timeout_s,
            },
            "output": {"dir": self.output.dir},
            "environment": {"pass": list(self.environment.pass_names)},
            "defaults": {k: getattr(self.defaults, k) for k in _PLACEMENT_KEYS},
            "database": {"url": self.database.redacted_url()},
            "daemon": {k: getattr(self.daemon, k) for k in _DAEMON_KEYS},
        }


_PLACEMENT_KEYS = ("partition", "account", "qos", "reservation", "constraint", "nodelist",
                   "exclude", "exclusive")
_DAEMON_KEYS = ("tick_interval_s", "metrics_host", "metrics_port", "unknown_grace_s",
                "sacct_window_s", "cluster_stats_interval_s", "slurm_rate_per_s",
                "lease_ttl_s", "lease_margin_s")
_GROUPS = ("cluster", "transport", "output", "environment", "defaults", "database", "daemon")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return _MASK
    if not password:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{_MASK}@{hostport}"))


# ---------------------------------------------------------------- decoding helpers


def _table(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, Mapping):
        raise ErrInvalid("must be a table", field=name)
    return value


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], group: str) -> None:
    for key in table:
        if key not in allowed:
            raise ErrInvalid("unknown key", field=f"{group}.{key}" if group else str(key))


def _string(value: object, path: str, *, pattern: re.Pattern[str] | None = None,
            what: str = "") -> str:
    if not isinstance(value, str):
        raise ErrInvalid("must be a string", field=path)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ErrInvalid("must not contain control characters", field=path)
    if pattern is not None and pattern.fullmatch(value) is None:
        raise ErrInvalid(f"must be {what}", field=path)
    return value


def _optional_string(table: Mapping[str, Any], key: str, group: str, *,
                     pattern: re.Pattern[str] | None = None, what: str = "") -> str | None:
    if key not in table:
        return None
    text = _string(table[key], f"{group}.{key}", pattern=pattern, what=what)
    return text or None


def _integer(value: object, path: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ErrInvalid("must be an integer", field=path)
    if not minimum <= value <= maximum:
        raise ErrInvalid(f"must be between {minimum} and {maximum}", field=path)
    return value


def _seconds(value: object, path: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ErrInvalid("must be a number", field=path)
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise ErrInvalid("must be a positive number" if not allow_zero
                         else "must be a non-negative number", field=path)
    return number


# ---------------------------------------------------------------- groups


def _cluster(doc: Mapping[str, Any]) -> ClusterConfig:
    table = _table(doc, "cluster")
    _check_keys(table, ("name",), "cluster")
    if "name" not in table:
        return ClusterConfig()
    return ClusterConfig(name=_string(table["name"], "cluster.name", pattern=_CLUSTER_NAME_RE,
                                      what="1-64 of [A-Za-z0-9_.-], starting alphanumeric"))


def _transport(doc: Mapping[str, Any]) -> TransportConfig:
    table = _table(doc, "transport")
    _check_keys(table, ("kind", "host", "port", "user", "key_file", "known_hosts", "run_as",
                        "command_timeout_s"), "transport")
    kind = TransportKind.LOCAL
    if "kind" in table:
        raw = _string(table["kind"], "transport.kind")
        try:
            kind = TransportKind(raw)
        except ValueError:
            raise ErrInvalid('must be "local" or "ssh"', field="transport.kind") from None
    host = _optional_string(table, "host", "transport")
    if host is not None and (host.startswith("-") or any(c.isspace() for c in host)):
        raise ErrInvalid("must be a host name or address", field="transport.host")
    user = _optional_string(table, "user", "transport", pattern=_USER_RE, what="a user name")
    run_as = _optional_string(table, "run_as", "transport", pattern=_USER_RE,
                              what="a user name")
    if kind is TransportKind.SSH and host is None:
        raise ErrInvalid("is required when transport.kind is ssh", field="transport.host")
    if kind is TransportKind.LOCAL:
        for key, value in (("host", host), ("user", user)):
            if value is not None:
                raise ErrInvalid("applies only when transport.kind is ssh",
                                 field=f"transport.{key}")
    if kind is TransportKind.SSH and run_as is not None:
        raise ErrInvalid("applies only when transport.kind is local", field="transport.run_as")
    return TransportConfig(
        kind=kind,
        host=host,
        port=(_integer(table["port"], "transport.port", minimum=1, maximum=65535)
              if "port" in table else 22),
        user=user,
        key_file=_optional_string(table, "key_file", "transport"),
        known_hosts=_optional_string(table, "known_hosts", "transport"),
        run_as=run_as,
        command_timeout_s=(_seconds(table["command_timeout_s"], "transport.command_timeout_s")
                           if "command_timeout_s" in table else 30.0),
    )


def _output(doc: Mapping[str, Any]) -> OutputConfig:
    table = _table(doc, "output")
    _check_keys(table, ("dir",), "output")
    if "dir" not in table:
        return OutputConfig()
    raw = table["dir"]
    if not isinstance(raw, str):
        raise ErrInvalid("must be a string", field="output.dir")
    return OutputConfig(dir=check_output_dir(raw))


def _environment(doc: Mapping[str, Any]) -> EnvironmentConfig:
    table = _table(doc, "environment")
    _check_keys(table, ("pass",), "environment")
    if "pass" not in table:
        return EnvironmentConfig()
    raw = table["pass"]
    if not isinstance(raw, list):
        raise ErrInvalid("must be a list of variable names", field="environment.pass")
    names: list[str] = []
    for i, name in enumerate(raw):
        path = f"environment.pass[{i}]"
        if not isinstance(name, str):
            raise ErrInvalid("must be a string", field=path)
        check_env_name(name, path)
        if name in names:
            raise ErrInvalid(f"{name} is listed twice", field=path)
        names.append(name)
    return EnvironmentConfig(pass_names=tuple(names))


def _defaults(doc: Mapping[str, Any]) -> Placement:
    if "defaults" not in doc:
        return Placement()
    return parse_placement(doc["defaults"], "defaults")


def _database(doc: Mapping[str, Any]) -> DatabaseConfig:
    table = _table(doc, "database")
    _check_keys(table, ("url",), "database")
    if "url" not in table:
        return DatabaseConfig()
    url = table["url"]
    if not isinstance(url, str) or _URL_SCHEME_RE.match(url) is None:
        raise ErrInvalid("must be a database URL such as sqlite:///dispatch.db",
                         field="database.url")
    return DatabaseConfig(url=url)


def _daemon(doc: Mapping[str, Any]) -> DaemonConfig:
    table = _table(doc, "daemon")
    _check_keys(table, _DAEMON_KEYS, "daemon")
    base = DaemonConfig()

    def seconds(key: str, default: float, *, allow_zero: bool = False) -> float:
        if key not in table:
            return default
        return _seconds(table[key], f"daemon.{key}", allow_zero=allow_zero)

    daemon = DaemonConfig(
        tick_interval_s=seconds("tick_interval_s", base.tick_interval_s),
        metrics_host=(_string(table["metrics_host"], "daemon.metrics_host")
                      if "metrics_host" in table else base.metrics_host),
        metrics_port=(_integer(table["metrics_port"], "daemon.metrics_port", minimum=1,
                               maximum=65535)
                      if "metrics_port" in table else base.metrics_port),
        unknown_grace_s=seconds("unknown_grace_s", base.unknown_grace_s, allow_zero=True),
        sacct_window_s=(_integer(table["sacct_window_s"], "daemon.sacct_window_s", minimum=1,
                                 maximum=100 * 365 * 24 * 3600)
                        if "sacct_window_s" in table else base.sacct_window_s),
        cluster_stats_interval_s=seconds("cluster_stats_interval_s",
                                         base.cluster_stats_interval_s),
        slurm_rate_per_s=seconds("slurm_rate_per_s", base.slurm_rate_per_s),
        lease_ttl_s=seconds("lease_ttl_s", base.lease_ttl_s),
        lease_margin_s=seconds("lease_margin_s", base.lease_margin_s, allow_zero=True),
    )
    if daemon.lease_margin_s >= daemon.lease_ttl_s:
        raise ErrInvalid("must be shorter than daemon.lease_ttl_s", field="daemon.lease_margin_s")
    if daemon.tick_interval_s >= daemon.lease_ttl_s - daemon.lease_margin_s:
        raise ErrInvalid("must be shorter than daemon.lease_ttl_s - daemon.lease_margin_s "
                         "(the lease is renewed every tick)", field="daemon.tick_interval_s")
    return daemon


# ---------------------------------------------------------------- entry points


def parse_config(doc: Mapping[str, Any]) -> Config:
    """Decode a configuration document (the TOML as a dict); ErrInvalid names the key."""
    if not isinstance(doc, Mapping):
        raise ErrInvalid("the configuration must be a table")
    _check_keys(doc, _GROUPS, "")
    return Config(
        cluster=_cluster(doc),
        transport=_transport(doc),
        output=_output(doc),
        environment=_environment(doc),
        defaults=_defaults(doc),
        database=_database(doc),
        daemon=_daemon(doc),
    )


def load_config(path: str | None, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and decode the TOML file at ``path``; ``None`` gives the defaults.

    ``DISPATCH_DATABASE_URL`` in ``environ`` (default: the process environment)
    overrides ``database.url``, so a password can come from a Kubernetes Secret.
    """
    env = os.environ if environ is None else environ
    config = _load_file(path)
    url = env.get("DISPATCH_DATABASE_URL", "")
    if url:
        config = replace(config, database=DatabaseConfig(url=url))
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
