"""`evolve run --engine openevolve`: OpenEvolve's controller (`openevolve.run_evolution`) drives
the search; our evaluator judges every candidate and our archive records it.

Who does what:
- OpenEvolve (its worker process) samples a parent from its own MAP-Elites islands, builds its
  prompt (the parent's metrics and artifacts included), asks the LLM and applies the reply (diff
  or rewrite); the main process keeps its population.
- Its evaluator is evolve/openevolve/judge_client.py: it posts the candidate's text to the run's
  judge, an HTTP server on 127.0.0.1 in this process. The judge takes the EVOLVE-BLOCK, parses it
  with the DSL validator (nothing executes it) and runs our cascade on it (`Search.judge`:
  units and duplicates, then quick fit, promotion, full fit and closed-loop replay as
  evolve/search/cascade.py does them for our own loop).
- The same server is OpenEvolve's LLM endpoint: it speaks the OpenAI chat protocol and answers
  through our LLM client (litellm, any provider, with the reply cache and the caps), so replies
  are cached and recorded as in our engine.
- A share of OpenEvolve's LLM calls (--residual) is answered by `residual_term` instead of the LLM:
  a diff that adds to the prompt's current program the term screened best on its residuals
  (evolve/search/residual_terms.py, as our own engine's operator); the candidate is judged and
  archived as a `residual_term` child. A parent no term passes for is a `residual_term` rejection,
  and its call goes to the LLM.
- Every candidate OpenEvolve evaluates reaches its database through our admission hook
  (`PopulationStrategy.admit`): the hook writes it to the archive as one generation, its parent
  mapped to our archive id, and keeps the judge's rejections out of OpenEvolve's population. OpenEvolve's own
  failures (a reply with no code, a diff that does not apply, a failed LLM call) never reach the
  evaluator; they are read from its log and written as rejections.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import signal
import threading
import time
from importlib import metadata
from pathlib import Path

from stepml_evolve.archive.map_elites import best
from stepml_evolve.archive.records import GenerationRecord, LLMCallRecord, NewProgram, RejectionRecord
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.hardware.components import COMPONENTS
from stepml_evolve.evolve.search import Judgement, Search, SearchError
from stepml_evolve.evolve.search.emitters import Proposal, signed_errors
from stepml_evolve.evolve.search.llm_client import LLMClient, LLMUnavailable
from stepml_evolve.evolve.search.llm_operator import Budget, prompt_templates
from stepml_evolve.evolve.search.residual_terms import OPERATOR as RESIDUAL_TERM
from stepml_evolve.evolve.search.residual_terms import ResidualSource, next_child, seed_of

from .judge_client import FAILED, JUDGE_URL_ENV, SEED_ENV
from .local_server import LocalServer, chat_completion

OPERATOR = "openevolve"
SUPPORTED = "0.4"  # OpenEvolve release line the engine is written against (its library API and hooks)
OUTPUT_DIR = "openevolve"  # under the archive directory: OpenEvolve's own logs and its initial program
HEADER = (
    "# A step-time program for stepml-evolve. Only the EVOLVE-BLOCK below is the program; it is\n"
    "# parsed by a validator (a Python subset, see the system message), never executed.\n"
)
BLOCK_START, BLOCK_END = "# EVOLVE-BLOCK-START", "# EVOLVE-BLOCK-END"
REPLY_FORMAT = (
    "The program is shown inside a file, between the lines # EVOLVE-BLOCK-START and "
    "# EVOLVE-BLOCK-END. Change only what is inside that block, and reply in the format the user "
    "message asks for."
)
# the program OpenEvolve's prompt asks to improve (its diff and rewrite templates, 0.4)
CURRENT_PROGRAM = re.compile(r"^# Current Program\n```[a-z]*\n(.*?)\n```", re.S | re.M)
EVALUATION_TIMEOUT_S = 24 * 3600  # OpenEvolve abandons an iteration after this; full fits can take many minutes


def require_openevolve():
    """The openevolve module, or a one-line SearchError naming the release line needed."""
    need = f"--engine openevolve needs OpenEvolve {SUPPORTED}.x (pip install 'openevolve>={SUPPORTED},<0.5')"
    try:
        version = metadata.version("openevolve")
    except metadata.PackageNotFoundError:
        raise SearchError(f"{need}; it is not installed") from None
    if version.split(".")[:2] != SUPPORTED.split("."):
        raise SearchError(f"{need}; found {version}")
    import openevolve

    return openevolve


def as_program_file(source: str) -> str:
    """A DSL program as OpenEvolve's program file: a header and the program as the EVOLVE-BLOCK."""
    return f"{HEADER}{BLOCK_START}\n{source.strip()}\n{BLOCK_END}\n"


