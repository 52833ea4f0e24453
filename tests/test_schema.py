"""The published job schema and ``parse_job_document`` agree (SPEC §6.1).

No JSON Schema library is a dependency, so this test reads the schema itself:
it builds documents from the schema's own rules (hypothesis) and checks the
parser accepts them, and it checks each rule's edges (unknown keys, required
keys, integer bounds, patterns) against the parser. When ``jsonschema`` happens
to be installed, every generated document is also validated with it.

Known, documented approximation: ``slurmWord`` uses a control-character pattern
for what the parser checks with ``str.isprintable``; generated words are printable.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.errors import ErrInvalid, ErrUnsupported
from controller.model.spec import (
    JobSpec,
    OutputSpec,
    Placement,
    Resources,
    SharedCheckpoint,
    SlurmResources,
    parse_job_document,
    spec_to_document,
)

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "controller" / "schema" / "job.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
MINIMAL = {"command": ["/bin/true"], "workdir": "/w"}

try:  # optional: not a project dependency
    import jsonschema  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the environment
    jsonschema = None


def resolve(node: Any) -> Any:
    """Inline a local ``$ref``; sibling keywords override the referenced ones."""
    if isinstance(node, dict) and "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        return {**resolve(SCHEMA["$defs"][name]),
                **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def inner_pattern(pattern: str) -> str:
    """An ECMA ``^...$`` pattern as a Python fullmatch pattern."""
    assert pattern.startswith("^") and pattern.endswith("$")
    return pattern[1:-1]


def objects(node: Any = SCHEMA, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema with fixed properties, with its dotted document path."""
    node = resolve(node)
    if not isinstance(node, dict):
        return
    if "properties" in node:
        yield path, node
        for key, child in node["properties"].items():
            yield from objects(child, f"{path}.{key}" if path else key)


