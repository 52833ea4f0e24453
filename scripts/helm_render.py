"""Render a Helm chart without helm: the Go-template subset ``helm/`` uses, and no more.

This is a deliberately small, strict interpreter of Go ``text/template`` with the
few Helm/Sprig functions the chart calls. Anything outside the subset fails with
``TemplateError`` naming the template and line, instead of rendering something
that real Helm would render differently.

Supported:

- text and actions ``{{ ... }}``, trim markers ``{{-``/``-}}``, comments ``{{/* */}}``;
- ``if``/``else if``/``else``, ``with``/``else``, ``range``/``else`` (list or map, the
  dot rebinds, map keys in sorted order), ``define``, ``end``;
- operands: ``.``, ``.a.b``, ``$``, ``$.a.b``, ``"strings"``, raw strings, integers,
  floats, ``true``/``false``/``nil``, ``( pipeline )``; pipelines with ``|``;
- built-in objects ``.Values``, ``.Release.{Name,Namespace,Service,IsInstall,
  IsUpgrade,Revision}``, ``.Chart.{Name,Version,AppVersion,...}``, ``.Files.Get``,
  ``.Template.{Name,BasePath}``;
- functions in ``FUNCTIONS`` below.

Not supported (fails loudly): variables other than ``$``, ``template``/``block``
actions, every other function, missing map keys (Helm would print nothing; here a
``.Values`` key absent from values.yaml is a chart bug). Numbers from values files
are float64, as in Helm, so ``{{ 1000000 }}`` from values prints ``1e+06`` exactly
as Helm does; use ``toYaml``/``toJson``/``int`` for large numbers.

Usage (prints what ``helm template`` would, one ``# Source:`` block per file)::

    .venv/bin/python scripts/helm_render.py helm/dispatch-controller \\
        [-f more-values.yaml]... [--set a.b=value]... [--name NAME] [--namespace NS]
"""

from __future__ import annotations

import argparse
import decimal
import hashlib
import json
import math
import re
import sys
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

MAX_INCLUDE_DEPTH = 100


class TemplateError(Exception):
    """The chart uses syntax or data this renderer does not support, or is wrong."""


# ---------------------------------------------------------------- lexing

_SPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "text" | "action" | "comment"
    value: str
    line: int


def _lex(source: str, name: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    trim_next = False
    while pos < len(source):
        start = source.find("{{", pos)
        text = source[pos:] if start < 0 else source[pos:start]
        if trim_next:
            text = text.lstrip(_SPACE)
        if start < 0:
            if text:
                tokens.append(_Token("text", text, source.count("\n", 0, pos) + 1))
            break
        line = source.count("\n", 0, start) + 1
        inner = start + 2
        if source[inner:inner + 1] == "-" and source[inner + 1:inner + 2] in tuple(_SPACE):
            text = text.rstrip(_SPACE)  # "{{- " trims the text before
            inner += 2
        if text:
            tokens.append(_Token("text", text, line))
        end, body = _scan_action(source, inner, name, line)
        trim_next = body.endswith(tuple(c + "-" for c in _SPACE))  # " -}}" trims after
        if trim_next:
            body = body[:-1]
        content = body.strip(_SPACE)
        if content.startswith("/*"):
            if not content.endswith("*/"):
                raise TemplateError(f"{name}:{line}: unterminated comment")
            tokens.append(_Token("comment", content, line))
        else:
            tokens.append(_Token("action", content, line))
        pos = end
    return tokens


def _scan_action(source: str, pos: int, name: str, line: int) -> tuple[int, str]:
    """Find the ``}}`` closing the action at ``pos``, skipping quoted strings and comments."""
    i = pos
    while i < len(source):
        c = source[i]
        if source.startswith("/*", i):
            close = source.find("*/", i + 2)
            if close < 0:
                raise TemplateError(f"{name}:{line}: unterminated comment")
            i = close + 2
        elif c == '"':
            i += 1
            while i < len(source) and source[i] != '"':
                if source[i] == "\n":
                    raise TemplateError(f"{name}:{line}: unterminated quoted string")
                i += 2 if source[i] == "\\" else 1
            i += 1
        elif c == "`":
            close = source.find("`", i + 1)
            if close < 0:
                raise TemplateError(f"{name}:{line}: unterminated raw string")
            i = close + 1
        elif source.startswith("}}", i):
            return i + 2, source[pos:i]
        else:
            i += 1
    raise TemplateError(f"{name}:{line}: unclosed action")


_WORD_RE = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<field>(?:\$|)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<dot>\.)
  | (?P<root>\$(?![A-Za-z0-9_]))
  | (?P<variable>\$[A-Za-z0-9_]+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[()|])
  | (?P<other>.)
