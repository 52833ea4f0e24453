"""Slurm node lists: every form Slurm prints, and refusal of anything else (SPEC §4.2)."""

from __future__ import annotations

import pytest

from controller.errors import ProtocolError
from controller.slurm.hostlist import MAX_HOSTS, expand_hostlist


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("vm", ("vm",), id="single"),
    pytest.param("", (), id="empty"),
    pytest.param("(null)", (), id="null"),
    pytest.param("None assigned", (), id="sacct-none-assigned"),
    pytest.param("n1,n2", ("n1", "n2"), id="comma-list"),
    pytest.param("n[1-3,5]", ("n1", "n2", "n3", "n5"), id="ranges-and-single"),
    pytest.param("a[01-03]b", ("a01b", "a02b", "a03b"), id="zero-padded-with-suffix"),
    pytest.param("n[8-10]", ("n8", "n9", "n10"), id="width-grows"),
    pytest.param("n[098-100]", ("n098", "n099", "n100"), id="padded-width-kept"),
    pytest.param("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"),
                 id="two-ranges-leftmost-slowest"),
    pytest.param("gpu-a[1-2]-b[3,5]", ("gpu-a1-b3", "gpu-a1-b5", "gpu-a2-b3", "gpu-a2-b5"),
                 id="two-ranges-with-list"),
    pytest.param("n[1-2],login1,m[7]", ("n1", "n2", "login1", "m7"), id="mixed-elements"),
    pytest.param("node.example_1", ("node.example_1",), id="dots-underscores"),
    pytest.param("[1-2]", ("1", "2"), id="bare-range"),
    pytest.param("n[3-3]", ("n3",), id="one-element-range"),
])
def test_expand(text: str, expected: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize("text", [
    pytest.param("n[1-3", id="unclosed"),
    pytest.param("n1-3]", id="unopened"),
    pytest.param("n[1-[2]]", id="nested"),
    pytest.param("n[3-1]", id="reversed"),
    pytest.param("n[]", id="empty-brackets"),
    pytest.param("n[1-]", id="open-range"),
    pytest.param("n[-1]", id="no-low-bound"),
    pytest.param("n[a-c]", id="letters-in-range"),
    pytest.param("n[1-2:2]", id="step-syntax"),
    pytest.param("n[1,,2]", id="empty-range-part"),
    pytest.param("n1,,n2", id="empty-element"),
    pytest.param("n1,", id="trailing-comma"),
    pytest.param(",n1", id="leading-comma"),
    pytest.param("n 1", id="space"),
    pytest.param("n1;n2", id="semicolon"),
    pytest.param("vm\n", id="newline"),
    pytest.param("n[0-100000]", id="too-many-in-one-range"),
    pytest.param("a[1-1000]b[1-1000]", id="too-many-product"),
    pytest.param("n[1-60000],m[1-60000]", id="too-many-in-total"),
])
def test_refuses_unrecognised_forms(text: str) -> None:
    with pytest.raises(ProtocolError):
        expand_hostlist(text)


def test_exactly_the_bound_is_accepted() -> None:
    hosts = expand_hostlist(f"n[1-{MAX_HOSTS}]")
    assert len(hosts) == MAX_HOSTS
    assert hosts[-1] == f"n{MAX_HOSTS}"


def test_refuses_non_string() -> None:
    with pytest.raises(ProtocolError):
        expand_hostlist(None)  # type: ignore[arg-type]
