"""Golden host-side scripts of Output and missing_paths (``controller.slurm.output_scripts``):
the rendered text, byte for byte, for fixed inputs.

Each case renders one script; ``testdata/golden/output/<case>.sh`` is the exact expected
text. Set ``UPDATE_GOLDEN=1`` (or ``pytest --update-golden``) to rewrite the goldens, then
review the diff. Every golden also parses under ``/bin/sh -n``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.errors import ErrInvalid, ProtocolError
from controller.slurm import output_scripts

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = ROOT / "testdata" / "golden" / "output"


def _missing_paths(paths: list[str]) -> str:
    [(start, end, text)] = list(output_scripts.missing_paths_scripts(paths))
    assert (start, end) == (0, len(paths))
    return text


CASES: dict[str, Callable[[], str]] = {
    "cat_manifest": lambda: output_scripts.cat_script(
        "/srv/dispatch/out/01J0000000000000000000000A/s1.manifest"),
    "cat_manifest_home": lambda: output_scripts.cat_script("~/dispatch out/s2.manifest"),
    "read_new_first": lambda: output_scripts.read_new_script(
        "/srv/dispatch/out/01J0000000000000000000000A", "s1-", ".out", {}),
    "read_new_offsets": lambda: output_scripts.read_new_script(
        "~/out dir", "job's s1-", ".err", {"job's s1-7.r1.err": 12, "job's s1-7.err": 4096}),
    "read_new_no_suffix": lambda: output_scripts.read_new_script(
        "/tmp/o", "s3-", "", {"s3-9": 5}),
    "missing_paths": lambda: _missing_paths(
        ["/srv/a/s1-7.slurm", "~/b c/s2-8.slurm", "/srv/it's; rm -rf x", "~"]),
}


def _update_golden() -> bool:
    return os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")


@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in CASES])
def test_output_script_matches_golden(case: str) -> None:
    rendered = CASES[case]().encode("utf-8")
    golden = GOLDEN_DIR / f"{case}.sh"
    if _update_golden():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(rendered)
    assert golden.exists(), f"{golden} missing; run with UPDATE_GOLDEN=1 and review it"
    assert rendered == golden.read_bytes()


@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in CASES])
def test_output_script_is_valid_sh(case: str) -> None:
    result = subprocess.run(["/bin/sh", "-n"], input=CASES[case]().encode(),
                            capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()


def test_every_golden_has_a_case() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.sh")} == set(CASES)


def test_missing_paths_cuts_scripts_by_size_and_refuses_bad_paths() -> None:
    paths = [f"/srv/dispatch/out/{i:06d}/s1-{i}.slurm" for i in range(3000)]
    parts = list(output_scripts.missing_paths_scripts(paths))
    assert parts[0][0] == 0 and parts[-1][1] == len(paths)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    assert all(len(text) < output_scripts.MISSING_PATHS_SCRIPT_LIMIT + 200
               for _, _, text in parts) and len(parts) > 1
    scripts = output_scripts.missing_paths_scripts(["/ok", ""])
    with pytest.raises(ErrInvalid, match="not a path"):
        list(scripts)
    assert output_scripts.missing_indexes("0\n3\n", 4) == [0, 3]
    with pytest.raises(ProtocolError, match="unexpected output"):
        output_scripts.missing_indexes("4\n", 4)