def unwrap(text: str) -> tuple[str | None, str]:
    """(the program in the EVOLVE-BLOCK, "") or (None, why not). A file without the markers (a full
    rewrite that dropped them) is all program; with them, nothing outside the block may change."""
    starts, ends = text.count(BLOCK_START), text.count(BLOCK_END)
    if starts == ends == 0:
        return text, ""
    if starts != 1 or ends != 1 or text.index(BLOCK_START) > text.index(BLOCK_END):
        return None, "the file must hold one EVOLVE-BLOCK (one start marker, then one end marker)"
    before, rest = text.split(BLOCK_START, 1)
    block, after = rest.split(BLOCK_END, 1)
    if " ".join(before.split()) != " ".join(HEADER.split()) or after.strip():
        return None, "the reply changed the file outside the EVOLVE-BLOCK"
    return block.strip() + "\n", ""


def code_key(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def metrics_of(j: Judgement) -> dict:
    """OpenEvolve's metrics for a judged candidate. combined_score = 1 / (1 + loss) is monotone in
    our loss (the validation loss; for a child the cascade did not promote, the estimate from its
    quick loss), in (0, 1]; a rejected candidate scores 0."""
    if j.program is None:  # the feature dimensions too: OpenEvolve places every program in its grid
        return dict(FAILED)
    r = j.program.record
    out = {
        "combined_score": 1.0 / (1.0 + j.loss) if math.isfinite(j.loss) else 0.0,
        "valid": 1.0,
        "loss": _finite(j.loss),
        "promoted": float(j.promoted),
        "quick_loss": _finite(r.quick_loss),
        "dsl_complexity": float(r.complexity),
        "n_components": float(r.n_components),
    }
    if j.promoted:
        out.update(train_loss=_finite(r.train_loss), val_loss=_finite(r.val_loss), test_loss=_finite(r.test_loss))
        for row in signed_errors(j.program.evaluations, ("validate",)):
            out[f"e2e_err_pct:{row['experiment']}"] = _finite(row["e2e_err"])
            out[f"ttft_err_pct:{row['experiment']}"] = _finite(row["ttft_err"])
    return {k: v for k, v in out.items() if v is not None}


def artifacts_of(j: Judgement, residual_summary: str = "") -> dict:
    """What OpenEvolve's prompt shows the LLM about a candidate (as the parent of the next one);
    residual_summary: where, inside the experiments, a promoted candidate's error grows."""
    if j.program is None:
        return {"rejected": f"rule {j.rejection.rule}: {j.rejection.reason}"}
    r = j.program.record
    if not j.promoted:
        return {
            "cascade": f"screened only: quick-fit loss {r.quick_loss:.3f} on the screening windows did not beat "
            f"the elites, so it got no full fit (estimated validation loss {j.loss:.3f})"
        }
    lines = ["experiment | split | observed E2E s | E2E error % | observed TTFT s | TTFT error %"]
    for row in signed_errors(j.program.evaluations, ("train", "validate")):
        lines.append(
            f"{row['experiment']} | {row['split']} | {row['e2e_obs']:.3f} | {row['e2e_err']:+.1f} | "
            f"{row['ttft_obs']:.3f} | {row['ttft_err']:+.1f}"
        )
    out = {
        "per_experiment_errors": "\n".join(lines) + "\n(signed: positive means predicted slower than measured)",
        "fitted_constants": json.dumps(r.constants, sort_keys=True),
    }
    if residual_summary:
        out["where_the_error_grows"] = residual_summary + (
            "\n(each request's signed error against what it lived through on the program's own schedule; "
            "rho: rank correlation, eta^2: share of variance; negative: the program is too fast there)"
        )
    return out


# OpenEvolve's own failures, as its main process logs them, and the rule each is recorded under
# 0.4.0 logs "Iteration N error: ...", 0.4.1 "Iteration N error [diff]: ..." (its evolution mode)
_FAILURE = re.compile(r"^Iteration (\d+) error(?: \[[\w-]+\])?: (.*?)(?: \| tokens: .*)?$", re.DOTALL)
_TIMEOUT = re.compile(r"Iteration (\d+) timed out")
_RULES = (
    ("No valid code", "llm-no-code"),
    ("No valid diffs", "llm-diff"),
    ("SEARCH block", "llm-diff"),
    ("Diff did not change", "llm-unchanged"),
    ("identical to the parent", "llm-unchanged"),
    ("EVOLVE-BLOCK", "evolve-block"),
    ("exceeds maximum length", "llm-too-long"),
    ("cap reached", "llm-budget"),
    ("budget reached", "llm-budget"),
    ("LLM", "llm-error"),
)


def failure_rule(message: str) -> str:
    return next((rule for needle, rule in _RULES if needle in message), "openevolve-error")


class Judge:
    """The run's side of OpenEvolve, shared by the HTTP handlers (evaluations, LLM calls) and the
    admission hook and log handler (OpenEvolve's main loop). One lock keeps the search's state
    (its programs, the duplicate filter, the archive) consistent between them."""

    def __init__(self, search: Search, client: LLMClient, budget: Budget, diffs: bool = True):
        self.search, self.client, self.budget = search, client, budget
        self.diffs = diffs  # OpenEvolve asks for SEARCH/REPLACE diffs (else whole programs)
        self.lock = threading.Lock()
        self.calls_lock = threading.Lock()  # for the LLM side alone: a call never waits for a fit
        self.judged: dict[str, list[Judgement]] = {}  # code key -> judgements not yet recorded (FIFO)
        self.known: dict[str, Judgement] = {}  # code key -> a program OpenEvolve starts from, as archived
        self.ids: dict[str, int] = {}  # OpenEvolve program id -> archive id
        self.by_code: dict[str, int] = {}  # code key -> archive id (OpenEvolve copies programs between islands)
        self.calls: list[LLMCallRecord] = []  # LLM attempts not yet written (they go with the next generation)
        self.asked: dict[str, int] = {}  # how often each prompt was asked (OpenEvolve repeats prompts)
        self.last = time.perf_counter()
        # where a promoted candidate's error grows, for its artifacts (evaluator/discovery), and the
        # screenings residual_term answers a share of the LLM calls with
        self.residuals = ResidualSource(search.cascade.pool, search.cascade.exps, search.cfg.residual_refit)
        self.tried: set[str] = set()  # structures residual_term proposed
        self.aimed: dict[str, tuple[int, str]] = {}  # a residual_term child's block key -> (parent id, what it adds)
        self.refused: list[RejectionRecord] = []  # residual_term rejections not yet written

    # ---- HTTP side (server threads) ----
    def evaluate(self, code: str) -> dict:
        key = code_key(code)
        with self.lock:
            if key in self.known:
                j = self.known[key]
            else:
                j = self._judge(code)
                self.judged.setdefault(key, []).append(j)
            summary = ""
            if j.program is not None and j.promoted:
                record = j.program.record
                summary = self.residuals.summary(key, parse_program(record.source), record.constants)
        return {"metrics": metrics_of(j), "artifacts": artifacts_of(j, summary)}

    def _judge(self, code: str) -> Judgement:
        block, why = unwrap(code)
        if block is None:
            return Judgement(
                None,
                RejectionRecord(operator=OPERATOR, parents=[], rule="evolve-block", reason=why, source=code),
                math.inf,
            )
        parent, detail = self.aimed.get(code_key(block.strip()), (None, ""))
        proposal = (
            Proposal(RESIDUAL_TERM, [parent], block, detail) if parent is not None else Proposal(OPERATOR, [], block)
        )
        try:
            return self.search.judge(proposal)
        except Exception as e:  # noqa: BLE001 - a candidate that breaks the judge is a rejection, not a crashed run
            logging.getLogger(__name__).exception("stepml-evolve judge failed on a candidate")
            return Judgement(
                None,
                RejectionRecord(
                    operator=proposal.operator,
                    parents=proposal.parents,
                    rule="evaluation",
                    reason=f"the judge failed: {type(e).__name__}: {e}",
                    source=block,
                ),
                math.inf,
            )

    def start_from(self, code: str, program: NewProgram, loss: float) -> None:
        """`code` (an archived program, wrapped) is where OpenEvolve starts: judged as archived."""
        self.known[code_key(code)] = Judgement(program, None, loss)

    def chat(self, body: dict) -> tuple[int, dict]:
        """An OpenAI chat completion answered through our LLM client (cache, retries, caps)."""
        if why := self.budget.exhausted():
            return 400, {"error": {"message": why, "type": "budget"}}
        messages = body.get("messages") or []
        prompt = code_key(json.dumps(messages, sort_keys=True))
        with self.calls_lock:
            n = self.asked[prompt] = self.asked.get(prompt, 0) + 1
        if self._residual_turn(prompt, n) and (aimed := self._residual_reply(messages)):
            usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}  # no LLM was asked
            return 200, chat_completion(aimed, self.client.model, usage, f"stepml-{RESIDUAL_TERM}-{prompt[:16]}-{n}")
        try:  # the n-th asking of a prompt has its own cached reply, so a replay repeats the run
            reply = self.client.complete(
                messages, may_retry=lambda pending: self.budget.exhausted(pending) is None, tag=f"openevolve:{n}"
            )
        except LLMUnavailable as e:
            self._spend(e.attempts)
            return 503, {"error": {"message": f"LLM call failed: {e}", "type": "upstream"}}
        self._spend(reply.attempts)
        last = reply.attempts[-1]
        usage = {
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens,
        }
        return 200, chat_completion(reply.content, self.client.model, usage, f"stepml-{last.request_hash[:16]}")

    def _residual_turn(self, prompt: str, n: int) -> bool:
        """Whether residual_term answers the n-th asking of this prompt: its share of the calls, drawn
        from the run's seed and the prompt, so a replayed run answers the same calls alike."""
        share = self.search.cfg.residual
        if share <= 0:
            return False
        draw = hashlib.sha256(f"{self.search.cfg.seed}:{prompt}:{n}".encode()).digest()
        return int.from_bytes(draw[:8], "big") / 2**64 < share

    def _residual_reply(self, messages: list) -> str | None:
        """A diff that adds the best screened term to the prompt's current program (an archived
        program, found by its code), or None: the program is not archived, or no term passed for it
        (a `residual_term` rejection written), and the LLM answers instead."""
        text = "\n".join(m.get("content") or "" for m in messages if isinstance(m.get("content"), str))
        shown = CURRENT_PROGRAM.findall(text)
        if not shown:
            return None
        block, _ = unwrap(shown[-1])
        with self.lock:
            parent_id = self.by_code.get(code_key(shown[-1]))
            parent = next((p for p in self.search.programs if p.id == parent_id), None)
            if parent is None or block is None:
                return None
            program = parse_program(parent.source)
            by_id = {p.id: p for p in self.search.programs}
            child = next_child(
                self.residuals,
                parent.id,
                program,
                dict(parent.constants) or program.constants,
                self.tried,
                seed_of(parent, by_id.get),
            )
            if isinstance(child, str):
                rule, why = child.split(": ", 1)
                # written by the main loop's thread (the archive's connection is its own), before its next record
                self.refused.append(RejectionRecord(operator=RESIDUAL_TERM, parents=[parent.id], rule=rule, reason=why))
                return None
            new, detail = child
            self.aimed[code_key(new.strip())] = (parent.id, f"{RESIDUAL_TERM}: + {detail}")
        why = f"{RESIDUAL_TERM}: the program plus the term that best explains its per-request residuals.\n"
        if not self.diffs:
            return f"{why}```python\n{as_program_file(new)}```\n"
        return f"{why}<<<<<<< SEARCH\n{block}=======\n{new.strip()}\n>>>>>>> REPLACE\n"

    def _spend(self, attempts) -> None:
        with self.calls_lock:
            for a in attempts:
                self.budget.spend(a)
                self.calls.append(LLMCallRecord(**a.record()))

    # ---- OpenEvolve's main loop ----
    def admit(self, snapshot, candidate, island: int) -> bool:
        """PopulationStrategy.admit: record the candidate; admit it to OpenEvolve's population unless
        the judge rejected it (a text our validator refuses is no program to build on; OpenEvolve's
        own rules place the others). An exception here would stop OpenEvolve's run, so none escapes."""
        try:
            return self._record(snapshot, candidate, island)
        except Exception as e:  # noqa: BLE001 - recorded and reported, never raised into OpenEvolve
            logging.getLogger(__name__).error("stepml-evolve could not record program %s: %s", candidate.id, e)
            return True

    def _parent(self, snapshot, parent_id: str | None) -> list[int]:
        if parent_id in self.ids:
            return [self.ids[parent_id]]
        parent = snapshot.programs.get(parent_id) if parent_id else None  # a copy OpenEvolve made itself
        found = self.by_code.get(code_key(parent.code)) if parent is not None else None
        return [found] if found is not None else []

    def _record(self, snapshot, candidate, island: int) -> bool:
        """Write the candidate's generation; whether it is a program (not a rejection)."""
        key = code_key(candidate.code)
        with self.lock:
            self.write_refused()
            if key in self.known and candidate.parent_id is None:  # the program OpenEvolve starts from
                self.ids[candidate.id] = self.by_code[key] = self.known[key].program.record.id
                return True
            queue = self.judged.get(key) or []
            j = queue.pop(0) if queue else None
            parents = self._parent(snapshot, candidate.parent_id)
            detail = f"island {island}; {str(candidate.metadata.get('changes') or '')[:200]}".strip("; ")
            if j is None:
                self._write(
                    rejection=RejectionRecord(
                        operator=OPERATOR,
                        parents=parents,
                        rule="openevolve-error",
                        reason="OpenEvolve added a program the judge never saw",
                        source=candidate.code,
                    )
                )
                return False
            if j.program is None:
                self._write(rejection=dataclasses.replace(j.rejection, parents=parents))
                return False
            if j.program.record.operator == RESIDUAL_TERM:  # what the term is, not the diff's prose
                detail = f"{j.program.record.operator_detail}; island {island}"
            record = dataclasses.replace(j.program.record, parents=parents, island=island, operator_detail=detail)
            self._write(program=dataclasses.replace(j.program, record=record), promoted=int(j.promoted))
            self.ids[candidate.id] = self.by_code[key] = self.search.programs[-1].id  # as `commit` archived it
            return True

    def failure(self, message: str) -> None:
        """One of OpenEvolve's own failed iterations (from its log): a rejection of its generation."""
        with self.lock:
            self.write_refused()
            self._write(
                rejection=RejectionRecord(
                    operator=OPERATOR, parents=[], rule=failure_rule(message), reason=" ".join(message.split())[:500]
                )
            )

    def write_refused(self) -> None:
        """The residual_term rejections the HTTP side made, each a generation (main loop's thread)."""
        refused, self.refused = self.refused, []
        for rejection in refused:
            self._write(rejection=rejection)

    def _write(
        self, program: NewProgram | None = None, rejection: RejectionRecord | None = None, promoted: int = 0
    ) -> None:
        """One candidate (or one failure) as a generation of its own."""
        s = self.search
        g = s.last_generation() + 1
        now = time.perf_counter()
        with self.calls_lock:
            calls, self.calls = self.calls, []
        if program is not None and calls:
            calls[-1].program_index = 0  # the last call before a program is the one that produced it
        stats = s.commit(
            g,
            self.last,
            [program] if program else [],
            [rejection] if rejection else [],
            calls,
            GenerationRecord(n_children=1, n_promoted=promoted),
        )
        info = s.status(g)
        info["evals_per_s"] = stats.evaluations / max(now - self.last, 1e-9)
        self.last = now
        s.progress(info)


