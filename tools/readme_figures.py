"""Copy the figures the README shows from docs/results/index.md, the one table of current figures
(issue 65, item 3), into README.md between its marker comments:

    <!-- figures:begin ROW ROW ... -->
    (the index's header and the named rows, written by this script)
    <!-- figures:end -->

ROW is a row's id in the index (its `<span id="ROW"></span>`). A row is copied as it stands but
for its id, which is dropped, and its links, which are made relative to the README. By default
the README's block is rewritten; with --check nothing is written and the script exits 1 naming
the first row that differs (tests/test_figures_once.py runs the check).

    python tools/readme_figures.py [--check] [--readme README.md] [--index docs/results/index.md]
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"^<!-- figures:begin(?P<ids>(?: [A-Za-z0-9_-]+)+) -->$")
END = "<!-- figures:end -->"
ROW_ID = re.compile(r'<span id="(?P<id>[A-Za-z0-9_-]+)"></span>')
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


class FiguresError(Exception):
    """The index or the README is not laid out as this script expects."""


@dataclass(frozen=True)
class Table:
    header: list[str]  # the header line and the separator line
    rows: dict[str, str]  # row id -> the row's line, in the index's order


def read_index(index: Path) -> Table:
    """The index's table of current figures: its header and its rows by id. The index holds one
    table; every row has an id, and no id is used twice."""
    lines = index.read_text().splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
    ]
    if len(starts) != 1:
        raise FiguresError(f"{index} must hold exactly one table of figures, it holds {len(starts)}")
    start = starts[0]
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    header, body = lines[start : start + 2], lines[start + 2 : end]
    rows: dict[str, str] = {}
    for line in body:
        found = ROW_ID.search(line)
        if not found:
            raise FiguresError(f"{index}: a row without an id (<span id=...></span>): {line[:80]}")
        if found["id"] in rows:
            raise FiguresError(f"{index}: the id {found['id']!r} names two rows")
        rows[found["id"]] = line
    return Table(header, rows)


def relink(line: str, index: Path, readme: Path) -> str:
    """The line's relative links, written relative to the README instead of the index."""

    def move(match: re.Match) -> str:
        target = match["target"]
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        path, hashmark, anchor = target.partition("#")
        moved = os.path.relpath((index.parent / path).resolve(), readme.parent.resolve())
        return f"]({posixpath.normpath(moved.replace(os.sep, '/'))}{hashmark}{anchor})"

    return LINK.sub(move, line)


def readme_row(line: str, index: Path, readme: Path) -> str:
    return relink(ROW_ID.sub("", line), index, readme)


def block_bounds(lines: list[str], readme: Path) -> tuple[int, int, list[str]]:
    """The begin marker's line, the end marker's line and the row ids the begin marker names."""
    begins = [i for i, line in enumerate(lines) if BEGIN.match(line)]
    ends = [i for i, line in enumerate(lines) if line == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise FiguresError(f"{readme} must hold one '<!-- figures:begin ROW ... -->' line and one '{END}' after it")
    ids = BEGIN.match(lines[begins[0]])["ids"].split()
    return begins[0], ends[0], ids


def expected_block(ids: list[str], table: Table, index: Path, readme: Path) -> list[str]:
    unknown = [row for row in ids if row not in table.rows]
    if unknown:
        raise FiguresError(f"{readme} names rows {index} does not hold: {', '.join(unknown)}")
    return table.header + [readme_row(table.rows[row], index, readme) for row in ids]


def first_difference(readme_lines: list[str], expected: list[str], ids: list[str]) -> str | None:
    """None when the README's block is what the index gives; else a sentence naming the first
    row that differs."""
    names = ["the header", "the header's separator"] + [f"row {row!r}" for row in ids]
    for position in range(max(len(readme_lines), len(expected))):
        have = readme_lines[position] if position < len(readme_lines) else None
        want = expected[position] if position < len(expected) else None
        if have != want:
            name = names[position] if position < len(names) else "a line past the named rows"
            return f"README's figures differ from the index at {name}:\n  README: {have}\n  index:  {want}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Copy the README's figures from docs/results/index.md (default), or check them (--check)."
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the first row that differs")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--index", type=Path, default=ROOT / "docs" / "results" / "index.md")
    args = parser.parse_args(argv)
    try:
        table = read_index(args.index)
        text = args.readme.read_text()
        lines = text.splitlines()
        begin, end, ids = block_bounds(lines, args.readme)
        expected = expected_block(ids, table, args.index, args.readme)
    except FiguresError as error:
        print(f"readme_figures: {error}", file=sys.stderr)
        return 2
    current = [line for line in lines[begin + 1 : end] if line.strip()]
    difference = first_difference(current, expected, ids)
    if args.check:
        if difference:
            print(
                f"{difference}\n(python tools/readme_figures.py writes the index's rows into the README)",
                file=sys.stderr,
            )
            return 1
        return 0
    if difference is None:
        return 0
    new = lines[: begin + 1] + [""] + expected + [""] + lines[end:]
    args.readme.write_text("\n".join(new) + ("\n" if text.endswith("\n") else ""))
    print(f"wrote {len(ids)} rows of figures into {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