""", re.VERBOSE)

_STRING_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}


def _unquote(text: str, where: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(text) - 1:
        c = text[i]
        if c == "\\":
            escaped = _STRING_ESCAPES.get(text[i + 1])
            if escaped is None:
                raise TemplateError(f"{where}: unsupported escape \\{text[i + 1]}")
            out.append(escaped)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


# ---------------------------------------------------------------- expression AST


@dataclass(frozen=True, slots=True)
class _Field:
    from_root: bool  # "$." rather than "."
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Literal:
    value: Any


@dataclass(frozen=True, slots=True)
class _Ident:
    name: str


@dataclass(frozen=True, slots=True)
class _Pipeline:
    commands: tuple[tuple[Any, ...], ...]  # each command: operands, the first maybe _Ident


def _parse_pipeline(text: str, where: str) -> _Pipeline:
    words: list[tuple[str, str]] = []
    for match in _WORD_RE.finditer(text):
        kind = match.lastgroup or "other"
        if kind == "space":
            continue
        if kind == "variable":
            raise TemplateError(f"{where}: variables ({match.group()}) are not supported")
        if kind == "other":
            raise TemplateError(f"{where}: unsupported syntax {match.group()!r} in {text!r}")
        words.append((kind, match.group()))
    pipeline, rest = _pipeline_words(words, where)
    if rest:
        raise TemplateError(f"{where}: unexpected {rest[0][1]!r} in {text!r}")
    return pipeline


def _pipeline_words(words: list[tuple[str, str]], where: str
                    ) -> tuple[_Pipeline, list[tuple[str, str]]]:
    commands: list[tuple[Any, ...]] = []
    current: list[Any] = []
    i = 0
    while i < len(words):
        kind, word = words[i]
        if word == ")":
            break
        if word == "|":
            if not current:
                raise TemplateError(f"{where}: empty command before |")
            commands.append(tuple(current))
            current = []
            i += 1
            continue
        if word == "(":
            inner, rest = _pipeline_words(words[i + 1:], where)
            if not rest or rest[0][1] != ")":
                raise TemplateError(f"{where}: unclosed (")
            current.append(inner)
            i = len(words) - len(rest) + 1
            continue
        current.append(_operand(kind, word, where))
        i += 1
    if not current:
        raise TemplateError(f"{where}: empty pipeline")
    commands.append(tuple(current))
    return _Pipeline(tuple(commands)), words[i:]


def _operand(kind: str, word: str, where: str) -> Any:
    if kind == "string":
        return _Literal(_unquote(word, where))
    if kind == "raw":
        return _Literal(word[1:-1])
    if kind == "number":
        return _Literal(float(word) if any(c in word for c in ".eE") else int(word))
    if kind == "field":
        from_root = word.startswith("$")
        return _Field(from_root, tuple(word.lstrip("$").split(".")[1:]))
    if kind == "dot":
        return _Field(False, ())
    if kind == "root":
        return _Field(True, ())
    if word in ("true", "false"):
        return _Literal(word == "true")
    if word == "nil":
        return _Literal(None)
    return _Ident(word)


# ---------------------------------------------------------------- template AST


@dataclass(slots=True)
class _Text:
    text: str


@dataclass(slots=True)
class _Action:
    pipeline: _Pipeline
    where: str


@dataclass(slots=True)
class _Block:
    keyword: str  # "if" | "with" | "range"
    pipeline: _Pipeline
    where: str
    body: list[Any] = field(default_factory=list)
    otherwise: list[Any] = field(default_factory=list)


_UNSUPPORTED_KEYWORDS = ("template", "block", "break", "continue")


def _split_keyword(action: str) -> tuple[str, str]:
    parts = action.split(None, 1)
    return (parts[0] if parts else ""), (parts[1].strip() if len(parts) > 1 else "")


def _parse(tokens: list[_Token], name: str, defines: dict[str, list[Any]]) -> list[Any]:
    """Build the node list; ``define`` bodies go into ``defines``."""
    root: list[Any] = []
    # (the node list being filled, what fills it: a _Block, "define", None for the
    # top level, or ("chain", block) for the else-branch an "else if" opened)
    stack: list[tuple[list[Any], Any]] = [(root, None)]
    for token in tokens:
        where = f"{name}:{token.line}"
        nodes = stack[-1][0]
        if token.kind == "text":
            nodes.append(_Text(token.value))
            continue
        if token.kind == "comment":
            continue
        keyword, rest = _split_keyword(token.value)
        if keyword in ("if", "with", "range"):
            block = _Block(keyword, _parse_pipeline(rest, where), where)
            nodes.append(block)
            stack.append((block.body, block))
        elif keyword == "else":
            owner = stack[-1][1]
            if not isinstance(owner, _Block) or nodes is owner.otherwise:
                raise TemplateError(f"{where}: else without if/with/range")
            stack.pop()
            else_keyword, else_rest = _split_keyword(rest)
            if else_keyword == "if" and owner.keyword == "if":
                chained = _Block("if", _parse_pipeline(else_rest, where), where)
                owner.otherwise.append(chained)
                # "else if" shares the outer "end": mark it so "end" pops both.
                stack.append((owner.otherwise, ("chain", owner)))
                stack.append((chained.body, chained))
            elif rest:
                raise TemplateError(f"{where}: unsupported else form {token.value!r}")
            else:
                stack.append((owner.otherwise, owner))
        elif keyword == "end":
            if len(stack) == 1:
                raise TemplateError(f"{where}: end without a block")
            stack.pop()
            while isinstance(stack[-1][1], tuple) and stack[-1][1][0] == "chain":
                stack.pop()
        elif keyword == "define":
            if len(stack) != 1:
                raise TemplateError(f"{where}: define inside a block")
            define_name = _parse_pipeline(rest, where).commands[0][0]
            if not isinstance(define_name, _Literal) or not isinstance(define_name.value, str):
                raise TemplateError(f"{where}: define needs a quoted name")
            body: list[Any] = []
            defines[define_name.value] = body
            stack.append((body, "define"))
        elif keyword in _UNSUPPORTED_KEYWORDS:
            raise TemplateError(f"{where}: {keyword!r} is not supported (use include)")
        else:
            nodes.append(_Action(_parse_pipeline(token.value, where), where))
    if len(stack) != 1:
        raise TemplateError(f"{name}: unclosed block (missing end)")
    return root


# ---------------------------------------------------------------- Go value semantics


def _go_kind(value: Any, where: str) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    raise TemplateError(f"{where}: cannot compare {type(value).__name__}")


def _go_float(value: float) -> str:
    """Go's ``%v`` of a float64: shortest digits; exponent form when exp < -4 or >= 6."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    sign, digits, exponent = decimal.Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    point = len(digits) + exponent  # decimal point position relative to text start
    exp = point - 1
    prefix = "-" if sign else ""
    if exp < -4 or exp >= 6:  # strconv 'g' with shortest precision uses eprec = 6
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{prefix}{text}{'0' * (point - len(text))}"
    return f"{prefix}{text[:point]}.{text[point:]}"