class _FailureLog(logging.Handler):
    """Hands OpenEvolve's logged iteration failures to the judge."""

    def __init__(self, judge: Judge):
        super().__init__(logging.WARNING)
        self.judge = judge

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if m := _FAILURE.match(msg):
                self.judge.failure(m.group(2))
            elif _TIMEOUT.search(msg):
                self.judge.failure("the iteration timed out")
            elif msg.startswith("Error processing result from iteration"):
                self.judge.failure(msg)
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


def judge_server(judge: Judge) -> LocalServer:
    """127.0.0.1:<free port>: POST /evaluate (a candidate's text) and POST /v1/chat/completions."""

    def route(path: str, body: dict):
        try:
            if path.rstrip("/") == "/evaluate":
                return 200, judge.evaluate(body["code"])
            if path.rstrip("/").endswith("/chat/completions"):
                return judge.chat(body)
            return 404, {"error": {"message": f"no route {path}"}}
        except Exception as e:  # noqa: BLE001 - answered (OpenEvolve records the failure), and logged
            logging.getLogger(__name__).exception("stepml-evolve judge: %s failed", path)
            return 500, {"error": {"message": f"{type(e).__name__}: {e}"}}

    return LocalServer(route)


def openevolve_config(
    model: str,
    url: str,
    seed: int,
    islands: int,
    migration_interval: int,
    server: dict,
    llm_timeout_s: float,
    diffs: bool,
):
    """OpenEvolve's Config for a run: our LLM endpoint, our system message, our feature dimensions."""
    from openevolve.config import Config, LLMModelConfig

    cfg = Config()
    cfg.random_seed = seed
    cfg.language = "python"
    cfg.diff_based_evolution = diffs
    cfg.max_code_length = 20_000
    cfg.checkpoint_interval = 10**9  # no checkpoints: every program is in our archive as it is evaluated
    cfg.log_level = "WARNING"  # its INFO lines would flood the terminal; warnings carry the failures we record
    cfg.max_tasks_per_child = 10**9  # Python 3.11 then starts its workers with spawn, not fork (we hold threads)
    model_cfg = LLMModelConfig(
        name=model,
        api_base=f"{url}/v1",
        api_key="stepml-local",
        weight=1.0,
        timeout=int(llm_timeout_s * 5 + 60),
        retries=0,
    )  # our client retries
    cfg.llm.models = [model_cfg]
    cfg.llm.evaluator_models = [model_cfg]
    cfg.prompt.system_message = (
        prompt_templates()
        .get_template("system.j2")
        .render(
            components=COMPONENTS,
            budget_tokens=server["budget_tokens"],
            max_seqs=server["max_seqs"],
            reply_format=REPLY_FORMAT,
        )
    )
    cfg.database.random_seed = seed
    cfg.database.num_islands = islands
    cfg.database.migration_interval = migration_interval
    cfg.database.feature_dimensions = ["dsl_complexity", "n_components"]  # as our grid (archive/map_elites.py)
    cfg.evaluator.cascade_evaluation = False  # the judge runs our own cascade
    cfg.evaluator.parallel_evaluations = 1  # one worker: the judge fits on every core anyway
    cfg.evaluator.max_retries = 0
    cfg.evaluator.timeout = EVALUATION_TIMEOUT_S
    return cfg


