"""Slurm host lists (``vm``, ``n[1-3,5]``, ``a[01-03]b``, ``rack[1-2]-n[1-2]``) expanded to names.

Pure. Anything this module does not recognise raises ProtocolError: SPEC §4.2 says a
job is never classified without its nodes, so an odd node list fails the read instead
of being guessed at.
"""

from __future__ import annotations

import re

from controller.errors import ProtocolError

MAX_HOSTS = 100_000

# What Slurm prints when a job has no nodes (squeue: "", sacct: "None assigned").
_EMPTY_FORMS = frozenset({"", "(null)", "None assigned"})

# One host-list element: literal name pieces and bracketed range sets, alternating.
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Every host name of ``text`` in Slurm's order (duplicates kept, as Slurm prints them).

    ``""``, ``"(null)"`` and ``"None assigned"`` are the empty list. Unbalanced or nested
    brackets, empty elements, malformed or reversed ranges, characters outside
    ``[A-Za-z0-9._-]`` and expansions of more than ``MAX_HOSTS`` names raise ProtocolError.
    """
    if not isinstance(text, str):
        raise ProtocolError(f"node list is not a string: {text!r:.80}")
    if text.strip() in _EMPTY_FORMS:
        return ()
    hosts: list[str] = []
    for element in _split_top_level(text):
        pieces = _parse_element(element, text)
        _expand_into(pieces, hosts, text)
    return tuple(hosts)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets; refuse unbalanced or nested brackets."""
    elements: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "[":
            if depth:
                raise ProtocolError(f"nested '[' in node list {text!r:.200}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ProtocolError(f"unbalanced ']' in node list {text!r:.200}")
            depth = 0
        elif char == "," and not depth:
            elements.append(text[start:index])
            start = index + 1
    if depth:
        raise ProtocolError(f"unbalanced '[' in node list {text!r:.200}")
    elements.append(text[start:])
    for element in elements:
        if not element:
            raise ProtocolError(f"empty element in node list {text!r:.200}")
    return elements


def _parse_element(element: str, whole: str) -> list[str | list[str]]:
    """``a[01-03]b`` → ``["a", ["01", "02", "03"], "b"]`` (literal pieces and range sets)."""
    pieces: list[str | list[str]] = []
    position = 0
    while position < len(element):
        if element[position] == "[":
            close = element.index("]", position)  # balanced: checked by the splitter
            pieces.append(_parse_ranges(element[position + 1:close], whole))
            position = close + 1
            continue
        match = _NAME_CHARS.match(element, position)
        if match is None:
            raise ProtocolError(
                f"unexpected character {element[position]!r} in node list {whole!r:.200}")
        pieces.append(match.group())
        position = match.end()
    return pieces


def _parse_ranges(body: str, whole: str) -> list[str]:
    """``1-3,5`` → ``["1", "2", "3", "5"]``, zero-padded to the width of each low bound."""
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ProtocolError(f"bad range {part!r} in node list {whole!r:.200}")
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise ProtocolError(f"reversed range {part!r} in node list {whole!r:.200}")
        if len(values) + (high - low + 1) > MAX_HOSTS:
            raise ProtocolError(f"node list expands to more than {MAX_HOSTS} hosts: "
                                f"{whole!r:.200}")
        width = len(low_text)
        values.extend(str(number).zfill(width) for number in range(low, high + 1))
    return values


def _expand_into(pieces: list[str | list[str]], hosts: list[str], whole: str) -> None:
    """Append the cartesian product of ``pieces`` (leftmost range varies slowest)."""
    total = 1
    for piece in pieces:
        if isinstance(piece, list):
            total *= len(piece)
    if len(hosts) + total > MAX_HOSTS:
        raise ProtocolError(f"node list expands to more than {MAX_HOSTS} hosts: {whole!r:.200}")
    names = [""]
    for piece in pieces:
        if isinstance(piece, str):
            names = [name + piece for name in names]
        else:
            names = [name + value for name in names for value in piece]
    hosts.extend(names)
