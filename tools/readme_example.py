"""The README's example output (the code block under "## What comes out") from a captured run of
the README's first command (issue 65, item 3), and a check that a fresh run prints it.

    python tools/readme_example.py capture LOG      # write the excerpt of LOG into the README
    python tools/readme_example.py --check LOG      # exit 1 if the README's block is not LOG's

LOG is everything the first command printed, stdout and stderr together (`... 2>&1 | tee LOG`;
pip's output before it is skipped). The excerpt keeps, verbatim, the seeds' lines (every line
between the run's `archive: ... (generations ...)` line and generation 0's), generations 0-2,
`...`, the last generation, the best program's line, the baselines' lines, `...` and the deployed
program's line (the console wraps a long line at 200 columns when it does not print to a
terminal; the wrapped pieces are joined again, which gives back the line as printed). The check compares the README's
block with LOG's excerpt after masking what differs from machine to machine: evaluation rates
(`3.8 evals/s`), durations (`4:18`, `21.8 s`, `(12 s)`, `350 ms`, `2.1 h`), dates and run directories'
timestamps. Everything else, the losses first, must match exactly. .ci/run captures its run of
the first command and runs the check after the tests.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## What comes out"
RUN_HEADER = re.compile(r"^archive: .*\(generations \d+\.\.\d+\)")
GENERATION = re.compile(r"^gen \d+ ")
BEST = "best program by validation loss:"
BASELINE = "baseline "  # a baseline's losses beside the best program's (run --baselines)
DEPLOYED = "deployed by `evolve emit-go`"
KEPT_GENERATIONS = 3  # generations 0-2 are kept, then `...` and the last
MASKS = [
    (re.compile(r"\b\d+(?:\.\d+)? evals/s\b"), "<rate> evals/s"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?\b"), "<date>"),
    (re.compile(r"\b\d{8}-\d{6}\b"), "<timestamp>"),
    (re.compile(r"\b\d+:\d{2}(?::\d{2})?(?:\.\d+)?\b"), "<duration>"),
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:s|ms|min|h)\b"), "<duration>"),
]


class ExampleError(Exception):
    """The log or the README is not laid out as this script expects."""


def _strip(line: str) -> str:
    return line.rstrip("\n").rstrip("\r")


def excerpt(log_text: str) -> list[str]:
    """The README's example block as LOG gives it."""
    lines = [_strip(line) for line in log_text.splitlines()]
    header = next((i for i, line in enumerate(lines) if RUN_HEADER.match(line)), None)
    if header is None:
        raise ExampleError("the log holds no `archive: ... (generations A..B)` line: is it `evolve run`'s output?")
    generations = [i for i, line in enumerate(lines) if i > header and GENERATION.match(line)]
    if not generations:
        raise ExampleError("the log holds no generation lines (`gen N ...`): did the run finish?")
    seeds = [line for line in lines[header + 1 : generations[0]] if line.strip()]
    best = [line for line in lines if line.startswith(BEST)]
    deployed_at = [i for i, line in enumerate(lines) if line.startswith(DEPLOYED)]
    if len(best) != 1 or len(deployed_at) != 1:
        raise ExampleError(
            f"the log must hold one {BEST!r} line and one {DEPLOYED!r} line "
            f"(it holds {len(best)} and {len(deployed_at)}): did the run finish?"
        )
    deployed = piece = lines[deployed_at[0]]
    for line in lines[deployed_at[0] + 1 :]:
        # the console's wrap keeps the space at the end of the piece before: a piece without one ended the line
        if not piece.endswith(" ") or not line.strip() or line.startswith("archive:"):
            break
        deployed += line
        piece = line
    shown = [lines[i] for i in generations[:KEPT_GENERATIONS]]
    if len(generations) > KEPT_GENERATIONS + 1:
        shown.append("...")
    if len(generations) > KEPT_GENERATIONS:
        shown.append(lines[generations[-1]])
    baselines = [line for line in lines if line.startswith(BASELINE)]
    return seeds + shown + [best[0], *baselines, "...", deployed]


def block_bounds(lines: list[str], readme: Path) -> tuple[int, int]:
    """The lines of the README's example block: the first fenced block after HEADING, its
    fences excluded."""
    try:
        heading = lines.index(HEADING)
    except ValueError:
        raise ExampleError(f"{readme} has no {HEADING!r} section") from None
    fences = [i for i, line in enumerate(lines) if i > heading and line.startswith("```")]
    if len(fences) < 2 or any(lines[i].startswith("## ") for i in range(heading + 1, fences[0])):
        raise ExampleError(f"{readme}'s {HEADING!r} section has no code block")
    return fences[0] + 1, fences[1]


def masked(line: str) -> str:
    for pattern, replacement in MASKS:
        line = pattern.sub(replacement, line)
    return line


def first_difference(readme_block: list[str], expected: list[str]) -> str | None:
    """None when the README's block is LOG's excerpt up to timings; else the first line that
    differs, as both print it."""
    for number in range(max(len(readme_block), len(expected))):
        have = readme_block[number] if number < len(readme_block) else None
        want = expected[number] if number < len(expected) else None
        if have is None or want is None or masked(have) != masked(want):
            return (
                f"the README's example output differs from the run's at line {number + 1} of its block "
                f"(timings masked):\n  README: {have}\n  run:    {want}"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        usage="%(prog)s (capture LOG | --check LOG) [--readme README]",
        description="Write the README's example output from a log of its first command (capture LOG), "
        "or check the README against such a log (--check LOG).",
    )
    parser.add_argument("action", nargs="*", metavar="capture LOG", help="write LOG's excerpt into the README")
    parser.add_argument("--check", metavar="LOG", type=Path, help="write nothing; exit 1 if the README's block differs")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args(argv)
    if args.check is not None and args.action:
        parser.error("either `capture LOG` or `--check LOG`")
    if args.check is None and (len(args.action) != 2 or args.action[0] != "capture"):
        parser.error("say `capture LOG` or `--check LOG`")
    log = args.check if args.check is not None else Path(args.action[1])
    try:
        expected = excerpt(log.read_text(errors="replace"))
        text = args.readme.read_text()
        lines = text.splitlines()
        start, end = block_bounds(lines, args.readme)
    except (OSError, ExampleError) as error:
        print(f"readme_example: {error}", file=sys.stderr)
        return 2
    if args.check is not None:
        difference = first_difference(lines[start:end], expected)
        if difference:
            print(
                f"{difference}\n(a fresh clone's run of the README's first command prints something else: "
                f"`python tools/readme_example.py capture LOG` writes the run's output into the README)",
                file=sys.stderr,
            )
            return 1
        print(f"the README's example output is what {log} printed (timings masked)")
        return 0
    new = lines[:start] + expected + lines[end:]
    args.readme.write_text("\n".join(new) + ("\n" if text.endswith("\n") else ""))
    print(f"wrote {len(expected)} lines of {log} into {args.readme}'s example output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
