"""Every "SPEC section N" the repository cites resolves to a section of docs/spec.md.

"SPEC" means docs/spec.md (its opening paragraph says so). A citation is written ``SPEC section N``,
``SPEC sections N-M`` / ``N, M`` / ``N and M``, or ``SPEC Eq. N``; a bare ``SPEC N`` or
``SPEC sec N`` is refused so that there is one form to search for. ``stats/native/SPEC.md`` (the
native engine's own specification) and identifiers such as ``SPEC_METRICS`` are not citations.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "spec.md"
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".c", ".h", ".cfg", ".txt"}

# "SPEC" as a word, not "SPEC.md" nor an identifier, then what follows it on the same or the next
# line (comment markers and indentation of a wrapped line folded into one space); a lookahead, so
# two citations on one line are both read.
MENTION = re.compile(
    r"\bSPEC(?![.]md|_|\w)(?=(?P<after>[^\n]*(?:\n[ \t]*(?:#+|//|\*)?[ \t]*[^\n]*)?))"
)
SECTIONS = re.compile(r"^\s+sections?\s+(?P<numbers>\d+(?:\s*(?:-|,|and)\s*\d+)*)")
EQUATION = re.compile(r"^\s+Eq\.\s*(?P<number>\d+)")
LOOSE = re.compile(r"^\s+(?:sec\.?|§|section|sections)?\s*\d")


def tracked_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    here = Path(__file__).resolve()  # its parser test spells the refused forms on purpose
    paths = [ROOT / n for n in names if n and Path(n).suffix in SUFFIXES]
    return [path for path in paths if path.is_file() and path.resolve() != here]


def spec_headings() -> set[int]:
    return {int(m) for m in re.findall(r"^## (\d+)\. ", SPEC.read_text(), re.M)}


def spec_equations() -> set[int]:
    return {int(m) for m in re.findall(r"\*\*Eq\. (\d+)\*\*", SPEC.read_text())}


def cited_numbers(numbers: str) -> list[int]:
    """``"2-3"`` -> [2, 3]; ``"4, 6"`` -> [4, 6]; ``"2 and 12"`` -> [2, 12]."""
    cited: list[int] = []
    for part in re.split(r"\s*(?:,|and)\s*", numbers):
        low, _, high = part.partition("-")
        cited.extend(range(int(low), int(high or low) + 1))
    return cited


def citations(text: str) -> list[tuple[str, int, str]]:
    """(kind, number, the text cited) for each citation; kind "loose" for a non-canonical form."""
    found: list[tuple[str, int, str]] = []
    for mention in MENTION.finditer(text):
        after = re.sub(r"\n[ \t]*(?:#+|//|\*)?[ \t]*", " ", mention.group("after"))
        if sections := SECTIONS.match(after):
            found += [("section", n, sections.group(0)) for n in cited_numbers(sections["numbers"])]
        elif equation := EQUATION.match(after):
            found.append(("equation", int(equation["number"]), equation.group(0)))
        elif LOOSE.match(after):
            found.append(("loose", 0, after[:20]))
    return found


def test_the_parser_reads_every_form_of_citation() -> None:
    text = (
        "(SPEC section 4) SPEC sections 2-3; SPEC sections 4, 6 and 12\n"
        "# the IAC tuple of SPEC\n#   section 5 and SPEC Eq. 1; SPEC 12; SPEC sec 4;"
        " native/SPEC.md, SPEC_METRICS, the SPEC's rule"
    )
    assert [(kind, n) for kind, n, _ in citations(text)] == [
        ("section", 4), ("section", 2), ("section", 3), ("section", 4), ("section", 6),
        ("section", 12), ("section", 5), ("equation", 1), ("loose", 0), ("loose", 0),
    ]  # fmt: skip


def test_docs_spec_has_the_contracts_sections() -> None:
    assert spec_headings() == set(range(1, 13))
    assert spec_equations() == {1}


def test_every_spec_citation_names_a_section_of_docs_spec() -> None:
    sections, equations = spec_headings(), spec_equations()
    files = tracked_files()
    assert len(files) > 100  # the scan sees the repository, not an empty listing
    wrong: list[str] = []
    count = 0
    for path in files:
        for kind, number, cited in citations(path.read_text(errors="replace")):
            count += 1
            where = f"{path.relative_to(ROOT)}: SPEC{cited}"
            if kind == "loose":
                wrong.append(f"{where} (write 'SPEC section N')")
            elif kind == "section" and number not in sections:
                wrong.append(f"{where} (docs/spec.md has no section {number})")
            elif kind == "equation" and number not in equations:
                wrong.append(f"{where} (docs/spec.md names no Eq. {number})")
    assert not wrong, "\n".join(wrong)
    assert count >= 40  # the code cites the contract throughout; a broken scan finds none
