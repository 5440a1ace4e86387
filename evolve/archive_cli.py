"""`evolve archive ...`: browse a search archive (list, show, pareto, diff) and write the HTML report.

Thin wiring: each command calls one query of archive.browse (or evolve.report_file) and prints
the result, rich tables for people and JSON with --json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from archive.browse import SORT_KEYS, compare_programs, front_programs, list_programs, show_program, show_source
from evaluator.numbers import fmt

from .console import CommandGroup, out
from .report_file import write_report
from .tables import dumps, metrics_table

archive_app = typer.Typer(cls=CommandGroup, no_args_is_help=True,
                          help="Browse a search archive: programs, lineage, Pareto front, diffs, HTML report.")

ArchiveOpt = typer.Option(None, "--archive", help="Archive directory (default: the most recently written one under ./runs).")
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")
SortKey = Literal[SORT_KEYS]


def _programs_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in ("id", "gen", "operator", "train", "val", "test", "quick", "complexity", "cell", "stage", "components"):
        t.add_column(col, justify="left" if col in ("operator", "stage", "components") else "right")
    for r in rows:
        t.add_row(f"{r['id']}{'*' if r['front'] else ''}", str(r["generation"]), escape(r["operator"]),
                  fmt(r["train_loss"]), fmt(r["val_loss"]), fmt(r["test_loss"]), fmt(r["quick_loss"]),
                  str(r["complexity"]), f"{r['cell'][0]},{r['cell'][1]}", r["stage"], escape(" ".join(r["components"])))
    return t


def _print_rows(rows: list[dict], title: str, as_json: bool) -> None:
    """Program rows as JSON (for scripts) or as a table."""
    if as_json:
        print(dumps([{k: v for k, v in r.items() if k != "front"} for r in rows]))
    else:
        out.print(_programs_table(rows, title))


@archive_app.command("list")
def list_cmd(
    archive_dir: Optional[Path] = ArchiveOpt,
    sort: SortKey = typer.Option("val", "--sort", help="Sort key."),
    front: bool = typer.Option(False, "--front", help="Only Pareto-front members."),
    cell: Optional[str] = typer.Option(None, "--cell", help="Only programs in MAP-Elites cell C,N (complexity bin, components)."),
    operator: Optional[str] = typer.Option(None, "--operator", help="Only programs whose operator contains this text."),
    include_screened: bool = typer.Option(False, "--all", help="Include screened-only programs (quick loss only)."),
    as_json: bool = JsonOpt,
):
    """Programs of the archive: operator, losses, complexity, components (* marks the Pareto front)."""
    listing = list_programs(archive_dir, sort=sort, front_only=front, cell=cell, operator=operator,
                            include_screened=include_screened)
    _print_rows(listing.rows, f"{len(listing.rows)} programs in {listing.archive_dir} (sorted by {sort})", as_json)


@archive_app.command("show")
def show_cmd(
    program_id: str = typer.Argument(..., metavar="ID", help="Program id, or 'best' (lowest validation loss)."),
    archive_dir: Optional[Path] = ArchiveOpt,
    as_json: bool = JsonOpt,
    source_only: bool = typer.Option(False, "--source", help="Print only the fitted program, as a file for "
                                     "evolve fit / eval / emit-go or run --seeds."),
):
    """A program: source, fitted constants, descriptors, lineage to a seed, per-experiment errors by split."""
    if source_only:
        print(show_source(archive_dir, program_id), end="")
        return
    detail = show_program(archive_dir, program_id)
    if as_json:
        print(dumps(detail))
        return
    p = detail["program"]
    out.print(f"[bold]program #{p['id']}[/bold]  generation {p['generation']}, {escape(p['operator'])}: "
              f"{escape(p['operator_detail'])}", highlight=False)
    out.print(f"stage {p['stage']}; train loss {fmt(p['train_loss'])}, val {fmt(p['val_loss'])}, test {fmt(p['test_loss'])}, "
              f"quick {fmt(p['quick_loss'])}; complexity {p['complexity']}, {p['n_components']} components "
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


def _lineage_table(steps: list[dict]) -> Table:
    t = Table(title="lineage (first parent back to a seed)")
    for col in ("id", "gen", "operator", "detail", "other parent", "val", "complexity"):
        t.add_column(col, justify="left" if col in ("operator", "detail") else "right")
    for s in steps:
        t.add_row(str(s["id"]), str(s["generation"]), escape(s["operator"]), escape(s["operator_detail"]),
                  ", ".join(str(q) for q in s["other_parents"]) or "-", fmt(s["val_loss"]), str(s["complexity"]))
    return t


@archive_app.command("pareto")
def pareto_cmd(archive_dir: Optional[Path] = ArchiveOpt, as_json: bool = JsonOpt):
    """The Pareto front: validation loss vs complexity, by increasing complexity."""
    listing = front_programs(archive_dir)
    _print_rows(listing.rows, f"Pareto front of {listing.archive_dir} (validation loss vs complexity)", as_json)


@archive_app.command("diff")
def diff_cmd(
    a: str = typer.Argument(..., metavar="A", help="Program id or 'best'."),
    b: str = typer.Argument(..., metavar="B", help="Program id or 'best'."),
    archive_dir: Optional[Path] = ArchiveOpt,
    as_json: bool = JsonOpt,
):
    """Unified diff of two programs' sources and how their losses and per-experiment errors change (B - A)."""
    result = compare_programs(archive_dir, a, b)
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
        t.add_row(name, fmt(c["a"]), fmt(c["b"]), fmt(c["delta"], "+.3g"))
    out.print(t)
    e = Table(title="validate split, APE % of mean E2E and TTFT")
    for col in ("experiment", f"E2E #{ida}", f"E2E #{idb}", "change", f"TTFT #{ida}", f"TTFT #{idb}", "change"):
        e.add_column(col, justify="left" if col == "experiment" else "right")
    for r in result["validate_experiments"]:
        e2e, ttft = r["ape_e2e"], r["ape_ttft"]
        e.add_row(r["name"], fmt(e2e["a"]), fmt(e2e["b"]), fmt(e2e["delta"], "+.3g"),
                  fmt(ttft["a"]), fmt(ttft["b"]), fmt(ttft["delta"], "+.3g"))
    out.print(e)


@archive_app.command("report")
def report_cmd(
    out_path: Path = typer.Option(Path("report.html"), "--out", help="HTML file to write (one self-contained page)."),
    archive_dir: Optional[Path] = ArchiveOpt,
):
    """Write one self-contained HTML page: run summary, plots (inline SVG), program table and sources."""
    written_from = write_report(archive_dir, out_path)
    out.print(f"wrote {out_path} (archive {written_from})", highlight=False)
