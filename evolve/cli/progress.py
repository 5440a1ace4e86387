"""Live progress for long commands: a rich bar on a terminal, periodic lines otherwise."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from stepml_evolve.evaluator.numbers import fmt

from .console import err


@contextmanager
def fit_progress(console: Console = err, every_s: float = 10.0):
    """Yields a callback(group, iteration, best_loss, evaluations, evals_per_s) for fitting."""
    if console.is_terminal:
        with Progress(
            TextColumn("[bold]fit[/bold] {task.fields[group]}"),
            BarColumn(bar_width=None),
            TextColumn(
                "iter {task.completed:.0f}  best loss {task.fields[best]:.3f}  "
                "{task.fields[evals]} evals  {task.fields[rate]:.1f} evals/s"
            ),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as bar:
            task = bar.add_task("fit", total=None, group="", best=float("nan"), evals=0, rate=0.0)

            def update(group, it, best, evals, rate):
                bar.update(task, completed=it, group=group[:40], best=best, evals=evals, rate=rate)

            yield update
    else:
        last = [0.0]

        def update(group, it, best, evals, rate):
            now = time.monotonic()
            if now - last[0] >= every_s:
                last[0] = now
                console.print(
                    f"fit {group[:40]}: iter {it}, best loss {best:.3f}, {evals} evals, {rate:.1f} evals/s",
                    highlight=False,
                )

        yield update


def _run_line(info: dict) -> str:
    rej = (
        ", ".join(f"{k} {v}" for k, v in sorted(info.get("rejections", {}).items(), key=lambda kv: -kv[1])[:4])
        or "none"
    )
    line = (
        f"gen {info['generation']}  programs {info['programs']} ({info['full']} fully evaluated)  "
        f"best train {fmt(info['best_train'], '.3f', keep_inf=True)}  "
        f"best val {fmt(info['best_val'], '.3f', keep_inf=True)}  "
        f"{info.get('evals_per_s', 0.0):.1f} evals/s  rejected: {rej}"
    )
    if "llm_calls" in info:
        line += f"  LLM {info['llm_calls']} calls, {info['llm_tokens']} tokens, ${info['llm_usd']:.4f}"
    return line


@contextmanager
def run_progress(total: int, start: int, console: Console = err):
    """Yields a callback(info) for the search, generations `start`..`total`: a bar per generation on
    a terminal, lines otherwise."""
    if console.is_terminal:
        with Progress(
            TextColumn("[bold]generation[/bold] {task.completed:.0f}/{task.total:.0f}"),
            BarColumn(bar_width=30),
            TimeElapsedColumn(),
            TextColumn("{task.fields[line]}"),
            console=console,
        ) as bar:
            task = bar.add_task("run", total=total, completed=max(start - 1, 0), line="fitting seeds...")

            def update(info):
                if info.get("notice"):  # a line to keep, above the bar
                    bar.console.print(info["message"], highlight=False, soft_wrap=True)
                elif "message" in info:
                    bar.update(task, line=info["message"])
                else:
                    bar.update(task, completed=info["generation"], line=_run_line(info).split("  ", 1)[1])

            yield update
    else:

        def update(info):
            console.print(info["message"] if "message" in info else _run_line(info), highlight=False, soft_wrap=True)

        yield update