def _go_str(value: Any, where: str) -> str:
    """What ``{{ value }}`` prints (Helm prints nil as nothing)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    raise TemplateError(f"{where}: refusing to print a {type(value).__name__} "
                        "(use toYaml or toJson)")


def _go_quote(text: str) -> str:
    """Go's ``strconv.Quote``."""
    out = ['"']
    escapes = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
               "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    for c in text:
        if c in escapes:
            out.append(escapes[c])
        elif c == " " or (c.isprintable() and unicodedata.category(c)[0] != "Z"):
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def _truth(value: Any) -> bool:
    return bool(value)


def _jsonable(value: Any) -> Any:
    """Helm marshals through JSON: integral float64 values come out as integers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _to_yaml(value: Any) -> str:
    text = yaml.safe_dump(_jsonable(value), default_flow_style=False, sort_keys=True,
                          allow_unicode=True, width=math.inf)
    if text.endswith("...\n"):  # PyYAML's document end marker after a bare scalar
        text = text[:-4]
    return text.removesuffix("\n")


def _to_json(value: Any) -> str:
    text = json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False,
                      sort_keys=True)
    # Go's encoding/json escapes HTML characters.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _want_int(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TemplateError(f"{where}: {what} must be an int, got {value!r} (use int)")
    return value


def _want_str(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise TemplateError(f"{where}: {what} must be a string, got {value!r}")
    return value


# ---------------------------------------------------------------- functions

_Fn = Callable[["_Renderer", str, list[Any]], Any]


def _arity(args: list[Any], count: int, name: str, where: str) -> None:
    if len(args) != count:
        raise TemplateError(f"{where}: {name} takes {count} arguments, got {len(args)}")


def _fn_indent(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 2, "indent", where)
    pad = " " * _want_int(args[0], "indent width", where)
    return pad + _want_str(args[1], "indent text", where).replace("\n", "\n" + pad)


def _fn_nindent(r: _Renderer, where: str, args: list[Any]) -> str:
    return "\n" + _fn_indent(r, where, args)


def _fn_quote(r: _Renderer, where: str, args: list[Any]) -> str:
    return " ".join(_go_quote(_go_str(a, where)) for a in args if a is not None)


def _fn_default(r: _Renderer, where: str, args: list[Any]) -> Any:
    if len(args) == 1:
        return args[0]
    _arity(args, 2, "default", where)
    return args[1] if _truth(args[1]) else args[0]


def _fn_required(r: _Renderer, where: str, args: list[Any]) -> Any:
    _arity(args, 2, "required", where)
    if args[1] is None or args[1] == "":
        raise TemplateError(f"{where}: {args[0]}")
    return args[1]


def _fn_fail(r: _Renderer, where: str, args: list[Any]) -> Any:
    _arity(args, 1, "fail", where)
    raise TemplateError(f"{where}: {args[0]}")


def _fn_trunc(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 2, "trunc", where)
    n = _want_int(args[0], "trunc length", where)
    s = _want_str(args[1], "trunc text", where)
    return s[:n] if n >= 0 else s[n:]


def _fn_trim_suffix(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 2, "trimSuffix", where)
    return _want_str(args[1], "trimSuffix text", where).removesuffix(
        _want_str(args[0], "suffix", where))


def _fn_replace(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 3, "replace", where)
    return _want_str(args[2], "replace text", where).replace(
        _want_str(args[0], "old", where), _want_str(args[1], "new", where))


def _fn_contains(r: _Renderer, where: str, args: list[Any]) -> bool:
    _arity(args, 2, "contains", where)
    return _want_str(args[0], "substring", where) in _want_str(args[1], "text", where)


def _fn_has_prefix(r: _Renderer, where: str, args: list[Any]) -> bool:
    _arity(args, 2, "hasPrefix", where)
    return _want_str(args[1], "text", where).startswith(_want_str(args[0], "prefix", where))


_PRINTF_RE = re.compile(r"%(.)")


def _fn_printf(r: _Renderer, where: str, args: list[Any]) -> str:
    if not args:
        raise TemplateError(f"{where}: printf needs a format")
    fmt = _want_str(args[0], "printf format", where)
    values = iter(args[1:])

    def verb(match: re.Match[str]) -> str:
        v = match.group(1)
        if v == "%":
            return "%"
        if v not in "svdq":
            raise TemplateError(f"{where}: printf verb %{v} is not supported")
        try:
            value = next(values)
        except StopIteration:
            raise TemplateError(f"{where}: printf is missing an argument") from None
        if v == "d":
            return str(_want_int(value, "%d argument", where))
        if v in "sq":
            value = _want_str(value, f"%{v} argument", where)
        return _go_quote(value) if v == "q" else _go_str(value, where)

    out = _PRINTF_RE.sub(verb, fmt)
    if next(values, _MISSING) is not _MISSING:
        raise TemplateError(f"{where}: printf has extra arguments")
    return out


_MISSING = object()


def _fn_eq(r: _Renderer, where: str, args: list[Any]) -> bool:
    if len(args) < 2:
        raise TemplateError(f"{where}: eq needs at least 2 arguments")
    first = args[0]
    for other in args[1:]:
        if first is None or other is None:
            if first is other:
                return True
            continue
        if _go_kind(first, where) != _go_kind(other, where):
            raise TemplateError(f"{where}: eq: incompatible types {first!r} and {other!r}")
        if first == other:
            return True
    return False


def _fn_ne(r: _Renderer, where: str, args: list[Any]) -> bool:
    _arity(args, 2, "ne", where)
    return not _fn_eq(r, where, args)


def _ordered(name: str, test: Callable[[Any, Any], bool]) -> _Fn:
    def fn(r: _Renderer, where: str, args: list[Any]) -> bool:
        _arity(args, 2, name, where)
        kinds = {_go_kind(a, where) for a in args}
        if len(kinds) != 1 or kinds & {"nil", "bool"}:
            raise TemplateError(f"{where}: {name}: incomparable {args[0]!r}, {args[1]!r}")
        return test(args[0], args[1])
    return fn


def _fn_not(r: _Renderer, where: str, args: list[Any]) -> bool:
    _arity(args, 1, "not", where)
    return not _truth(args[0])


def _fn_int(r: _Renderer, where: str, args: list[Any]) -> int:
    _arity(args, 1, "int", where)
    value = args[0]
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[-+]?(?:0|[1-9][0-9]*)", value):
        return int(value)
    if value is None:
        return 0
    raise TemplateError(f"{where}: int of {value!r} is not supported")


def _fn_sha256sum(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 1, "sha256sum", where)
    return hashlib.sha256(_want_str(args[0], "sha256sum input", where).encode()).hexdigest()


def _fn_to_yaml(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 1, "toYaml", where)
    return _to_yaml(args[0])


def _fn_to_json(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 1, "toJson", where)
    return _to_json(args[0])


def _fn_include(r: _Renderer, where: str, args: list[Any]) -> str:
    _arity(args, 2, "include", where)
    return r.include(_want_str(args[0], "include name", where), args[1], where)


def _fn_print(r: _Renderer, where: str, args: list[Any]) -> str:
    # fmt.Sprint: a space between operands when neither side is a string
    out = ""
    for i, arg in enumerate(args):
        if i and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out += " "
        out += _go_str(arg, where)
    return out


FUNCTIONS: dict[str, _Fn] = {
    "include": _fn_include,
    "toYaml": _fn_to_yaml,
    "toJson": _fn_to_json,
    "indent": _fn_indent,
    "nindent": _fn_nindent,
    "quote": _fn_quote,
    "default": _fn_default,
    "required": _fn_required,
    "fail": _fn_fail,
    "trunc": _fn_trunc,
    "trimSuffix": _fn_trim_suffix,
    "replace": _fn_replace,
    "contains": _fn_contains,
    "hasPrefix": _fn_has_prefix,
    "printf": _fn_printf,
    "print": _fn_print,
    "eq": _fn_eq,
    "ne": _fn_ne,
    "lt": _ordered("lt", lambda a, b: a < b),
    "le": _ordered("le", lambda a, b: a <= b),
    "gt": _ordered("gt", lambda a, b: a > b),
    "ge": _ordered("ge", lambda a, b: a >= b),
    "not": _fn_not,
    "int": _fn_int,
    "sha256sum": _fn_sha256sum,
}
_LAZY = ("and", "or")  # short-circuit, return an operand (Go 1.18+)


# ---------------------------------------------------------------- evaluation


class _Files:
    """``.Files``: the chart's plain files, read on demand (.helmignore is not read)."""

    _NOT_FILES = ("Chart.yaml", "values.yaml", "values.schema.json", "templates", "charts")

    def __init__(self, chart_dir: Path) -> None:
        self._dir = chart_dir.resolve()

    def get(self, name: str) -> str:
        path = (self._dir / name).resolve()
        if self._dir not in path.parents or not path.is_file():
            raise TemplateError(f".Files.Get: no file {name!r} in the chart")
        if path.relative_to(self._dir).parts[0] in self._NOT_FILES:
            raise TemplateError(f".Files.Get: {name!r} is not among Helm's .Files")
        return path.read_text(encoding="utf-8")