def run_openevolve(
    search: Search,
    client: LLMClient,
    budget: Budget,
    output_dir: Path,
    iterations: int,
    *,
    islands: int,
    migration_interval: int,
    server: dict,
    llm_timeout_s: float,
    diffs: bool = True,
) -> dict:
    """Generation 0 fits the seeds (our engine); OpenEvolve then runs `iterations` iterations from
    the best of them, each recorded as one generation. Returns the run's summary."""
    openevolve = require_openevolve()
    from openevolve.population import PopulationStrategy

    search.run(until=0)  # a fresh run (runs.py refuses to resume one): generation 0 only
    start = best(search.programs)
    initial = as_program_file(start.source)
    output_dir.mkdir(parents=True, exist_ok=True)
    initial_path = output_dir / "initial_program.py"
    initial_path.write_text(initial)
    judge = Judge(search, client, budget, diffs)
    judge.start_from(initial, NewProgram(start, search.archive.metric_rows(start.id)), start.val_loss)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # OpenEvolve's controller installs SIGINT/SIGTERM handlers that call into itself and never
    # restores them: a signal after the run would raise inside a dead controller
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    failures = _FailureLog(judge)
    logging.getLogger("openevolve.process_parallel").addHandler(failures)
    try:
        with judge_server(judge) as srv:
            os.environ[JUDGE_URL_ENV] = srv.url
            os.environ[SEED_ENV] = str(search.cfg.seed)
            cfg = openevolve_config(
                client.model, srv.url, search.cfg.seed, islands, migration_interval, server, llm_timeout_s, diffs
            )
            openevolve.run_evolution(
                str(initial_path),
                str(Path(__file__).with_name("judge_client.py")),
                cfg,
                iterations=iterations,
                output_dir=str(output_dir),
                cleanup=False,
                population_strategy=PopulationStrategy(admit=judge.admit),
            )
        with judge.lock:
            judge.write_refused()
    finally:
        logging.getLogger("openevolve.process_parallel").removeHandler(failures)
        for s, handler in signals.items():
            signal.signal(s, handler)
        for h in [h for h in root.handlers if h not in handlers]:  # OpenEvolve's file and console handlers
            root.removeHandler(h)
            h.close()
        root.setLevel(level)
    summary = search.summary()
    search.archive.set_summary(search.run_id, summary)
    return summary
