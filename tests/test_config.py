"""Configuration decoding: defaults, the example file, and every refusal naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.config import (
    Config,
    TransportKind,
    load_config,
    parse_config,
    redact_url,
)
from controller.errors import ErrInvalid
from controller.model.spec import Placement
from controller.slurm.script import StartSettings

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config == Config() == parse_config({})
    assert config.cluster.name == "lab"
    assert config.transport.kind is TransportKind.LOCAL
    assert config.transport.port == 22
    assert config.transport.command_timeout_s == 30
    assert config.output.dir == "~/.dispatch/output"
    assert config.environment.pass_names == ("PATH",)
    assert config.defaults == Placement()
    assert config.database.url == "sqlite:///dispatch.db"
    d = config.daemon
    assert (d.tick_interval_s, d.metrics_port, d.metrics_host, d.unknown_grace_s,
            d.sacct_window_s, d.cluster_stats_interval_s, d.slurm_rate_per_s) == (
        5, 9464, "127.0.0.1", 300, 7 * 24 * 3600, 60, 20)
    assert config.start_settings() == StartSettings()


def test_example_file() -> None:
    config = load_config(str(ROOT / "testdata" / "config" / "example.toml"))
    assert config.transport.run_as == "dispatch"
    assert config.output.dir == "/shared/dispatch/output"
    assert config.environment.pass_names == ("PATH", "HOME", "LANG")
    assert config.defaults == Placement(partition="batch", account="physics", qos="normal",
                                        constraint="skylake", exclude="node13")
    assert config.start_settings().defaults == config.defaults


def test_ssh_transport() -> None:
    config = parse_config({"transport": {"kind": "ssh", "host": "login1", "port": 2299,
                                         "user": "svc", "key_file": "~/.ssh/id_ed25519",
                                         "known_hosts": "/etc/ssh/known"}})
    t = config.transport
    assert (t.kind, t.host, t.port, t.user, t.key_file, t.known_hosts) == (
        TransportKind.SSH, "login1", 2299, "svc", "~/.ssh/id_ed25519", "/etc/ssh/known")


def test_output_dir_is_normalised() -> None:
    assert parse_config({"output": {"dir": "/data/out/"}}).output.dir == "/data/out"
    assert parse_config({"output": {"dir": "~"}}).output.dir == "~"


@pytest.mark.parametrize(("doc", "field"), [
    pytest.param({"clusters": {}}, "clusters", id="unknown-group"),
    pytest.param({"daemon": {"tick_interval": 5}}, "daemon.tick_interval", id="unknown-key"),
    pytest.param({"defaults": {"partitions": "x"}}, "defaults.partitions", id="unknown-default"),
    pytest.param({"cluster": []}, "cluster", id="group-not-table"),
    pytest.param({"cluster": {"name": "a b"}}, "cluster.name", id="cluster-name"),
    pytest.param({"transport": {"kind": "rsh"}}, "transport.kind", id="kind"),
    pytest.param({"transport": {"kind": "ssh"}}, "transport.host", id="ssh-needs-host"),
    pytest.param({"transport": {"host": "h"}}, "transport.host", id="host-only-ssh"),
    pytest.param({"transport": {"kind": "ssh", "host": "h", "run_as": "x"}},
                 "transport.run_as", id="run-as-only-local"),
    pytest.param({"transport": {"run_as": "-x"}}, "transport.run_as", id="run-as-name"),
    pytest.param({"transport": {"port": 0}}, "transport.port", id="port-zero"),
    pytest.param({"transport": {"port": "22"}}, "transport.port", id="port-string"),
    pytest.param({"transport": {"command_timeout_s": 0}}, "transport.command_timeout_s",
                 id="timeout-zero"),
    pytest.param({"transport": {"command_timeout_s": True}}, "transport.command_timeout_s",
                 id="timeout-bool"),
    pytest.param({"output": {"dir": "/a%j"}}, "output.dir", id="dir-percent"),
    pytest.param({"output": {"dir": "/a\\b"}}, "output.dir", id="dir-backslash"),
    pytest.param({"output": {"dir": "/a\nb"}}, "output.dir", id="dir-newline"),
    pytest.param({"output": {"dir": "/a\tb"}}, "output.dir", id="dir-tab"),
    pytest.param({"output": {"dir": "relative/out"}}, "output.dir", id="dir-relative"),
    pytest.param({"output": {"dir": "~bob/out"}}, "output.dir", id="dir-other-home"),
    pytest.param({"output": {"dir": 3}}, "output.dir", id="dir-type"),
    pytest.param({"environment": {"pass": "PATH"}}, "environment.pass", id="pass-not-list"),
    pytest.param({"environment": {"pass": ["PATH", "1X"]}}, "environment.pass[1]",
                 id="pass-not-identifier"),
    pytest.param({"environment": {"pass": ["DISPATCH_X"]}}, "environment.pass[0]",
                 id="pass-reserved"),
    pytest.param({"environment": {"pass": ["A-B"]}}, "environment.pass[0]", id="pass-dash"),
    pytest.param({"environment": {"pass": ["PATH", "PATH"]}}, "environment.pass[1]",
                 id="pass-twice"),
    pytest.param({"environment": {"pass": [1]}}, "environment.pass[0]", id="pass-type"),
    pytest.param({"defaults": {"exclusive": "yes"}}, "defaults.exclusive", id="exclusive"),
    pytest.param({"defaults": {"partition": "a\nb"}}, "defaults.partition", id="partition"),
    pytest.param({"database": {"url": "dispatch.db"}}, "database.url", id="url"),
    pytest.param({"daemon": {"tick_interval_s": -1}}, "daemon.tick_interval_s", id="tick"),
    pytest.param({"daemon": {"metrics_port": 70000}}, "daemon.metrics_port", id="metrics-port"),
    pytest.param({"daemon": {"sacct_window_s": 1.5}}, "daemon.sacct_window_s", id="window"),
    pytest.param({"daemon": {"slurm_rate_per_s": float("inf")}}, "daemon.slurm_rate_per_s",
                 id="rate-inf"),
])
def test_refusals_name_the_key(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ErrInvalid) as info:
        parse_config(doc)
    assert info.value.field == field


def test_zero_grace_is_allowed() -> None:
    assert parse_config({"daemon": {"unknown_grace_s": 0}}).daemon.unknown_grace_s == 0


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ErrInvalid) as info:
        load_config(str(tmp_path / "missing.toml"))
    assert info.value.field == "config"
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    with pytest.raises(ErrInvalid) as info:
        load_config(str(bad))
    assert info.value.field == "config"
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[daemon]\ntick = 1\n")
    with pytest.raises(ErrInvalid) as info:
        load_config(str(unknown))
    assert info.value.field == "daemon.tick"


@pytest.mark.parametrize(("url", "shown"), [
    pytest.param("sqlite:///dispatch.db", "sqlite:///dispatch.db", id="sqlite"),
    pytest.param("postgresql+psycopg://svc:s3cr%40t@db:5432/dispatch",
                 "postgresql+psycopg://svc:***@db:5432/dispatch", id="password"),
    pytest.param("postgresql://svc@db/dispatch", "postgresql://svc@db/dispatch", id="no-pass"),
    pytest.param("postgresql://svc:p@ss@db/d?sslmode=require",
                 "postgresql://svc:***@db/d?sslmode=require", id="at-in-password"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redacted_config_hides_the_password() -> None:
    config = parse_config({"database": {"url": "postgresql://u:hunter2@db/x"}})
    shown = config.redacted()
    assert "hunter2" not in repr(shown)
    assert shown["database"]["url"] == "postgresql://u:***@db/x"
    assert shown["environment"]["pass"] == ["PATH"]
