"""The alert rules, checked and unit-tested by Prometheus's own ``promtool``.

``promtool`` comes with Debian's ``prometheus`` package, which ``scripts/test`` installs.
``deploy/prometheus/alerts_test.yaml`` makes every alert fire on a synthetic series and
stay silent on a healthy one; this file runs it and checks that it really covers every
alert of ``alerts.yaml``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "promtool not found: scripts/test installs Debian's prometheus package"
    return subprocess.run([found, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def alert_names() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["alert"] for group in doc["groups"] for rule in group["rules"]
            if "alert" in rule]


def rule_tests() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == [RULES.name]
    tests = doc["tests"]
    assert isinstance(tests, list)
    return tests


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("alert", alert_names())
def test_every_alert_fires_and_stays_silent_when_healthy(alert: str) -> None:
    """Each alert: a case where it fires, an earlier case where it does not (``for``), and a
    series of a healthy ``job`` in the same input that never appears among the alerts."""
    fired = silent = False
    for case in rule_tests():
        checks = [c for c in case.get("alert_rule_test", []) if c["alertname"] == alert]
        if not checks:
            continue
        healthy = [s for s in case["input_series"] if 'job="healthy"' in s["series"]]
        assert healthy, f"{case['name']}: no healthy series beside the failing one"
        for check in checks:
            expected = check.get("exp_alerts") or []
            assert all(e["exp_labels"].get("job") != "healthy" for e in expected)
            fired = fired or bool(expected)
            silent = silent or not expected
    assert fired, f"{alert}: no promtool test makes it fire"
    assert silent, f"{alert}: no promtool test checks it stays silent"


@pytest.mark.parametrize("alert", [a for a in alert_names() if a not in (
    "DispatchNoLeader", "DispatchJobsOnUnconfiguredCluster")])
def test_every_alert_but_no_leader_fires_per_cluster(alert: str) -> None:
    """Every alert names the cluster it is about; DispatchNoLeader is about the whole job
    (no shard of any cluster led), DispatchShardUnowned about one cluster's shard, and
    DispatchJobsOnUnconfiguredCluster about a cluster the configuration does not name
    (no bounded label value)."""
    expected = [e for case in rule_tests() for check in case.get("alert_rule_test", [])
                if check["alertname"] == alert for e in check.get("exp_alerts") or []]
    assert expected
    for e in expected:
        assert e["exp_labels"].get("cluster"), e
        assert f"cluster {e['exp_labels']['cluster']}" in e["exp_annotations"]["summary"], e


@pytest.mark.parametrize(("alert", "good", "broken"), [
    pytest.param("DispatchNoLeader", "max by (namespace, job) (dispatch_leader) == 0",
                 "max by (namespace, job) (dispatch_leader) == 7", id="no-leader"),
    pytest.param("DispatchShardUnowned",
                 "max by (namespace, job, cluster) (dispatch_leader) == 0",
                 "max by (namespace, job, cluster) (dispatch_leader) == 7", id="shard-unowned"),
])
def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path, alert: str, good: str,
                                            broken: str) -> None:
    """The unit tests are not vacuous: an alert that can never fire fails them."""
    assert RULES.read_text().count(good) == 1
    rules = RULES.read_text().replace(good, broken)
    (tmp_path / RULES.name).write_text(rules)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = promtool("test", "rules", tmp_path / RULE_TESTS.name)
    assert result.returncode != 0
    assert alert in result.stdout + result.stderr
