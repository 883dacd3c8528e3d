"""The repository is self-contained: every "spec §N" citation resolves in ``docs/spec.md``, and no
tracked file (outside ``benchmarks/results/``, which records runs as they were) points outside
the repository.  Each check has a meta-test that plants the defect it must catch.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "spec.md"

#: Where citations are looked for (top-level folders and files of the repository).
CITING = ("vla_verify", "tests", "docs", "benchmarks", "README.md")
#: Records of past runs keep the wording of their time; they are not documentation.
EXCLUDED = ("benchmarks/results/",)
TEXT_SUFFIXES = {".py", ".md", ".toml", ".ini", ".cfg", ".txt", ".rst", ".yml", ".yaml", ""}

_SECTION_HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
_NUMBER = r"\d+(?:\.\d+)*"
# "spec §2.3", "Spec §2.3–§2.4", "spec §3 C3", "specification §4": one or more section numbers
# joined by a dash, a comma, "and", "or" or "/".
_CITATION = re.compile(
    rf"\bspec(?:ification)?\s*§\s*{_NUMBER}(?:\s*(?:–|-|,|and|or|/)\s*§\s*{_NUMBER})*",
    re.IGNORECASE,
)
_SECTION_NUMBER = re.compile(rf"§\s*({_NUMBER})")

# Names of files that live outside the repository, written so that this file does not match them.
_OUTSIDE = re.compile(
    r"\.\./+shared|shared/+spec|DEVELOPERS\.md|METHOD\.md|H200\.md|KINDS\.md|NOTES_+triton"
    r"|/work/+(?:shared|wt|main|\.library)"
)
_MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def spec_sections(text: str) -> set[str]:
    """The section numbers of a Markdown spec: ``## 1. Notation`` → ``"1"``,
    ``### 2.3 One step`` → ``"2.3"``."""
    return set(_SECTION_HEADING.findall(text))


def spec_citations(text: str) -> list[str]:
    """Every section number cited as "spec §N" in ``text``, in order (ranges give both ends)."""
    return [n for m in _CITATION.finditer(text) for n in _SECTION_NUMBER.findall(m.group(0))]


def unresolved_citations(text: str, sections: set[str]) -> list[str]:
    """The cited section numbers of ``text`` that are not headings of the spec."""
    return [n for n in spec_citations(text) if n not in sections]


def outside_paths(text: str) -> list[str]:
    """Names in ``text`` of files outside the repository."""
    return [m.group(0) for m in _OUTSIDE.finditer(text)]


def broken_links(text: str, where: Path, root: Path) -> list[str]:
    """Relative Markdown links of a file at ``where`` that leave ``root`` or name no file."""
    bad = []
    for target in _MARKDOWN_LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        path = (where.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(root) or not path.exists():
            bad.append(target)
    return bad


def tracked_files() -> list[Path]:
    """The repository's files (``git ls-files`` when git is there, else a walk of CITING)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = [
            str(p.relative_to(ROOT))
            for top in CITING
            for p in ([ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        ]
    files = []
    for name in names:
        path = ROOT / name
        if name.startswith(EXCLUDED) or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        files.append(path)
    return files


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_spec_has_every_section_the_code_relies_on() -> None:
    sections = spec_sections(_read(SPEC))
    expected = {"1", "2", "2.1", "2.2", "2.3", "2.4", "2.5", "3", "4", "5"}
    assert expected <= sections, f"docs/spec.md lacks sections {sorted(expected - sections)}"


def test_every_spec_citation_resolves_in_docs_spec() -> None:
    sections = spec_sections(_read(SPEC))
    bad = {}
    for path in tracked_files():
        rel = str(path.relative_to(ROOT))
        if not rel.startswith(CITING):
            continue
        missing = unresolved_citations(_read(path), sections)
        if missing:
            bad[rel] = sorted(set(missing))
    assert not bad, f"spec citations without a section in docs/spec.md: {bad}"


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    bad = {}
    for path in tracked_files():
        found = outside_paths(_read(path))
        if path.suffix == ".md":
            found += broken_links(_read(path), path, ROOT)
        if found:
            bad[str(path.relative_to(ROOT))] = sorted(set(found))
    assert not bad, f"pointers outside the repository: {bad}"


# -- meta-tests: the same functions catch planted defects ------------------------------------


def test_citation_finder_reads_the_forms_the_code_uses() -> None:
    text = "see spec §2.3; Spec §2.3–§2.4 and spec §3 C3, specification §4.\n§9 alone is not one."
    assert spec_citations(text) == ["2.3", "2.3", "2.4", "3", "4"]


def test_a_planted_bad_citation_is_caught() -> None:
    sections = spec_sections(_read(SPEC))
    assert unresolved_citations("the nudge of spec §2.3", sections) == []
    # The planted numbers are formatted in, so that this file itself cites no missing section.
    bad, worse, deeper = "2.7", "6", "4.2"
    planted = f"the nudge of spec §{bad} and spec §{worse}"
    assert unresolved_citations(planted, sections) == [bad, worse]
    assert unresolved_citations(f"Spec §4–§{deeper}", sections) == [deeper]


def test_planted_outside_pointers_are_caught(tmp_path: Path) -> None:
    planted = "the mathematics is in ../" + "shared/" + "spec/vla.md, see also DEVELOPERS" + ".md"
    assert len(outside_paths(planted)) == 2
    assert outside_paths("the mathematics is docs/spec.md (spec §2.3)") == []
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    (tmp_path / "docs" / "spec.md").write_text("# spec\n")
    text = "[spec](spec.md) [web](https://arxiv.org) [up](../../outside.md) [gone](nothere.md)"
    assert broken_links(text, page, tmp_path) == ["../../outside.md", "nothere.md"]


@pytest.mark.parametrize("heading", ["## 2. The recurrence", "### 2.3 One step", "## 5. Chunked"])
def test_section_headings_are_read(heading: str) -> None:
    number = heading.split()[1].rstrip(".")
    assert spec_sections(heading + "\n") == {number}


def test_the_worked_example_of_spec_2_3_is_what_the_oracle_computes() -> None:
    """The 2-token example of docs/spec.md §2.3, recomputed by the float64 oracle, with the
    spec's figures read from the page (so an edit of either side is caught)."""
    import numpy as np

    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence

    text = _read(SPEC)
    for figure in ("`A_2 = diag(5/6, 3/2)`", "`S_2 = [5/13, 25/13]`", "10/39", "0.245853"):
        assert figure in text, figure
    config = VLAConfig(lambda0=1.0, nudge_eta=0.5, nudge_period=2)
    q = np.array([[1.0, 1.0], [1.0, 1.0]])[None, :, None, :]
    k = np.array([[0.0, 2.0], [3.0, 4.0]])[None, :, None, :]
    u = np.array([[1.0, 0.0], [1.0, 0.0]])[None, :, None, :]
    v = np.array([[1.0], [1.8]])[None, :, None, :]
    run = recurrence(q, k, v, u, config=config)
    S, A, z = run.state
    np.testing.assert_allclose(run.o.ravel(), [0.5, 10 / 39], rtol=1e-12)
    np.testing.assert_allclose(S[0, 0], [[5 / 13, 25 / 13]], rtol=1e-12)
    np.testing.assert_allclose(A[0, 0], np.diag([5 / 6, 3 / 2]), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(z[0, 0], [3.0, 6.0])
    shifted = recurrence(q, k, v, u, config=config, start=1)
    assert round(float(shifted.o.ravel()[1]), 6) == 0.245853
    np.testing.assert_allclose(shifted.state[1][0, 0], np.diag([1 / 2, 3 / 2]), atol=1e-15)