class _Renderer:
    def __init__(self, defines: dict[str, list[Any]], root: dict[str, Any]) -> None:
        self.defines = defines
        self.root = root
        self.depth = 0

    def include(self, name: str, dot: Any, where: str) -> str:
        body = self.defines.get(name)
        if body is None:
            raise TemplateError(f"{where}: include of undefined template {name!r}")
        if self.depth >= MAX_INCLUDE_DEPTH:
            raise TemplateError(f"{where}: include nested too deeply ({name!r})")
        self.depth += 1
        try:
            return self.run(body, dot)
        finally:
            self.depth -= 1

    def run(self, nodes: list[Any], dot: Any) -> str:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, _Text):
                out.append(node.text)
            elif isinstance(node, _Action):
                out.append(_go_str(self.pipeline(node.pipeline, dot, node.where), node.where))
            else:
                out.append(self.block(node, dot))
        return "".join(out)

    def block(self, node: _Block, dot: Any) -> str:
        value = self.pipeline(node.pipeline, dot, node.where)
        if node.keyword == "if":
            return self.run(node.body if _truth(value) else node.otherwise, dot)
        if node.keyword == "with":
            return self.run(node.body, value) if _truth(value) else self.run(node.otherwise, dot)
        if value is None:
            items: list[Any] = []
        elif isinstance(value, Mapping):
            items = [value[k] for k in sorted(value)]
        elif isinstance(value, list | tuple):
            items = list(value)
        else:
            raise TemplateError(f"{node.where}: range over {type(value).__name__}")
        if not items:
            return self.run(node.otherwise, dot)
        return "".join(self.run(node.body, item) for item in items)

    def pipeline(self, pipeline: _Pipeline, dot: Any, where: str) -> Any:
        value: Any = _MISSING
        for command in pipeline.commands:
            value = self.command(command, dot, where, value)
        return value

    def command(self, command: tuple[Any, ...], dot: Any, where: str, piped: Any) -> Any:
        head, args = command[0], list(command[1:])
        if isinstance(head, _Ident):
            if head.name in _LAZY:
                return self.lazy(head.name, args, dot, where, piped)
            fn = FUNCTIONS.get(head.name)
            if fn is None:
                raise TemplateError(f"{where}: function {head.name!r} is not supported")
            values = [self.operand(a, dot, where) for a in args]
            if piped is not _MISSING:
                values.append(piped)
            return fn(self, where, values)
        if isinstance(head, _Field) and head.names[-2:] == ("Files", "Get"):
            values = [self.operand(a, dot, where) for a in args]
            if piped is not _MISSING:
                values.append(piped)
            _arity(values, 1, ".Files.Get", where)
            files = self.field(_Field(head.from_root, head.names[:-1]), dot, where)
            return files.get(_want_str(values[0], "file name", where))
        if args or piped is not _MISSING:
            raise TemplateError(f"{where}: can't give arguments to a non-function")
        return self.operand(head, dot, where)

    def lazy(self, name: str, args: list[Any], dot: Any, where: str, piped: Any) -> Any:
        operands = [*args, _Literal(piped)] if piped is not _MISSING else args
        if len(operands) < 2:
            raise TemplateError(f"{where}: {name} needs at least 2 arguments")
        value: Any = None
        for operand in operands:  # evaluated one at a time: Go short-circuits
            value = self.operand(operand, dot, where)
            if _truth(value) == (name == "or"):
                return value
        return value

    def operand(self, operand: Any, dot: Any, where: str) -> Any:
        if isinstance(operand, _Literal):
            return operand.value
        if isinstance(operand, _Field):
            return self.field(operand, dot, where)
        if isinstance(operand, _Pipeline):
            return self.pipeline(operand, dot, where)
        if isinstance(operand, _Ident):
            # a bare function name used as an argument is called with no arguments
            return self.command((operand,), dot, where, _MISSING)
        raise TemplateError(f"{where}: unsupported operand {operand!r}")

    def field(self, ref: _Field, dot: Any, where: str) -> Any:
        value = self.root if ref.from_root else dot
        path = "$" if ref.from_root else ""
        for name in ref.names:
            path += "." + name
            if isinstance(value, Mapping):
                if name not in value:
                    raise TemplateError(f"{where}: {path}: no such key")
                value = value[name]
            elif isinstance(value, _Files) and name == "Get":
                raise TemplateError(f"{where}: .Files.Get needs a file name")
            else:
                raise TemplateError(f"{where}: {path}: cannot take a field of "
                                    f"{type(value).__name__}")
        return value


