"""benchmarks/README.md stays a reader's page (issue 46).

At most 600 lines, no table cell over 300 characters, and every link into README.md or
HISTORY.md lands on a heading. The issue-by-issue record lives in benchmarks/HISTORY.md.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks" / "README.md"
HISTORY = ROOT / "benchmarks" / "HISTORY.md"
MAX_LINES = 600
MAX_CELL = 300


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _outside_fences(lines: list[str]) -> list[str]:
    """The lines not inside a fenced code block (```)."""
    out, fenced = [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def _cells(row: str) -> list[str]:
    """A table row's cells, split on `|` outside backticks and not escaped."""
    cells, cur, in_code, prev = [], [], False, ""
    for ch in row.strip():
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code and prev != "\\":
            cells.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        prev = ch
    cells.append("".join(cur))
    return [c.strip() for c in cells[1:-1]]


def _slug(heading: str) -> str:
    """GitHub's anchor: lowercase, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _outside_fences(_lines(path)):
        m = re.match(r"^#{1,6} (.+?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_readme_within_its_line_limit():
    n = len(_lines(README))
    assert n <= MAX_LINES, (
        f"benchmarks/README.md has {n} lines (limit {MAX_LINES}): move older runs and "
        "narrative to benchmarks/HISTORY.md"
    )


def test_readme_table_cells_are_short():
    long = []
    for no, line in enumerate(_lines(README), 1):
        if not line.lstrip().startswith("|"):
            continue
        for cell in _cells(line):
            if len(cell) > MAX_CELL:
                long.append(f"line {no}: {len(cell)} chars: {cell[:60]}...")
    assert not long, "table cells over 300 characters in benchmarks/README.md:\n" + "\n".join(long)


def test_readme_in_page_links_resolve():
    anchors = _anchors(README)
    text = "\n".join(_outside_fences(_lines(README)))
    broken = sorted({a for a in re.findall(r"\]\(#([^)\s]+)\)", text) if a not in anchors})
    assert not broken, f"README.md links to missing headings: {broken}"


def test_readme_links_into_history_resolve():
    anchors = _anchors(HISTORY)
    text = "\n".join(_outside_fences(_lines(README)))
    links = re.findall(r"\]\(HISTORY\.md#([^)\s]+)\)", text)
    assert links, "README.md should point into HISTORY.md for the older runs"
    broken = sorted({a for a in links if a not in anchors})
    assert not broken, f"README.md links to headings HISTORY.md lacks: {broken}"


def test_cell_split_keeps_code_spans_whole():
    assert _cells("| a | `x | y` | b |") == ["a", "`x | y`", "b"]
    assert _slug("`make serve` start-up") == "make-serve-start-up"
    assert _slug("Against smg 1.13.0 (2026-12-06, the current figure)") == (
        "against-smg-1130-2026-12-06-the-current-figure"
    )


def test_ttft_policy_doc_within_its_limit():
    """docs/ttft_policy.md is read in one sitting: the formula once, a paragraph per term."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "ttft_policy.md"
    lines = doc.read_text().splitlines()
    assert len(lines) <= 250, f"docs/ttft_policy.md has {len(lines)} lines (limit 250)"
    assert sum(line.startswith("cost_w = ") for line in lines) == 1  # the formula, once
