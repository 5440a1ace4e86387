"""SQLite store of a search: runs, programs, evaluations, rejections, LLM calls, generations.

Everything a generation produces is written in one transaction together with its
`generations` row, so a killed run (SIGKILL included) leaves the archive at the end of its
last completed generation: resuming redoes the interrupted generation from scratch, and
because a generation is a deterministic function of (seed, generation, archive state), the
redone generation is the one that would have been written.
"""
from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from evaluator.errors import UserError

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    data_label TEXT NOT NULL,
    data_fingerprint TEXT NOT NULL,
    synthetic INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    config TEXT NOT NULL,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS programs (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    generation INTEGER NOT NULL,
    source_hash TEXT NOT NULL,
    source TEXT NOT NULL,
    constants TEXT NOT NULL,
    parents TEXT NOT NULL,
    operator TEXT NOT NULL,
    operator_detail TEXT NOT NULL DEFAULT '',
    island INTEGER NOT NULL DEFAULT 0,
    complexity INTEGER NOT NULL,
    n_components INTEGER NOT NULL,
    components TEXT NOT NULL,
    quick_loss REAL,
    screen_loss REAL,
    train_loss REAL,
    val_loss REAL,
    test_loss REAL,
    stage TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS programs_hash ON programs(run_id, source_hash);
CREATE TABLE IF NOT EXISTS evaluations (
    program_id INTEGER NOT NULL REFERENCES programs(id),
    experiment TEXT NOT NULL,
    split TEXT NOT NULL,
    n_requests INTEGER NOT NULL,
    observed TEXT NOT NULL,
    predicted TEXT NOT NULL,
    ape_e2e REAL, ape_ttft REAL, ape_itl REAL,
    timeouts_observed INTEGER, timeouts_predicted INTEGER,
    extra TEXT,
    PRIMARY KEY (program_id, experiment, split)
);
CREATE TABLE IF NOT EXISTS rejections (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    operator TEXT NOT NULL,
    parents TEXT NOT NULL,
    rule TEXT NOT NULL,
    reason TEXT NOT NULL,
    source TEXT
);
CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    model TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    latency_s REAL NOT NULL,
    outcome TEXT NOT NULL,
    error TEXT,
    cached INTEGER NOT NULL,
    program_id INTEGER
);
CREATE TABLE IF NOT EXISTS generations (
    run_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    completed REAL NOT NULL,
    seconds REAL NOT NULL,
    n_children INTEGER NOT NULL,
    n_rejected INTEGER NOT NULL,
    n_promoted INTEGER NOT NULL,
    best_train REAL,
    best_val REAL,
    evaluations INTEGER NOT NULL,
    PRIMARY KEY (run_id, generation)
);
"""


@dataclass
class ProgramRecord:
    id: int
    run_id: int
    generation: int
    source_hash: str
    source: str
    constants: dict
    parents: list[int]
    operator: str
    operator_detail: str
    island: int
    complexity: int
    n_components: int
    components: list[str]
    quick_loss: float | None
    screen_loss: float | None
    train_loss: float | None
    val_loss: float | None
    test_loss: float | None
    stage: str  # "seed", "screened" (quick fit only) or "full" (full fit + validation)

    @property
    def full(self) -> bool:
        return self.stage in ("seed", "full") and self.val_loss is not None


class ArchiveError(UserError):
    """An archive file that cannot be used; the message is one line naming the file."""


class Archive:
    FILE = "archive.sqlite"

    def __init__(self, directory: str | Path, create: bool = False, read_only: bool = False):
        """Open (or with create=True, make) the archive in `directory`. read_only opens the
        database without writing anything, so browsing never waits on a running search."""
        self.dir = Path(directory)
        path = self.dir / self.FILE
        if not path.exists() and not create:
            raise FileNotFoundError(f"{path}: no archive here")
        if read_only:
            self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
            self.db.execute("SELECT 1 FROM programs LIMIT 1")  # fails early on a file that is not an archive
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "meta" not in tables:  # never take over someone else's database
                raise ArchiveError(f"{path}: a SQLite database that is not a stepml-evolve archive "
                                   f"(tables: {', '.join(sorted(tables))}); choose another --archive")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise ArchiveError(f"{path}: not a readable archive ({e})") from None
        except ArchiveError:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    # ---- runs ----
    def create_run(self, data_label: str, fingerprint: str, synthetic: bool, seed: int, config: dict) -> int:
        with self.transaction() as db:
            cur = db.execute("INSERT INTO runs (created, data_label, data_fingerprint, synthetic, seed, config) VALUES (?,?,?,?,?,?)",
                             (time.time(), data_label, fingerprint, int(synthetic), seed, json.dumps(config, sort_keys=True)))
            return int(cur.lastrowid)

    def run(self, run_id: int | None = None) -> dict | None:
        q = "SELECT id, created, data_label, data_fingerprint, synthetic, seed, config, summary FROM runs"
        row = self.db.execute(q + (" WHERE id=?" if run_id else " ORDER BY id DESC LIMIT 1"), (run_id,) if run_id else ()).fetchone()
        if not row:
            return None
        return {"id": row[0], "created": row[1], "data_label": row[2], "data_fingerprint": row[3], "synthetic": bool(row[4]),
                "seed": row[5], "config": json.loads(row[6]), "summary": json.loads(row[7]) if row[7] else None}

    def set_summary(self, run_id: int, summary: dict) -> None:
        with self.transaction() as db:
            db.execute("UPDATE runs SET summary=? WHERE id=?", (json.dumps(summary, sort_keys=True), run_id))

    def last_generation(self, run_id: int) -> int:
        row = self.db.execute("SELECT MAX(generation) FROM generations WHERE run_id=?", (run_id,)).fetchone()
        return -1 if row[0] is None else int(row[0])

    def generations(self, run_id: int) -> list[dict]:
        cols = ("generation", "completed", "seconds", "n_children", "n_rejected", "n_promoted", "best_train", "best_val", "evaluations")
        rows = self.db.execute(f"SELECT {', '.join(cols)} FROM generations WHERE run_id=? ORDER BY generation", (run_id,))
        return [dict(zip(cols, r)) for r in rows]

    # ---- programs ----
    _PCOLS = ("id", "run_id", "generation", "source_hash", "source", "constants", "parents", "operator", "operator_detail",
              "island", "complexity", "n_components", "components", "quick_loss", "screen_loss", "train_loss", "val_loss",
              "test_loss", "stage")

    def _program(self, row) -> ProgramRecord:
        d = dict(zip(self._PCOLS, row))
        d["constants"] = json.loads(d["constants"])
        d["parents"] = json.loads(d["parents"])
        d["components"] = json.loads(d["components"])
        return ProgramRecord(**d)

    def programs(self, run_id: int | None = None, where: str = "", args: tuple = ()) -> list[ProgramRecord]:
        clauses = ["run_id=?"] if run_id is not None else []
        params: tuple = (run_id,) if run_id is not None else ()
        if where:
            clauses.append(where)
            params += args
        q = f"SELECT {', '.join(self._PCOLS)} FROM programs" + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY id"
        return [self._program(r) for r in self.db.execute(q, params)]

    def program(self, program_id: int) -> ProgramRecord | None:
        row = self.db.execute(f"SELECT {', '.join(self._PCOLS)} FROM programs WHERE id=?", (program_id,)).fetchone()
        return self._program(row) if row else None

    def has_source(self, run_id: int, source_hash: str) -> int | None:
        row = self.db.execute("SELECT id FROM programs WHERE run_id=? AND source_hash=? ORDER BY id LIMIT 1", (run_id, source_hash)).fetchone()
        return None if row is None else int(row[0])

    def evaluations(self, program_id: int) -> list[dict]:
        cols = ("experiment", "split", "n_requests", "observed", "predicted", "ape_e2e", "ape_ttft", "ape_itl",
                "timeouts_observed", "timeouts_predicted", "extra")
        out = []
        for r in self.db.execute(f"SELECT {', '.join(cols)} FROM evaluations WHERE program_id=? ORDER BY split, experiment", (program_id,)):
            d = dict(zip(cols, r))
            d["observed"], d["predicted"] = json.loads(d["observed"]), json.loads(d["predicted"])
            d["extra"] = json.loads(d["extra"]) if d["extra"] else {}
            out.append(d)
        return out

    def rejections(self, run_id: int) -> list[dict]:
        cols = ("id", "generation", "operator", "parents", "rule", "reason", "source")
        return [dict(zip(cols, r)) for r in self.db.execute(f"SELECT {', '.join(cols)} FROM rejections WHERE run_id=? ORDER BY id", (run_id,))]

    def llm_calls(self, run_id: int) -> list[dict]:
        cols = ("id", "generation", "model", "request_hash", "prompt_tokens", "completion_tokens", "cost_usd", "latency_s",
                "outcome", "error", "cached", "program_id")
        return [dict(zip(cols, r)) for r in self.db.execute(f"SELECT {', '.join(cols)} FROM llm_calls WHERE run_id=? ORDER BY id", (run_id,))]

    # ---- writing one generation ----
    def write_generation(self, run_id: int, generation: int, seconds: float, programs: list[dict], rejections: list[dict],
                         llm_calls: list[dict], stats: dict) -> list[int]:
        """Write a whole generation atomically; returns the new program ids in order.

        programs: dicts with the ProgramRecord fields (no id) plus "evaluations" (metric rows);
        llm_calls may name a program by its index in `programs` under "program_index".
        """
        ids: list[int] = []
        with self.transaction() as db:
            for p in programs:
                cur = db.execute(
                    "INSERT INTO programs (run_id, generation, source_hash, source, constants, parents, operator, operator_detail,"
                    " island, complexity, n_components, components, quick_loss, screen_loss, train_loss, val_loss, test_loss, stage)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, generation, p["source_hash"], p["source"], json.dumps(p["constants"]), json.dumps(p["parents"]),
                     p["operator"], p.get("operator_detail", ""), p.get("island", 0), p["complexity"], p["n_components"],
                     json.dumps(p["components"]), p.get("quick_loss"), p.get("screen_loss"), p.get("train_loss"),
                     p.get("val_loss"), p.get("test_loss"), p["stage"]))
                pid = int(cur.lastrowid)
                ids.append(pid)
                for row in p.get("evaluations", []):
                    extra = {k: row[k] for k in ("e2e_percentiles_s", "error") if k in row}
                    db.execute("INSERT INTO evaluations VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                               (pid, row["name"], row["split"], row["n_requests"], json.dumps(row["observed"]),
                                json.dumps(row["predicted"]), _num(row["ape"]["e2e"]), _num(row["ape"]["ttft"]),
                                _num(row["ape"]["itl"]), row["timeouts"]["observed"], row["timeouts"]["predicted"],
                                json.dumps(extra) if extra else None))
            for rj in rejections:
                db.execute("INSERT INTO rejections (run_id, generation, operator, parents, rule, reason, source) VALUES (?,?,?,?,?,?,?)",
                           (run_id, generation, rj["operator"], json.dumps(rj["parents"]), rj["rule"], rj["reason"], rj.get("source")))
            for c in llm_calls:
                pidx = c.get("program_index")
                db.execute("INSERT INTO llm_calls (run_id, generation, model, request_hash, prompt_tokens, completion_tokens, cost_usd,"
                           " latency_s, outcome, error, cached, program_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                           (run_id, generation, c["model"], c["request_hash"], c["prompt_tokens"], c["completion_tokens"],
                            c["cost_usd"], c["latency_s"], c["outcome"], c.get("error"), int(c.get("cached", False)),
                            ids[pidx] if pidx is not None else None))
            db.execute("INSERT INTO generations VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (run_id, generation, time.time(), seconds, stats.get("n_children", 0), stats.get("n_rejected", 0),
                        stats.get("n_promoted", 0), stats.get("best_train"), stats.get("best_val"), stats.get("evaluations", 0)))
        return ids


def _num(x):
    return x if isinstance(x, (int, float)) and x == x and x not in (float("inf"), float("-inf")) else None