# ---------------------------------------------------------------- values and charts


class GoYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, resolving plain scalars the way Helm's YAML reader does.

    Helm reads values with go-yaml v2 (YAML 1.1) where ``y``/``n`` are booleans,
    ``1e5`` is a float, timestamps stay strings and ``1:30`` is not base 60.
    """

    bool_values: ClassVar[dict[str, bool]] = {
        **yaml.SafeLoader.bool_values, "y": True, "n": False}


_RESOLVED_HERE = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                  "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp"}
GoYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _RESOLVED_HERE]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
GoYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE"
               r"|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"))
GoYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?(?:0b[01_]+|0x[0-9a-fA-F_]+|0[0-7_]+|0|[1-9][0-9_]*)$"),
    list("-+0123456789"))
GoYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """One YAML document, typed as Helm types a values file."""
    return yaml.load(text, Loader=GoYamlLoader)  # a SafeLoader subclass: safe


def _json_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, float):
        return _go_float(key)
    return str(key)


def _helm_numbers(value: Any) -> Any:
    """Values files pass through JSON in Helm: numbers become float64, keys strings."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, Mapping):
        return {_json_key(k): _helm_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_helm_numbers(v) for v in value]
    return value


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing: maps merge key by key, anything else replaces, null deletes."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


def _set_value(raw: str) -> Any:
    """Helm's ``--set`` typing: true/false/null, decimal int64 (not via JSON), else string."""
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    if raw == "0" or (raw[:1] != "0" and re.fullmatch(r"[-+]?[0-9]+", raw)):
        return int(raw)
    return raw