def put(doc: dict[str, Any], path: str, key: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at ``path.key`` (intermediate objects created)."""
    out = copy.deepcopy(doc)
    target = out
    for part in [p for p in path.split(".") if p]:
        target = target.setdefault(part, {})
    target[key] = value
    return out


def refused(doc: object) -> tuple[type[Exception], str | None] | None:
    try:
        parse_job_document(doc)
    except (ErrInvalid, ErrUnsupported) as exc:
        return type(exc), exc.field
    return None


# ---------------------------------------------------------------- documents from the schema


def strategy(node: Any) -> st.SearchStrategy[Any]:
    node = resolve(node)
    assert node is not False
    if "oneOf" in node:
        return st.one_of([strategy(choice) for choice in node["oneOf"]])
    types = node.get("type", "string")
    if isinstance(types, list):
        return st.one_of([strategy({**node, "type": t}) for t in types])
    if types == "null":
        return st.none()
    if types == "boolean":
        return st.booleans()
    if types == "integer":
        low, high = node["minimum"], node["maximum"]
        return st.one_of(st.integers(low, low + 1000), st.just(high))
    if types == "string":
        text: st.SearchStrategy[str] = (
            st.from_regex(inner_pattern(node["pattern"]), fullmatch=True)
            if "pattern" in node else st.text())
        low, high = node.get("minLength", 0), node.get("maxLength", 10**9)
        text = text.filter(lambda s: low <= len(s) <= high)
        if node.get("description", "").startswith("One line of printable"):
            text = text.filter(str.isprintable)
        return text
    if types == "array" and "prefixItems" not in node:
        return st.lists(strategy(node["items"]), min_size=node.get("minItems", 0),
                        max_size=min(node.get("maxItems", 3), 3),
                        unique=node.get("uniqueItems", False))
    if types == "array":
        first = strategy(node["prefixItems"][0])
        rest = st.lists(strategy(node["items"]), max_size=3)
        return st.tuples(first, rest).map(lambda t: [t[0], *t[1]])
    assert types == "object"
    if "properties" in node:
        props = {k: v for k, v in node["properties"].items() if v is not False}
        required = set(node.get("required", ()))
        return st.fixed_dictionaries(
            {k: strategy(v) for k, v in props.items() if k in required},
            optional={k: strategy(v) for k, v in props.items() if k not in required})
    return st.dictionaries(strategy({**node["propertyNames"], "type": "string"}),
                           strategy(node["additionalProperties"]), max_size=3)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.filter_too_much])
@given(doc=strategy(SCHEMA))
def test_documents_the_schema_allows_are_accepted(doc: dict[str, Any]) -> None:
    if jsonschema is not None:  # pragma: no cover - optional
        jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    spec = parse_job_document(doc)
    assert parse_job_document(spec_to_document(spec)) == spec


# ---------------------------------------------------------------- each rule's edges


def test_schema_header() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["required"] == ["command", "workdir"]
    for _, node in objects():
        assert node.get("additionalProperties") is False, node


def _fields(cls: type) -> set[str]:
    return set(cls.__dataclass_fields__)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("path", "fields"), [
    pytest.param("resources", _fields(Resources), id="resources"),
    pytest.param("extensions.slurm.Placement", _fields(Placement), id="placement"),
    pytest.param("extensions.slurm.Resources", _fields(SlurmResources), id="slurm-resources"),
    pytest.param("extensions.dispatch.Output", _fields(OutputSpec), id="output"),
    pytest.param("extensions.dispatch.SharedCheckpoint", _fields(SharedCheckpoint),
                 id="checkpoint"),
])
def test_object_keys_are_the_model_fields(path: str, fields: set[str]) -> None:
    assert set(dict(objects())[path]["properties"]) == fields


def test_top_level_keys_are_the_spec_fields() -> None:
    by_document_name = {"placement": "extensions", "slurm_resources": "extensions",
                        "output": "extensions", "checkpoint": "extensions",
                        "clusters": "cluster"}
    expected = {by_document_name.get(f, f) for f in _fields(JobSpec)}
    assert set(SCHEMA["properties"]) == expected


@pytest.mark.parametrize("path", [pytest.param(p, id=p or "top") for p, _ in objects()])
def test_unknown_keys_are_refused(path: str) -> None:
    doc = put(MINIMAL, path, "zz_unknown", 1)
    if path.endswith(("Output", "SharedCheckpoint")):  # keep required keys present
        node = dict(objects())[path]
        for key in node.get("required", ()):
            doc = put(doc, path, key, "/x")
    result = refused(doc)
    assert result is not None and result[1] is not None and "zz_unknown" in result[1]


def test_image_and_other_namespaces_are_refused_as_unsupported() -> None:
    assert dict(objects())["extensions.dispatch"]["properties"]["Image"] is False
    assert refused(put(MINIMAL, "extensions.dispatch", "Image", {})) == (
        ErrUnsupported, "extensions.dispatch.Image")
    assert refused(put(MINIMAL, "extensions", "k8s", {}))[0] is ErrUnsupported  # type: ignore[index]


@pytest.mark.parametrize(("path", "key"), [
    pytest.param(p, k, id=f"{p or 'top'}.{k}") for p, node in objects()
    for k in node.get("required", ())
])
def test_required_keys_are_required(path: str, key: str) -> None:
    node = dict(objects())[path]
    if path:
        doc = put(MINIMAL, path, "zz", 0)
        parent = doc
        for part in path.split("."):
            parent = parent[part]
        parent.clear()
        parent.update({other: "/x" for other in node["required"] if other != key})
    else:
        doc = {k: v for k, v in MINIMAL.items() if k != key}
    assert refused(doc) == (ErrInvalid, f"{path}.{key}" if path else key)


def _integers() -> Iterator[Any]:
    for path, node in objects():
        for key, raw in node["properties"].items():
            child = resolve(raw)
            if isinstance(child, dict) and "integer" in child.get("type", ()):
                yield pytest.param(path, key, child, id=f"{path or 'top'}.{key}")


@pytest.mark.parametrize(("path", "key", "node"), list(_integers()))
def test_integer_bounds(path: str, key: str, node: dict[str, Any]) -> None:
    low, high = node["minimum"], node["maximum"]
    field = f"{path}.{key}" if path else key
    for ok in (low, high, None, float(low)):
        assert refused(put(MINIMAL, path, key, ok)) is None, ok
    for bad in (low - 1, high + 1, "1", True, 1.5):
        assert refused(put(MINIMAL, path, key, bad)) == (ErrInvalid, field), bad


# ---------------------------------------------------------------- patterns agree with the parser

_ANY_TEXT = st.lists(st.one_of(st.sampled_from([*"aZ_9-./ \n\t\r\x00é", "DISPATCH_"]),
                               st.characters()), max_size=20).map("".join)


def _agree(pattern_node: dict[str, Any], text: str, doc: object) -> None:
    node = resolve(pattern_node)
    schema_ok = (re.fullmatch(inner_pattern(node["pattern"]), text) is not None
                 and node.get("minLength", 0) <= len(text) <= node.get("maxLength", 10**9))
    assert (refused(doc) is None) == schema_ok, (text, refused(doc))


@settings(max_examples=300, deadline=None)
@given(name=_ANY_TEXT)
def test_env_name_pattern(name: str) -> None:
    _agree({"type": "string", **SCHEMA["properties"]["env"]["propertyNames"]}, name,
           {**MINIMAL, "env": {name: "v"}})


@settings(max_examples=300, deadline=None)
@given(key=_ANY_TEXT, value=_ANY_TEXT)
def test_label_patterns(key: str, value: str) -> None:
    labels = SCHEMA["properties"]["labels"]
    key_node = {"type": "string", **labels["propertyNames"]}
    key_ok = re.fullmatch(inner_pattern(key_node["pattern"]), key) and len(key) <= 63
    if key_ok:
        _agree(labels["additionalProperties"], value, {**MINIMAL, "labels": {key: value}})
    else:
        _agree(key_node, key, {**MINIMAL, "labels": {key: "v"}})


@settings(max_examples=300, deadline=None)
@given(path=_ANY_TEXT.map(lambda s: s.replace("/", "", 1) if s.startswith("//") else s))
def test_absolute_path_pattern(path: str) -> None:
    _agree(SCHEMA["properties"]["workdir"], path, {**MINIMAL, "workdir": path})


@settings(max_examples=200, deadline=None)
@given(name=_ANY_TEXT)
def test_name_pattern(name: str) -> None:
    _agree(SCHEMA["properties"]["name"], name, {**MINIMAL, "name": name})
