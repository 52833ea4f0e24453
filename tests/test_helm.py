"""The Helm chart, rendered and linted by Helm itself.

``helm-python-sdk`` (PyPI, pinned in pyproject's dev extra) ships ``libhelm_c``, Helm's
Go SDK built as a C library, inside its manylinux wheel: no helm binary, no Go toolchain
and no network are needed. Every manifest Helm renders for the value sets that matter is
validated against the Kubernetes OpenAPI schemas bundled in ``kubernetes-validate``
(1.29 and the newest it carries; strict: unknown fields fail), the Prometheus Operator
kinds against small structural schemas written here; ``helm lint --strict`` must be clean
for the same value sets and both Kubernetes versions.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from controller.config import TransportConfig, TransportKind, parse_config

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "dispatch-controller"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
CHART_ALERTS = CHART / "files" / "alerts.yaml"

K8S_VERSIONS = ("1.29", latest_version())
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
# The SDK this file was written against: a new pin is a decision, not an accident.
HELM_SDK_VERSION = "v4.2.3"


@dataclass(frozen=True)
class Rendered:
    manifests: dict[str, str]  # template path -> rendered text, NOTES.txt excluded
    notes: str


@cache
def _chart() -> Any:
    return helm.Chart.load(str(CHART))


def render(values: Mapping[str, Any] | None = None) -> Rendered:
    """``helm template rel --namespace batch`` with ``values`` (raises on a ``fail``)."""
    out = _chart().render(dict(values or {}), name="rel", namespace="batch", is_install=True)
    notes = out.pop(f"{CHART.name}/templates/NOTES.txt", "")
    return Rendered(out, notes)


def documents(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    out = []
    for source, text in sorted(render(values).manifests.items()):
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            assert isinstance(doc, dict), f"{source}: a manifest must be a mapping"
            out.append(doc)
    return out


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, *, hook: bool = False) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind)
             if ("helm.sh/hook" in (d["metadata"].get("annotations") or {})) == hook]
    assert len(found) == 1, f"expected one {kind} (hook={hook}), got {len(found)}"
    return found[0]


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over the chart's: maps merge, the rest replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


def chart_values() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def default_values() -> dict[str, Any]:
    return chart_values()


def test_the_pinned_helm_sdk_is_the_one_loaded() -> None:
    assert helm.helm_sdk_version() == HELM_SDK_VERSION
    assert Path(helm.library_path).is_relative_to(Path(helm.__file__).parent), \
        "libhelm_c must come from the wheel, not from HELM_C_LIB or the system"


# ---------------------------------------------------------------- scenarios

SCENARIOS = [
    pytest.param({}, id="defaults"),
    pytest.param({"replicaCount": 3,
                  "database": {"url": "postgresql+psycopg://dispatch@db.batch.svc:5432/dispatch"}},
                 id="postgres-3-replicas"),
    pytest.param({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                  "prometheusRule": {"enabled": True, "labels": {"role": "alerts"}}},
                 id="monitoring"),
    pytest.param({"ssh": {"existingSecret": "slurm-ssh"},
                  "database": {"existingSecret": "dispatch-db", "existingSecretKey": "dsn"},
                  "serviceAccount": {"create": False, "name": "dispatch"},
                  "extraEnv": [{"name": "PGSSLMODE", "value": "require"}],
                  "imagePullSecrets": [{"name": "registry"}],
                  "nodeSelector": {"kubernetes.io/os": "linux"},
                  "tolerations": [{"key": "batch", "operator": "Exists",
                                   "effect": "NoSchedule"}],
                  "affinity": {"podAntiAffinity": {
                      "preferredDuringSchedulingIgnoredDuringExecution": [{
                          "weight": 100, "podAffinityTerm": {
                              "topologyKey": "kubernetes.io/hostname",
                              "labelSelector": {"matchLabels": {
                                  "app.kubernetes.io/name": "dispatch-controller"}}}}]}},
                  "podAnnotations": {"example.org/team": "hpc"},
                  "podLabels": {"team": "hpc"},
                  "image": {"repository": "registry.example.org/dispatch", "tag": "1.2.3"}},
                 id="existing-secrets"),
    pytest.param({"fullnameOverride": "dispatch",
                  "ssh": {"privateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n"
                                        "-----END OPENSSH PRIVATE KEY-----\n",
                          "knownHosts": "login.example.org ssh-ed25519 AAAAC3Nza\n"},
                  "config": {"cluster": {"name": "hpc1"},
                             "transport": {"host": "login.example.org", "port": 2222,
                                           "user": "svc-dispatch",
                                           "command_timeout_s": 12.5},
                             "output": {"dir": "/shared/dispatch/out"},
                             "environment": {"pass": ["PATH", "HOME", "LANG"]},
                             "defaults": {"partition": "batch", "account": "physics",
                                          "exclusive": True},
                             "daemon": {"tick_interval_s": 2.5},
                             "reconcile": {"sacct_window_s": 1209600}}},
                 id="ssh-inline"),
    pytest.param({"replicaCount": 1,
                  "database": {"url": "sqlite:////tmp/dispatch.db"},
                  "migrations": {"enabled": False},
                  "config": {"transport": {"kind": "local", "run_as": "slurm"}}},
                 id="local-single"),
    pytest.param({"config": {"transport": {"kind": "local"}}}, id="local-defaults"),
    pytest.param({"config": {"transport": {"user": ""}}}, id="ssh-container-user"),
]

# config.clusters: one [[clusters]] entry per item. The second item's kind differs from
# config.transport's, so the chart also writes (or clears) the keys of the other kind.
TWO_CLUSTERS: dict[str, Any] = {"config": {
    "defaults": {"account": "physics"},
    "clusters": [
        {"name": "cpu", "transport": {"host": "login-cpu.example.org", "port": 2222},
         "defaults": {"partition": "batch", "exclusive": True}},
        {"name": "gpu", "transport": {"kind": "local", "run_as": "slurm",
                                      "command_timeout_s": 12.5},
         "output": {"dir": "/shared/dispatch/gpu"},
         "environment": {"pass": ["PATH", "CUDA_HOME"]},
         "slurm": {"rate_per_s": 5}},
    ]}}
LOCAL_THEN_SSH: dict[str, Any] = {"config": {
    "transport": {"kind": "local", "run_as": "slurm"},
    "clusters": [{"name": "here"},
                 {"name": "there", "transport": {"kind": "ssh", "host": "login-b",
                                                 "user": ""}}]}}
CLUSTER_SCENARIOS = [
    pytest.param(TWO_CLUSTERS, id="clusters-ssh-and-local"),
    pytest.param(LOCAL_THEN_SSH, id="clusters-local-and-ssh"),
]


# ---------------------------------------------------------------- helm lint, and rules of ours


def kube_version(version: str) -> str:
    """``1.29`` or ``1.37.0`` -> ``v1.29.0`` / ``v1.37.0``, as ``helm lint --kube-version``."""
    return "v" + ".".join([*version.split("."), "0", "0"][:3])


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("values", [*SCENARIOS, *CLUSTER_SCENARIOS])
def test_helm_lint_strict_is_clean(values: dict[str, Any], k8s_version: str) -> None:
    report = helm.lint(str(CHART), dict(values), strict=True, namespace="batch",
                       kube_version=kube_version(k8s_version))
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings, errors
    assert report["total_charts_linted"] == 1
    assert not report["errors"] and not problems, report


def test_chart_yaml_has_required_fields() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == CHART.name
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?",
                        str(chart["version"]))
    assert isinstance(chart["appVersion"], str) and chart["appVersion"]
    assert chart["type"] == "application"
    assert chart["description"]


def _values_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _values_paths(value, path)


def _template_value_refs() -> set[str]:
    refs: set[str] = set()
    for path in (CHART / "templates").iterdir():
        refs.update(m.group(1).lstrip(".") for m in re.finditer(
            r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", path.read_text()))
    return refs


def test_every_referenced_value_exists(default_values: dict[str, Any]) -> None:
    known = set(_values_paths(default_values))
    unknown = sorted(_template_value_refs() - known)
    assert not unknown, f"templates reference values missing from values.yaml: {unknown}"


def test_every_value_is_used(default_values: dict[str, Any]) -> None:
    refs = _template_value_refs()
    unused = [path for path in _values_paths(default_values)
              if not any(path == r or path.startswith(r + ".") or r.startswith(path + ".")
                         for r in refs)]
    assert not unused, f"values.yaml keys no template uses: {unused}"


def test_every_value_is_documented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        if re.match(r"\s*[A-Za-z_][\w.-]*:", line):
            previous = next((p for p in reversed(lines[:i]) if p.strip()), "")
            if not previous.lstrip().startswith("#"):
                undocumented.append(line.strip())
    assert not undocumented, f"values.yaml keys without a comment above: {undocumented}"


# ---------------------------------------------------------------- manifests


SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": "#/$defs/metadata"},
        "spec": {
            "type": "object", "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"$ref": "#/$defs/strings"}}},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array",
                                                  "items": {"type": "string"}},
                                   "any": {"type": "boolean"}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["port"], "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"$ref": "#/$defs/duration"},
                                   "scrapeTimeout": {"$ref": "#/$defs/duration"}}}},
            },
        },
    },
    "$defs": {
        "strings": {"type": "object", "additionalProperties": {"type": "string"}},
        "duration": {"type": "string",
                     "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string"},
                                    "namespace": {"type": "string"},
                                    "labels": {"$ref": "#/$defs/strings"},
                                    "annotations": {"$ref": "#/$defs/strings"}}},
    },
}

PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"$ref": "#/$defs/metadata"},
        "spec": {"$ref": "#/$defs/ruleFile"},
    },
    "$defs": {
        **SERVICE_MONITOR_SCHEMA["$defs"],
        "ruleFile": {
            "type": "object", "required": ["groups"], "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": {"$ref": "#/$defs/duration"},
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                            "record": {"type": "string"},
                            "expr": {"type": "string", "minLength": 1},
                            "for": {"$ref": "#/$defs/duration"},
                            "keep_firing_for": {"$ref": "#/$defs/duration"},
                            "labels": {"$ref": "#/$defs/strings"},
                            "annotations": {"$ref": "#/$defs/strings"},
                        }}},
                }}}},
        },
    },
}

CRD_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR_SCHEMA, "PrometheusRule": PROMETHEUS_RULE_SCHEMA}


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("values", [*SCENARIOS, *CLUSTER_SCENARIOS])
def test_manifests_validate_against_kubernetes_schemas(values: dict[str, Any],
                                                       k8s_version: str) -> None:
    docs = documents(values)
    assert docs
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc["kind"] in CRD_KINDS:
            jsonschema.Draft202012Validator(CRD_SCHEMAS[doc["kind"]]).validate(doc)
            continue
        problem = ""
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problem = f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"
        assert not problem, f"{where} invalid for Kubernetes {k8s_version}: {problem}"


@pytest.mark.parametrize(("values", "kinds"), [
    pytest.param({}, ["ConfigMap", "ConfigMap", "Deployment", "Job", "Secret", "Secret",
                      "Secret", "Service", "ServiceAccount"], id="defaults"),
    pytest.param({"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
                 ["ConfigMap", "ConfigMap", "Deployment", "Job", "PrometheusRule", "Secret",
                  "Secret", "Secret", "Service", "ServiceAccount", "ServiceMonitor"],
                 id="monitoring"),
    pytest.param({"ssh": {"existingSecret": "s"}, "database": {"existingSecret": "d"},
                  "serviceAccount": {"create": False}},
                 ["ConfigMap", "ConfigMap", "Deployment", "Job", "Service"],
                 id="existing-secrets"),
    pytest.param({"migrations": {"enabled": False},
                  "config": {"transport": {"kind": "local"}}},
                 ["ConfigMap", "Deployment", "Secret", "Service", "ServiceAccount"],
                 id="local-no-migrations"),
])
def test_rendered_resources(values: dict[str, Any], kinds: list[str]) -> None:
    assert sorted(d["kind"] for d in documents(values)) == kinds


def test_deployment_contract() -> None:
    docs = documents()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    assert container["args"] == ["run", "--config", "/etc/dispatch/config.toml"]
    assert "command" not in container  # the image's ENTRYPOINT is dispatchctl
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464,
                                   "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DISPATCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "rel-dispatch-controller-database", "key": "url"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/etc/dispatch/config.toml"
    assert mounts["ssh"] == {"name": "ssh", "mountPath": "/etc/dispatch/ssh", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    ssh = volumes["ssh"]["secret"]
    assert ssh["defaultMode"] == 0o400
    assert {i["key"]: i["path"] for i in ssh["items"]} == {"ssh-privatekey": "id_key",
                                                           "known_hosts": "known_hosts"}
    assert pod["automountServiceAccountToken"] is False


def test_references_between_manifests_resolve() -> None:
    docs = documents({"serviceMonitor": {"enabled": True}})
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert ("ServiceAccount", pod["serviceAccountName"]) in names
    for volume in pod["volumes"]:
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in names
        if "secret" in volume:
            assert ("Secret", volume["secret"]["secretName"]) in names
    for env in pod["containers"][0]["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret = next(d for d in docs
                          if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"])
            assert ref["key"] in secret["stringData"]
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    job = one(docs, "Job", hook=True)
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= job_labels.items(), \
        "the Service must not select the migration pod"


def _config_of(doc: dict[str, Any]) -> str:
    text = doc["data"]["config.toml"]
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize("values", SCENARIOS)
def test_config_toml_is_accepted_by_the_config_loader(values: dict[str, Any]) -> None:
    docs = documents(values)
    main = _config_of(one(docs, "ConfigMap"))
    config = parse_config(tomllib.loads(main))
    merged = merge_values(chart_values(), values)["config"]
    assert config.cluster.name == merged["cluster"]["name"]
    assert config.transport.kind is TransportKind(merged["transport"]["kind"])
    assert config.daemon.metrics_host == "0.0.0.0"
    assert config.daemon.metrics_port == merged["daemon"]["metrics_port"]
    assert config.daemon.tick_interval_s == merged["daemon"]["tick_interval_s"]
    assert config.reconcile.sacct_window_s == merged["reconcile"]["sacct_window_s"]
    assert config.reconcile.unknown_grace_s == merged["reconcile"]["unknown_grace_s"]
    assert config.slurm.rate_per_s == merged["slurm"]["rate_per_s"]
    assert list(config.environment.pass_names) == merged["environment"]["pass"]
    for key, value in merged["defaults"].items():
        assert getattr(config.defaults, key) == value, key
    assert config.output.dir == merged["output"]["dir"]
    if config.transport.kind is TransportKind.SSH:
        assert config.transport.host == merged["transport"]["host"]
        assert config.transport.port == merged["transport"]["port"]
        assert config.transport.user == (merged["transport"]["user"] or None)
        assert config.transport.key_file == "/etc/dispatch/ssh/id_key"
        assert config.transport.known_hosts == "/etc/dispatch/ssh/known_hosts"
        assert config.transport.command_timeout_s == merged["transport"]["command_timeout_s"]
    else:
        assert config.transport.run_as == (merged["transport"]["run_as"] or None)
    assert "[database]" not in main, "the URL comes from DISPATCH_DATABASE_URL"
    assert "[[clusters]]" not in main and config.cluster_names == (config.cluster.name,)
    hooks = [d for d in by_kind(docs, "ConfigMap") if d["metadata"].get("annotations")]
    for hook in hooks:  # the migration job reads the same configuration
        assert _config_of(hook) == main


KEY_FILE, KNOWN_HOSTS = "/etc/dispatch/ssh/id_key", "/etc/dispatch/ssh/known_hosts"


def test_clusters_render_one_entry_each_over_the_top_level_groups() -> None:
    docs = documents(TWO_CLUSTERS)
    main = _config_of(one(docs, "ConfigMap"))
    doc = tomllib.loads(main)
    assert "cluster" not in doc and not re.search(r"^\[cluster\]", main, re.MULTILINE)
    assert [entry["name"] for entry in doc["clusters"]] == ["cpu", "gpu"]
    config = parse_config(doc)
    assert config.cluster_names == ("cpu", "gpu")
    assert config.default_cluster.name == "cpu"
    cpu, gpu = config.clusters
    assert cpu.transport == TransportConfig(kind=TransportKind.SSH,
                                            host="login-cpu.example.org", port=2222,
                                            user="dispatch", key_file=KEY_FILE,
                                            known_hosts=KNOWN_HOSTS)
    assert gpu.transport == TransportConfig(kind=TransportKind.LOCAL, run_as="slurm",
                                            command_timeout_s=12.5)
    # the top-level groups are the defaults of every entry, key by key
    assert (cpu.defaults.partition, cpu.defaults.account, cpu.defaults.exclusive) == \
        ("batch", "physics", True)
    assert (gpu.defaults.partition, gpu.defaults.account, gpu.defaults.exclusive) == \
        ("", "physics", False)
    assert (cpu.output.dir, gpu.output.dir) == ("~/.dispatch/output", "/shared/dispatch/gpu")
    assert (cpu.environment.pass_names, gpu.environment.pass_names) == \
        (("PATH",), ("PATH", "CUDA_HOME"))
    assert (cpu.slurm.rate_per_s, gpu.slurm.rate_per_s) == (20, 5)
    for hook in by_kind(docs, "ConfigMap"):  # the migration job reads the same clusters
        assert _config_of(hook) == main


def test_a_cluster_of_another_kind_than_config_transport_gets_its_keys() -> None:
    config = parse_config(tomllib.loads(_config_of(one(documents(LOCAL_THEN_SSH),
                                                       "ConfigMap"))))
    here, there = config.clusters
    assert here.transport == TransportConfig(kind=TransportKind.LOCAL, run_as="slurm")
    assert there.transport == TransportConfig(kind=TransportKind.SSH, host="login-b",
                                              key_file=KEY_FILE, known_hosts=KNOWN_HOSTS)


@pytest.mark.parametrize(("values", "ssh", "hosts"), [
    pytest.param({}, True, "slurm-login", id="one-ssh-cluster"),
    pytest.param(TWO_CLUSTERS, True, "login-cpu.example.org", id="one-of-two-ssh"),
    pytest.param(LOCAL_THEN_SSH, True, "login-b", id="ssh-under-local-top-level"),
    pytest.param({"config": {"clusters": [{"name": "a", "transport": {"kind": "local"}},
                                          {"name": "b", "transport": {"kind": "local"}}]}},
                 False, "", id="no-ssh-cluster"),
])
def test_the_ssh_secret_is_mounted_when_any_cluster_uses_ssh(values: dict[str, Any],
                                                            ssh: bool, hosts: str) -> None:
    docs = documents(values)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert ("ssh" in {v["name"] for v in pod["volumes"]}) is ssh
    assert any(d["kind"] == "Secret" and "known_hosts" in d["stringData"]
               for d in docs) is ssh
    notes = render(values).notes
    assert (f"every\nconnection to {hosts} will be refused" in notes) is ssh


def test_notes_name_the_shards() -> None:
    notes = render(TWO_CLUSTERS).notes
    assert "It drives 2 Slurm cluster(s): cpu, gpu (the first is the default)" in notes
    assert "One replica holds the leader lock" not in notes


def test_config_change_rolls_the_pods() -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = one(documents(values), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({"replicaCount": 3})
    assert checksum({}) != checksum({"config": {"daemon": {"tick_interval_s": 7}}})


def test_migration_runs_as_pre_install_and_pre_upgrade_hook() -> None:
    docs = documents()
    hooks = [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]
    assert sorted(d["kind"] for d in hooks) == ["ConfigMap", "Job", "Secret"]
    weights = {}
    for doc in hooks:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
        weights[doc["kind"]] = int(annotations["helm.sh/hook-weight"])
    # the Job's config and secret exist before the Job (hooks precede ordinary resources)
    assert weights["ConfigMap"] < weights["Job"] and weights["Secret"] < weights["Job"]
    job = one(docs, "Job", hook=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["migrate", "--config", "/etc/dispatch/config.toml"]
    assert pod["restartPolicy"] == "Never"
    assert "serviceAccountName" not in pod  # the chart's account does not exist yet
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    ref = env["DISPATCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "rel-dispatch-controller-migrate", "key": "url"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "rel-dispatch-controller-migrate"


def test_existing_database_secret_is_used_everywhere() -> None:
    docs = documents({"database": {"existingSecret": "db", "existingSecretKey": "dsn"}})
    refs = [e["valueFrom"]["secretKeyRef"]
            for d in docs if d["kind"] in ("Deployment", "Job")
            for c in d["spec"]["template"]["spec"]["containers"]
            for e in c["env"] if e["name"] == "DISPATCH_DATABASE_URL"]
    assert refs == [{"name": "db", "key": "dsn"}] * 2
    assert not any(d["kind"] == "Secret" and "url" in d.get("stringData", {}) for d in docs)


@pytest.mark.parametrize(("values", "message"), [
    pytest.param({"database": {"url": "sqlite:///dispatch.db"}}, "replicaCount > 1",
                 id="sqlite-with-two-replicas"),
    pytest.param({"replicaCount": 3, "database": {"url": "sqlite:////data/dispatch.db"}},
                 "replicaCount > 1", id="sqlite-with-three-replicas"),
    pytest.param({"config": {"transport": {"kind": "telnet"}}}, "must be",
                 id="unknown-transport"),
    pytest.param({"database": {"url": ""}}, "database.url is required", id="no-database"),
    pytest.param({"config": {"transport": {"host": ""}}}, "config.transport.host",
                 id="ssh-without-host"),
    pytest.param({"config": {"clusters": [{"name": "cpu"}, {"name": "gpu"},
                                          {"name": "cpu"}]}},
                 'config.clusters: the cluster name "cpu" is used twice '
                 "(config.clusters[0].name and config.clusters[2].name)",
                 id="duplicate-cluster-names"),
    pytest.param({"config": {"clusters": [{"name": "cpu"}, {"defaults": {}}]}},
                 "config.clusters[1].name is required", id="cluster-without-name"),
    pytest.param({"config": {"clusters": [{"name": "-cpu"}]}},
                 "config.clusters[0].name must be 1-64", id="malformed-cluster-name"),
    pytest.param({"config": {"clusters": [{"name": "cpu", "daemon": {}}]}},
                 "config.clusters[0].daemon is not a key of a cluster",
                 id="cluster-with-shared-group"),
    pytest.param({"config": {"clusters": [{"name": "cpu",
                                           "transport": {"key_file": "/k"}}]}},
                 "config.clusters[0].transport.key_file is not a key of config.transport",
                 id="cluster-with-own-key-file"),
    pytest.param({"config": {"clusters": [{"name": "cpu", "transport": {
                      "kind": "local", "host": "login"}}]}},
                 'config.clusters[0].transport.host applies only to kind "ssh"',
                 id="local-cluster-with-host"),
    pytest.param({"config": {"transport": {"kind": "local", "host": ""},
                             "clusters": [{"name": "cpu", "transport": {"kind": "ssh"}}]}},
                 "config.clusters[0].transport.host is required for the ssh transport",
                 id="ssh-cluster-without-host"),
])
def test_unsafe_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


def test_sqlite_with_one_replica_and_postgres_with_three_render() -> None:
    single = {"replicaCount": 1, "database": {"url": "sqlite:////data/dispatch.db"}}
    assert one(documents(single), "Deployment")["spec"]["replicas"] == 1
    many = {"replicaCount": 3, "database": {"url": "postgresql+psycopg://d@db:5432/d"}}
    assert one(documents(many), "Deployment")["spec"]["replicas"] == 3


def test_notes_render() -> None:
    notes = render().notes
    assert "rel-dispatch-controller" in notes
    assert "WARNING: transport is ssh" in notes
    quiet = render({"ssh": {"existingSecret": "s"}, "serviceMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True}}).notes
    assert "WARNING" not in quiet


def test_chart_embeds_the_alert_rules_verbatim() -> None:
    assert CHART_ALERTS.read_bytes() == ALERTS.read_bytes(), \
        "copy deploy/prometheus/alerts.yaml to helm/dispatch-controller/files/alerts.yaml"
    rule = one(documents({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


