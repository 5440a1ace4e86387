"""`evolve archive ...`: browse a search archive (list, show, pareto, diff) and write the HTML report.

Thin wiring: the queries live in archive.browse and the page in archive.report; this module
only parses options and prints (rich tables for people, JSON with --json). `evolve.cli` imports
this module at its bottom, so its consoles and `fail` are imported inside the commands.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

archive_app = typer.Typer(no_args_is_help=True, help="Browse a search archive: programs, lineage, Pareto front, diffs, HTML report.")

ArchiveOpt = typer.Option(None, "--archive", help="Archive directory (default: the most recently written one under ./runs).")
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")


def _num(x, digits: int = 3) -> str:
    from archive.report import fmt

    return fmt(x, digits)


def _open(archive_dir: Optional[Path]):
    from archive.browse import BrowseError, open_archive

    from .cli import fail

    try:
        return open_archive(archive_dir)
    except BrowseError as e:
        fail(str(e))


def _guard(fn, *args, **kwargs):
    """Run a browse query; a BrowseError becomes the one-line error and exit code 2."""
    from archive.browse import BrowseError

    from .cli import fail

    try:
        return fn(*args, **kwargs)
    except BrowseError as e:
        fail(str(e))


def _programs_table(rows: list[dict], title: str):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title)
    for col in ("id", "gen", "operator", "train", "val", "test", "quick", "complexity", "cell", "stage", "components"):
        t.add_column(col, justify="left" if col in ("operator", "stage", "components") else "right")
    for r in rows:
        t.add_row(f"{r['id']}{'*' if r['front'] else ''}", str(r["generation"]), escape(r["operator"]),
                  _num(r["train_loss"]), _num(r["val_loss"]), _num(r["test_loss"]), _num(r["quick_loss"]),
                  str(r["complexity"]), f"{r['cell'][0]},{r['cell'][1]}", r["stage"], escape(" ".join(r["components"])))
    return t


def _print_rows(rows: list[dict], title: str, as_json: bool) -> None:
    """Program rows as JSON (for scripts) or as a table."""
    from .cli import out
    from .tables import dumps

    if as_json:
        print(dumps([{k: v for k, v in r.items() if k != "front"} for r in rows]))
    else:
        out.print(_programs_table(rows, title))


@archive_app.command("list")
def list_cmd(
    archive_dir: Optional[Path] = ArchiveOpt,
    sort: str = typer.Option("val", "--sort", help="Sort by id, generation, train, val or complexity."),
    front: bool = typer.Option(False, "--front", help="Only Pareto-front members."),
    cell: Optional[str] = typer.Option(None, "--cell", help="Only programs in MAP-Elites cell C,N (complexity bin, components)."),
    operator: Optional[str] = typer.Option(None, "--operator", help="Only programs whose operator contains this text."),
    include_screened: bool = typer.Option(False, "--all", help="Include screened-only programs (quick loss only)."),
    as_json: bool = JsonOpt,
):
    """Programs of the archive: operator, losses, complexity, components (* marks the Pareto front)."""
    from archive.browse import parse_cell, run_programs, select_rows


    archive = _open(archive_dir)
    _, programs = _guard(run_programs, archive)
    wanted_cell = _guard(parse_cell, cell) if cell else None
    rows = _guard(select_rows, programs, include_screened=include_screened, front_only=front, cell=wanted_cell,
                  operator=operator, sort=sort)
    _print_rows(rows, f"{len(rows)} programs in {archive.dir} (sorted by {sort})", as_json)


@archive_app.command("show")
def show_cmd(
    program_id: str = typer.Argument(..., metavar="ID", help="Program id, or 'best' (lowest validation loss)."),
    archive_dir: Optional[Path] = ArchiveOpt,
    as_json: bool = JsonOpt,
    source_only: bool = typer.Option(False, "--source", help="Print only the fitted program, as a file for "
                                     "evolve fit / eval / emit-go or run --seeds."),
):
    """A program: source, fitted constants, descriptors, lineage to a seed, per-experiment errors by split."""
    from rich.markup import escape
    from rich.syntax import Syntax
    from rich.table import Table

    from archive.browse import program_detail, program_file_text, resolve

    from .cli import out
    from .tables import dumps, metrics_table

    archive = _open(archive_dir)
    record = _guard(resolve, archive, program_id)
    if source_only:
        print(_guard(program_file_text, archive, record), end="")
        return
    detail = _guard(program_detail, archive, record)
    if as_json:
        print(dumps(detail))
        return
    p = detail["program"]
    out.print(f"[bold]program #{p['id']}[/bold]  generation {p['generation']}, {escape(p['operator'])}: "
              f"{escape(p['operator_detail'])}", highlight=False)
    out.print(f"stage {p['stage']}; train loss {_num(p['train_loss'])}, val {_num(p['val_loss'])}, test {_num(p['test_loss'])}, "
              f"quick {_num(p['quick_loss'])}; complexity {p['complexity']}, {p['n_components']} components "
              f"({escape(' '.join(p['components']))}); cell {p['cell'][0]},{p['cell'][1]} ({p['cell_label']})"
              f"{'; on the Pareto front' if p['front'] else ''}", highlight=False)
    out.print(Syntax(p["source"], "python", theme="ansi_dark", word_wrap=True))
    consts = Table(title="fitted constants")
    consts.add_column("constant")
    consts.add_column("value", justify="right")
    for name, value in p["constants"].items():
        consts.add_row(escape(name), f"{value:.6g}")
    out.print(consts)
    out.print(_lineage_table(detail["lineage"]))
    for split, rows in detail["evaluations"].items():
        out.print(metrics_table(rows, f"program #{p['id']}, {split} split"))
    if not detail["evaluations"]:
        out.print(f"no per-experiment evaluations stored (stage {p['stage']}: screened programs get only a quick fit)")


def _lineage_table(steps: list[dict]):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="lineage (first parent back to a seed)")
    for col in ("id", "gen", "operator", "detail", "other parent", "val", "complexity"):
        t.add_column(col, justify="left" if col in ("operator", "detail") else "right")
    for s in steps:
        t.add_row(str(s["id"]), str(s["generation"]), escape(s["operator"]), escape(s["operator_detail"]),
                  ", ".join(str(q) for q in s["other_parents"]) or "-", _num(s["val_loss"]), str(s["complexity"]))
    return t


@archive_app.command("pareto")
def pareto_cmd(archive_dir: Optional[Path] = ArchiveOpt, as_json: bool = JsonOpt):
    """The Pareto front: validation loss vs complexity, by increasing complexity."""
    from archive.browse import pareto_rows, run_programs


    archive = _open(archive_dir)
    _, programs = _guard(run_programs, archive)
    rows = pareto_rows(programs)
    _print_rows(rows, f"Pareto front of {archive.dir} (validation loss vs complexity)", as_json)


@archive_app.command("diff")
def diff_cmd(
    a: str = typer.Argument(..., metavar="A", help="Program id or 'best'."),
    b: str = typer.Argument(..., metavar="B", help="Program id or 'best'."),
    archive_dir: Optional[Path] = ArchiveOpt,
    as_json: bool = JsonOpt,
):
    """Unified diff of two programs' sources and how their losses and per-experiment errors change (B - A)."""
    from rich.table import Table
    from rich.text import Text

    from archive.browse import diff, resolve

    from .cli import out
    from .tables import dumps

    archive = _open(archive_dir)
    result = diff(archive, _guard(resolve, archive, a), _guard(resolve, archive, b))
    if as_json:
        print(dumps(result))
        return
    styles = {"+": "green", "-": "red", "@": "cyan"}
    for line in result["source_diff"] or ["(identical sources)"]:
        out.print(Text(line, style=styles.get(line[:1], "")), soft_wrap=True)
    ida, idb = result["a"]["id"], result["b"]["id"]
    t = Table(title=f"metrics, #{ida} -> #{idb}")
    for col in ("metric", f"#{ida}", f"#{idb}", "change"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for name, c in result["metrics"].items():
        t.add_row(name, _num(c["a"]), _num(c["b"]), _signed(c["delta"]))
    out.print(t)
    e = Table(title="validate split, APE % of mean E2E and TTFT")
    for col in ("experiment", f"E2E #{ida}", f"E2E #{idb}", "change", f"TTFT #{ida}", f"TTFT #{idb}", "change"):
        e.add_column(col, justify="left" if col == "experiment" else "right")
    for r in result["validate_experiments"]:
        e2e, ttft = r["ape_e2e"], r["ape_ttft"]
        e.add_row(r["name"], _num(e2e["a"]), _num(e2e["b"]), _signed(e2e["delta"]),
                  _num(ttft["a"]), _num(ttft["b"]), _signed(ttft["delta"]))
    out.print(e)


def _signed(x) -> str:
    return "n/a" if x is None else f"{x:+.3g}"


@archive_app.command("report")
def report_cmd(
    out_path: Path = typer.Option(Path("report.html"), "--out", help="HTML file to write (one self-contained page)."),
    archive_dir: Optional[Path] = ArchiveOpt,
):
    """Write one self-contained HTML page: run summary, plots (inline SVG), program table and sources."""
    from archive.report import render

    from .cli import fail, out
    from .outputs import OutputError, check_outputs, write_atomic

    archive = _open(archive_dir)
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        check_outputs([out_path])
    except (OutputError, OSError) as e:
        fail(str(e))
    write_atomic(out_path, _guard(render, archive))
    out.print(f"wrote {out_path} (archive {archive.dir})", highlight=False)