def parse_set(assignments: Sequence[str]) -> dict[str, Any]:
    """``--set a.b=c`` (one assignment each; lists, commas and escapes are not supported)."""
    out: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key or any(c in assignment for c in ",[]{}\\"):
            raise TemplateError(f"--set {assignment!r}: only key.path=value is supported "
                                "(use -f for anything else)")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _set_value(raw)
    return out


@dataclass(frozen=True, slots=True)
class Rendered:
    """Rendered templates by Helm's key (``<chart>/templates/<file>``); NOTES apart."""

    manifests: dict[str, str]
    notes: str


def _chart_object(chart: Mapping[str, Any]) -> dict[str, Any]:
    special = {"apiVersion": "APIVersion", "appVersion": "AppVersion",
               "kubeVersion": "KubeVersion"}
    return {special.get(k, k[:1].upper() + k[1:]): v for k, v in chart.items()}


def render_chart(chart_dir: str | Path, *, values: Mapping[str, Any] | None = None,
                 set_values: Mapping[str, Any] | None = None,
                 release_name: str = "release-name", namespace: str = "default",
                 is_upgrade: bool = False) -> Rendered:
    """Render every template of the chart at ``chart_dir`` as ``helm template`` would.

    ``values`` are typed like a ``-f`` file (numbers become float64); ``set_values``
    like ``--set`` (see ``parse_set``), applied last.
    """
    chart_dir = Path(chart_dir)
    chart = load_yaml((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))
    defaults = load_yaml((chart_dir / "values.yaml").read_text(encoding="utf-8")) or {}
    merged = merge_values(_helm_numbers(merge_values(defaults, values or {})),
                          set_values or {})
    chart_name = str(chart["name"])
    templates_dir = chart_dir / "templates"
    defines: dict[str, list[Any]] = {}
    parsed: dict[str, list[Any]] = {}
    for path in sorted(p for p in templates_dir.rglob("*") if p.is_file()):
        key = f"{chart_name}/{path.relative_to(chart_dir).as_posix()}"
        parsed[key] = _parse(_lex(path.read_text(encoding="utf-8"), key), key, defines)
    root: dict[str, Any] = {
        "Values": merged,
        "Release": {"Name": release_name, "Namespace": namespace, "Service": "Helm",
                    "IsInstall": not is_upgrade, "IsUpgrade": is_upgrade,
                    "Revision": 2 if is_upgrade else 1},
        "Chart": _chart_object(chart),
        "Files": _Files(chart_dir),
        "Capabilities": {},
    }
    manifests: dict[str, str] = {}
    notes = ""
    for key, nodes in parsed.items():
        base = key.rsplit("/", 1)[-1]
        if base.startswith("_"):
            continue
        root["Template"] = {"Name": key, "BasePath": f"{chart_name}/templates"}
        text = _Renderer(defines, root).run(nodes, root)
        if base == "NOTES.txt":
            notes = text
        elif text.strip(_SPACE):
            manifests[key] = text
    return Rendered(manifests, notes)


