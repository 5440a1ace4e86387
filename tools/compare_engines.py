"""Side by side: the same scripted LLM through both engines (`evolve run --engine mapelites|openevolve`).

    .venv/bin/python tools/compare_engines.py --calls 20 [--data ../shared/data/replay] [--out DIR] [-- extra run options]
    .venv/bin/python tools/compare_engines.py --worlds [--engines openevolve] [--out DIR] [-- extra bench options, e.g. --size small --generations 4]

A local OpenAI-compatible server plays the LLM. It answers the n-th request by applying the n-th
mutation of a fixed cycle to the program the prompt shows as the one to improve (ours: the first
```python block; OpenEvolve's: the block under "# Current Program"): it adds a fitted constant
times one count component to step_time's return. It answers in the format the prompt asks for:
SEARCH/REPLACE diffs for OpenEvolve, a whole fenced program for ours. Both engines get the same
number of LLM calls (ours: one LLM child per generation, --max-llm-calls CALLS; OpenEvolve:
CALLS iterations), the same seeds, fit budgets and --seed. Prints one JSON line per engine: best
validation and test loss, programs evaluated (archived) and fully fitted, rejections by rule,
LLM calls, wall time. With --worlds, the known-truth benchmark instead (`evolve bench --worlds`,
default --quick) with each engine's searches asking the same server; prints its summary per engine.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from stepml_evolve.evolve.openevolve.local_server import LocalServer, chat_completion  # noqa: E402

COMPONENTS = ["n_req", "n_dc", "tok_pf", "tokens", "n_pf", "layers", "ctx_max"]  # counts: c.k * count is a time
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def current_program(prompt: str) -> str | None:
    """The program a prompt asks to improve (OpenEvolve's whole file, EVOLVE-BLOCK markers included)."""
    at = prompt.find("# Current Program")
    m = FENCE.search(prompt, at if at >= 0 else 0)
    return m.group(1) if m else None


def mutate(program: str, n: int) -> tuple[list[tuple[str, str]], str] | None:
    """The n-th mutation as (search, replace) edits and the program it makes, or None if the
    program has no line `CONSTANTS = {` or no return in step_time."""
    lines = program.splitlines(keepends=True)
    try:
        head = next(i for i, line in enumerate(lines) if line.startswith("CONSTANTS = {"))
        body = next(i for i, line in enumerate(lines) if line.startswith("def step_time("))
        ret = next(i for i in range(body + 1, len(lines)) if lines[i].startswith("    return "))
    except StopIteration:
        return None
    name, comp = f"k_scripted_{n}", COMPONENTS[n % len(COMPONENTS)]
    edits = [
        (
            lines[head],
            lines[head].rstrip("\n") + f'\n    "{name}": {{"start": 1.0, "min": 0.0}},\n'
            if lines[head].strip() == "CONSTANTS = {"
            else lines[head].replace("CONSTANTS = {", f'CONSTANTS = {{"{name}": {{"start": 1.0, "min": 0.0}}, ', 1),
        ),
        (lines[ret], lines[ret].rstrip("\n") + f" + c.{name} * f.{comp}\n"),
    ]
    out = program
    for search, replace in edits:
        out = out.replace(search, replace, 1)
    return edits, out


class MutationLLM:
    def __init__(self):
        self.requests = 0
        self.server = LocalServer(self._answer).__enter__()

    def _answer(self, path: str, body: dict):
        self.requests += 1
        prompt = body["messages"][-1]["content"]
        program, n = current_program(prompt), self.requests
        made = mutate(program, n) if program else None
        if made is None:
            text = "I have no change to suggest."
        elif "SEARCH" in prompt and "REPLACE" in prompt:
            text = "Adds a term.\n" + "".join(f"<<<<<<< SEARCH\n{s}=======\n{r}>>>>>>> REPLACE\n" for s, r in made[0])
        else:
            text = f"Adds a term.\n```python\n{made[1]}```\n"
        usage = {
            "prompt_tokens": len(prompt) // 4,
            "completion_tokens": len(text) // 4,
            "total_tokens": (len(prompt) + len(text)) // 4,
        }
        return 200, chat_completion(text, "mutator", usage, f"m{n}")

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1"


def summarize(archive: Path) -> dict:
    db = sqlite3.connect(archive / "archive.sqlite")
    best = db.execute(
        "SELECT id, val_loss, test_loss FROM programs WHERE val_loss IS NOT NULL ORDER BY val_loss LIMIT 1"
    ).fetchone()
    children = db.execute("SELECT COUNT(*), SUM(stage = 'full') FROM programs WHERE operator != 'seed'").fetchone()
    rules = dict(db.execute("SELECT rule, COUNT(*) FROM rejections GROUP BY rule").fetchall())
    calls = db.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0]
    return {
        "best_id": best[0],
        "best_val": best[1],
        "best_test": best[2],
        "children_archived": children[0],
        "children_fully_fitted": children[1] or 0,
        "rejections": rules,
        "llm_calls": calls,
    }


def worlds(evolve: str, out: Path, extra: list[str], engines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for engine in engines:
        llm = MutationLLM()
        cmd = [evolve, "bench", "--worlds", "--engine", engine, "--llm", "openai/mutator", "--llm-base-url", llm.url]
        t0 = time.perf_counter()
        done = subprocess.run([*cmd, "--out", str(out / engine), "--json", *extra], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{engine}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        report = json.loads(done.stdout)
        wall = round(time.perf_counter() - t0, 1)
        print(json.dumps({"engine": engine, "wall_s": wall, "llm_requests": llm.requests, **report["summary"]}))
        for r in report["results"]:
            losses = {k: round(r[k]["loss"], 2) for k in ("best_seed", "winner", "law")}
            print(json.dumps({"engine": engine, "world": r["world"], "split": r["split"], **losses}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--data", default=None)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="runs/compare-engines")
    ap.add_argument("--worlds", action="store_true", help="the known-truth benchmark instead of one run")
    ap.add_argument(
        "--engines", default="mapelites,openevolve", help="with --worlds: which engines, comma-separated, in order"
    )
    ap.add_argument("extra", nargs="*", help="more `evolve run` (or bench) options for both engines (after --)")
    args = ap.parse_args()
    out = Path(args.out)
    evolve = str(Path(sys.executable).with_name("evolve"))
    if args.worlds:
        worlds(evolve, out, args.extra or ["--quick"], args.engines.split(","))
        return
    for engine in ("mapelites", "openevolve"):
        llm = MutationLLM()
        archive = out / engine
        cmd = [
            evolve,
            "run",
            "--engine",
            engine,
            "--seed",
            str(args.seed),
            "--archive",
            str(archive),
            "--llm",
            "openai/mutator",
            "--llm-base-url",
            llm.url,
            "--front-cv",
            "none",
            *args.extra,
        ]
        cmd += ["--generations", str(args.calls)]
        if engine == "mapelites":
            cmd += ["--children", "1", "--llm-ratio", "1", "--max-llm-calls", str(args.calls)]
        if args.data:
            cmd += ["--data", args.data]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"{engine}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        print(
            json.dumps(
                {"engine": engine, "wall_s": round(wall, 1), "llm_requests": llm.requests, **summarize(archive)}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