def iter_documents(rendered: Rendered) -> Iterator[tuple[str, str]]:
    """``(source, document text)`` for every non-empty YAML document, in order."""
    for source, text in rendered.manifests.items():
        for doc in re.split(r"^---[ \t]*$", text, flags=re.MULTILINE):
            if doc.strip(_SPACE) and any(
                    line.strip() and not line.lstrip().startswith("#")
                    for line in doc.splitlines()):
                yield source, doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chart", help="chart directory")
    parser.add_argument("-f", "--values", action="append", default=[],
                        help="extra values file (repeatable)")
    parser.add_argument("--set", action="append", default=[], dest="assignments",
                        help="key.path=value (repeatable)")
    parser.add_argument("--name", default="release-name", help="release name")
    parser.add_argument("--namespace", default="default", help="release namespace")
    parser.add_argument("--notes", action="store_true", help="also print NOTES.txt")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    try:
        for path in args.values:
            values = merge_values(values, load_yaml(Path(path).read_text()) or {})
        rendered = render_chart(args.chart, values=values,
                                set_values=parse_set(args.assignments),
                                release_name=args.name, namespace=args.namespace)
    except (TemplateError, OSError, yaml.YAMLError) as exc:
        print(f"helm_render: error: {exc}", file=sys.stderr)
        return 1
    for source, doc in iter_documents(rendered):
        sys.stdout.write(f"---\n# Source: {source}\n{doc.strip(chr(10))}\n")
    if args.notes and rendered.notes:
        sys.stdout.write(f"\nNOTES:\n{rendered.notes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
