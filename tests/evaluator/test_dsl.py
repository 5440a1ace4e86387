"""The program DSL: seeds compile, scalar VM == numexpr, rejections name line and rule,
and hostile text is rejected without ever being executed."""

from __future__ import annotations

import builtins
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_programs import random_program

from stepml_evolve.evaluator.dsl import (
    ProgramError,
    ScalarProgram,
    compile_program,
    compile_vector,
    evaluate_vector,
    load_program,
    parse_program,
    step_times,
)
from stepml_evolve.evaluator.dsl.operators import OPERATORS, Kind, Operator
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES, N_COMPONENTS
from stepml_evolve.seeds import baseline_paths, seed_paths

SEED_NAMES = {"roofline", "phase_decomposed", "regime_switch", "trained_physics"}


def test_all_seeds_and_baselines_are_shipped_documented_valid_and_compile():
    paths = seed_paths()
    assert SEED_NAMES <= {p.stem for p in paths}
    for p in paths + baseline_paths():
        prog = load_program(p)
        assert prog.doc, f"{p.name} needs a docstring saying its idea"
        cp = compile_program(prog)
        assert cp.entries[0] >= 0
        compile_vector(prog)
        assert prog.complexity > 0 and prog.components_used


def test_complexity_counts_nodes_and_components_used_lists_them():
    prog = parse_program(
        'CONSTANTS = {"a": 1.0, "b": 2.0}\n\ndef step_time(f, c):\n'
        "    x = c.a * f.gemm_pf\n    return max(x, c.b * f.weights) + 3.0\n"
    )
    # x = c.a * f.gemm_pf -> 3 nodes; max(x, c.b*f.weights) + 3.0 -> + , max, x, *, c.b, f.weights, 3.0 = 7
    assert prog.complexity == 10
    assert prog.components_used == ["gemm_pf", "weights"]
    assert prog.constant_names == ["a", "b"]


def _random_components(rng, n):
    comps = rng.uniform(0, 5000, size=(N_COMPONENTS, n))
    comps[:, : n // 4] = 0.0  # zeros exercise protected division and log
    comps[:, n // 4 : n // 2] *= -1  # negatives exercise abs in sqrt/log/powers
    return comps


def test_seed_programs_agree_between_scalar_vm_and_numexpr():
    rng = np.random.default_rng(0)
    comps = _random_components(rng, 200)
    for p in seed_paths():
        prog = load_program(p)
        consts = np.array(list(prog.constants.values()))
        sp = ScalarProgram(compile_program(prog))
        vec = step_times(prog, comps, consts)
        scalar = np.array([sp.step_time(comps[:, i], consts) for i in range(comps.shape[1])])
        np.testing.assert_allclose(scalar, vec, rtol=1e-12, atol=1e-9, err_msg=p.name)


def test_population_of_constant_vectors_evaluates_in_one_call():
    prog = load_program(next(p for p in seed_paths() if p.stem == "roofline"))
    rng = np.random.default_rng(1)
    comps = rng.uniform(0, 1e4, size=(N_COMPONENTS, 64))
    base = np.array(list(prog.constants.values()))
    pop = base * rng.uniform(0.5, 2.0, size=(7, len(base)))
    out = step_times(prog, comps, pop)
    assert out.shape == (7, 64)
    for i in range(7):
        np.testing.assert_allclose(out[i], step_times(prog, comps, pop[i]), rtol=1e-13)


# ---- random well-formed programs: the two compilations agree everywhere ----


@pytest.mark.parametrize("seed", range(150))
def test_random_programs_agree_between_scalar_vm_and_numexpr(seed):
    src = random_program(seed)
    prog = parse_program(src)
    consts = np.array(list(prog.constants.values()))
    comps = _random_components(np.random.default_rng(seed), 40)
    sp = ScalarProgram(compile_program(prog))
    with np.errstate(all="ignore"):
        vec = step_times(prog, comps, consts)
    scalar = np.array([sp.step_time(comps[:, i], consts) for i in range(comps.shape[1])])
    finite = np.isfinite(scalar) & np.isfinite(vec)
    assert np.array_equal(np.isfinite(scalar), np.isfinite(vec)), src
    np.testing.assert_allclose(scalar[finite], vec[finite], rtol=1e-9, atol=1e-9, err_msg=src)


def test_other_functions_compile_both_ways():
    prog = parse_program(
        'CONSTANTS = {"q": 100.0, "t": 0.5, "o": 40.0}\n'
        "def step_time(f, c):\n    return 1.0\n"
        "def queueing_time(r, c):\n    return c.q + c.t * r.input_tokens if r.output_tokens > 10 else c.q\n"
        "def output_token_time(c):\n    return c.o * 2\n"
        "def post_decode_time(c):\n    return c.o\n"
    )
    sp = ScalarProgram(compile_program(prog))
    consts = np.array([100.0, 0.5, 40.0])
    assert sp.queueing_time(600, 248, consts) == 400.0
    assert sp.queueing_time(600, 5, consts) == 100.0
    assert sp.output_token_time(consts) == 80.0 and sp.post_decode_time(consts) == 40.0
    vq = evaluate_vector(
        compile_vector(prog, "queueing_time"),
        {
            "c_q": 100.0,
            "c_t": 0.5,
            "c_o": 40.0,
            "r_input_tokens": np.array([600.0, 600.0]),
            "r_output_tokens": np.array([248.0, 5.0]),
        },
    )
    np.testing.assert_array_equal(vq, [400.0, 100.0])


# ---- the operator table: every row works in every back end, with the same protected semantics ----

EDGES = [0.0, -0.0, 1.0, -1.0, 2.5, -4.0, 100.0, -100.0, 1e-300, 1e300, -1e300]


def _row_expression(op: Operator) -> str:
    """A step_time expression using the row's operator on a = f.gemm_pf and b = f.gemm_dc."""
    a, b = "f.gemm_pf", "f.gemm_dc"
    if op.exponent:
        return f"{a} ** {3 if op.exponent == 'integer' else 1.5}"
    if op.kind is Kind.BINARY:
        return f"{a} {op.symbol} {b}"
    if op.kind is Kind.UNARY:
        return f"{op.symbol}{a}"
    if op.kind is Kind.CALL:
        return f"{op.symbol}({', '.join([a, b][: op.arity[0]])})"
    if op.kind is Kind.COMPARE:
        return f"1.0 if {a} {op.symbol} {b} else 0.0"
    if op.kind is Kind.BOOL:
        return f"1.0 if {a} > 0 {op.symbol} {b} > 0 else 0.0"
    if op.kind is Kind.NOT:
        return f"1.0 if not {a} > 0 else 0.0"
    return f"{a} if {b} > 0 else {b}"


def _both_backends(expression: str, a, b) -> tuple[np.ndarray, np.ndarray]:
    """(VM, numexpr) values of `return <expression>` at the pairs (a[i], b[i])."""
    prog = parse_program(f"def step_time(f, c):\n    return {expression}\n")
    comps = np.zeros((N_COMPONENTS, len(a)))
    comps[COMPONENT_NAMES.index("gemm_pf")], comps[COMPONENT_NAMES.index("gemm_dc")] = a, b
    sp = ScalarProgram(compile_program(prog))
    with np.errstate(all="ignore"):
        vm = np.array([sp.step_time(comps[:, i], np.zeros(0)) for i in range(len(a))])
        vec = step_times(prog, comps, np.zeros(0))
    return vm, vec


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: f"{op.kind.name}{op.symbol}{op.exponent or ''}")
def test_every_operator_validates_and_compiles_everywhere_and_the_backends_agree_at_edges(op):
    from stepml_evolve.evolve.go.source import _GoExpr, _Names

    expression = _row_expression(op)
    a, b = (np.array(x) for x in zip(*[(x, y) for x in EDGES for y in EDGES]))
    vm, vec = _both_backends(expression, a, b)
    np.testing.assert_allclose(vm, vec, rtol=1e-14, atol=0, err_msg=expression)
    np.testing.assert_array_equal(np.signbit(vm), np.signbit(vec), err_msg=expression)  # -0.0 too
    fn = parse_program(f"def step_time(f, c):\n    return {expression}\n").functions["step_time"]
    (go,) = _GoExpr(_Names("m"), {}, "step_time").body(fn)
    assert go.startswith("return ") and "f.GemmPf" in go


@pytest.mark.parametrize(
    "expression,a,b,expected",
    [
        ("f.gemm_pf / f.gemm_dc", 3.0, 0.0, 0.0),
        ("f.gemm_pf / f.gemm_dc", -3.0, -0.0, 0.0),
        ("f.gemm_pf / f.gemm_dc", 1.0, 4.0, 0.25),
        ("f.gemm_pf / f.gemm_dc", 1e300, 1e-300, math.inf),
        ("sqrt(f.gemm_pf)", -4.0, 0.0, 2.0),
        ("log(f.gemm_pf)", 0.0, 0.0, 0.0),
        ("log(f.gemm_pf)", -math.e, 0.0, 1.0),
        ("exp(f.gemm_pf)", 1000.0, 0.0, math.exp(80.0)),
        ("exp(f.gemm_pf)", -1000.0, 0.0, 0.0),
        ("f.gemm_pf ** 3", -2.0, 0.0, -8.0),
        ("f.gemm_pf ** -1", 0.0, 0.0, math.inf),
        ("f.gemm_pf ** 1.5", -4.0, 0.0, 8.0),
        ("f.gemm_pf ** -0.5", -4.0, 0.0, 0.5),
        ("abs(f.gemm_pf)", -3.0, 0.0, 3.0),
        ("-f.gemm_pf", 2.0, 0.0, -2.0),
        ("+f.gemm_pf", -2.0, 0.0, -2.0),
        ("max(f.gemm_pf, f.gemm_dc, -7.0)", -9.0, -8.0, -7.0),
        ("min(f.gemm_pf, f.gemm_dc)", -1.0, 2.0, -1.0),
        ("f.gemm_pf * f.gemm_dc", 1e300, 1e300, math.inf),
        ("1.0 if f.gemm_pf == f.gemm_dc else 0.0", 0.0, -0.0, 1.0),
        ("1.0 if f.gemm_pf < f.gemm_dc <= 3.0 else 0.0", 1.0, 3.0, 1.0),
        ("1.0 if f.gemm_pf < f.gemm_dc <= 3.0 else 0.0", 1.0, 4.0, 0.0),
        ("1.0 if f.gemm_pf != 1.0 or f.gemm_dc > 0 else 0.0", 1.0, 0.0, 0.0),
        ("1.0 if not f.gemm_pf > 0 and f.gemm_dc >= 0 else 0.0", -1.0, 0.0, 1.0),
        ("f.gemm_pf if f.gemm_dc > 0 else 5.0", 7.0, 1e-300, 7.0),
    ],
)
def test_protected_semantics_hold_in_the_vm_and_numexpr(expression, a, b, expected):
    vm, vec = _both_backends(expression, [a], [b])
    assert vm[0] == expected and vec[0] == expected, (expression, vm[0], vec[0])


def test_gp_primitives_follow_the_order_deap_was_seeded_with():
    """DEAP's random choices depend on the order of the primitive set: the table must keep it."""
    from stepml_evolve.evolve.search.symbolic import PRIMITIVES, primitive_set

    assert PRIMITIVES == [
        ("add", 2),
        ("sub", 2),
        ("mul", 2),
        ("div", 2),
        ("max2", 2),
        ("min2", 2),
        ("neg", 1),
        ("abs", 1),
        ("sqrt", 1),
        ("log", 1),
        ("exp", 1),
        ("pow2", 1),
        ("pow3", 1),
        ("pow0_5", 1),
        ("pow1_5", 1),
        ("powm1", 1),
        ("powm0_5", 1),
        ("powm2", 1),
        ("ifgt", 4),
        ("ifge", 4),
    ]
    pset = primitive_set(["a"])
    assert [p.name for arity in (2, 1, 4) for p in pset.primitives[object] if p.arity == arity] == [
        n for n, _ in PRIMITIVES
    ]


def test_rejections_list_the_table_spellings():
    for body, listed in [
        ("f.tp // 2", "(only + - * / **)"),
        ("tanh(f.tp)", "(only max, min, abs, sqrt, log, exp)"),
        ("1 if f.tp is 2 else 0", "only < <= > >= == != comparisons"),
    ]:
        with pytest.raises(
            ProgramError, match=listed.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*").replace("+", r"\+")
        ):
            parse_program(VALID_HEAD + f"    return {body}\n")


# ---- rejections name the line and the rule ----

VALID_HEAD = 'CONSTANTS = {"a": 1.0}\n\ndef step_time(f, c):\n'


@pytest.mark.parametrize(
    "body,line,rule,fragment",
    [
        ("    return f.gemm\n", 4, "component", "unknown component f.gemm"),
        ("    return c.b\n", 4, "constant", "c.b is not in CONSTANTS"),
        ("    return r.input_tokens\n", 4, "attribute", "not allowed here"),
        ("    x = 1\n    return eval('1')\n", 5, "call", "call to 'eval'"),
        ("    return f.n_req ** 1000\n", 4, "exponent", "exceeds the limit"),
        ("    return f.n_req ** c.a\n", 4, "exponent", "numeric literal"),
        ("    return y\n", 4, "name", "'y' is not defined"),
        ("    for i in f:\n        pass\n    return 1\n", 4, "statement", "For"),
        ("    return (lambda: 1)()\n", 4, "call", "not allowed"),
        ("    return [x for x in f]\n", 4, "expression", "ListComp"),
        ("    return 'text'\n", 4, "literal", "numeric literals"),
        ("    return f.n_req if f.n_req else 1\n", 4, "condition", "comparison"),
        ("    return f.n_req // 2\n", 4, "operator", "FloorDiv"),
    ],
)
def test_rejection_names_line_and_rule(body, line, rule, fragment):
    with pytest.raises(ProgramError) as ei:
        parse_program(VALID_HEAD + body)
    e = ei.value
    assert (e.line, e.rule) == (line, rule), str(e)
    assert fragment in str(e) and f"line {line}:" in str(e)


def test_load_program_error_names_the_file(tmp_path):
    p = tmp_path / "bad.py"
    p.write_text(VALID_HEAD + "    import os\n    return 1\n")
    with pytest.raises(ProgramError) as ei:
        load_program(p)
    assert str(ei.value).startswith(f"{p}: line 4:")
    assert "\n" not in str(ei.value)


# ---- hostile inputs: all rejected, none executed ----

SENTINEL_CODE = "__import__('pathlib').Path('{s}').write_text('pwned')"


def _hostile(sentinel: str) -> list[str]:
    s = SENTINEL_CODE.format(s=sentinel)
    return [
        f"import os\nos.system('touch {sentinel}')\n",
        "from os import system\n",
        f"CONSTANTS = {{}}\ndef step_time(f, c):\n    return {s}\n",
        f"CONSTANTS = {{'a': {s}}}\ndef step_time(f, c):\n    return 1\n",
        f"def step_time(f, c=({s})):\n    return 1\n",
        f"@({s})\ndef step_time(f, c):\n    return 1\n",
        f"def step_time(f, c) -> ({s}):\n    return 1\n",
        f"{s}\ndef step_time(f, c):\n    return 1\n",
        f"x = {s}\ndef step_time(f, c):\n    return 1\n",
        "def step_time(f, c):\n    return f.__class__\n",
        "def step_time(f, c):\n    return c.__dict__\n",
        "def step_time(f, c):\n    return ().__class__.__bases__[0].__subclasses__()\n",
        "def step_time(f, c):\n    return getattr(f, 'gemm_pf')\n",
        f"def step_time(f, c):\n    g = lambda: {s}\n    return g()\n",
        f"def step_time(f, c):\n    return [{s} for _ in range(1)]\n",
        f"def step_time(f, c):\n    return {{{s}: 1}}\n",
        "def step_time(f, c):\n    return 2 ** 10 ** 10\n",
        "def step_time(f, c):\n    return f.n_req ** 99999999\n",
        "def step_time(f, c):\n    return " + "(" * 5000 + "1" + ")" * 5000 + "\n",
        "def step_time(f, c):\n    return " + "+".join(["f.n_req"] * 3000) + "\n",
        "def step_time(f, c):\n    return " + "max(" * 30 + "1" + ", 2)" * 30 + "\n",
        f"def step_time(f, c):\n    return f'{{{s}}}'\n",
        f"def step_time(f, c):\n    return (x := {s})\n",
        f"def step_time(f, c):\n    while True:\n        {s}\n    return 1\n",
        f"def step_time(f, c):\n    try:\n        {s}\n    finally:\n        return 1\n",
        f"def step_time(f, c):\n    with open('{sentinel}', 'w'):\n        return 1\n",
        f"class step_time:\n    {s}\n",
        "def step_time(f, c):\n    global x\n    return 1\n",
        f"async def step_time(f, c):\n    return await {s}\n",
        f"def step_time(f, c):\n    yield {s}\n",
        "def step_time(f, c):\n    return c['a']\n",
        f"def step_time(f, c):\n    return exec('{s}')\n",
        f"def step_time(f, c):\n    return open('{sentinel}', 'w')\n",
        "CONSTANTS = dict(a=1)\ndef step_time(f, c):\n    return 1\n",
        "CONSTANTS = {'__class__': 1.0}\ndef step_time(f, c):\n    return c.__class__\n",
        "def step_time(f, c):\n    return 1e999\n",
        "def step_time(f, c):\n    return True\n",
        "def step_time(f, c):\n    return 1\n\x00",
        "def step_time(f, c):\n    return 1\n" + "#" * 70000,
        "def step_time(f, c):\n    return f.n_req\ndef step_time(f, c):\n    return 2\n",
        "def queueing_time(r, c):\n    return 1\n",  # no step_time
        "def step_time(f, c):\n    return r.input_tokens\n",  # r outside queueing_time
        "def queueing_time(r, c):\n    return f.n_req\ndef step_time(f, c):\n    return 1\n",
        "def step_time(f, c):\n    f = 1\n    return f\n",
        "def step_time(*args):\n    return 1\n",
    ]


def test_hostile_programs_are_rejected_and_never_executed(tmp_path, monkeypatch):
    sentinel = tmp_path / "executed"
    calls = []
    monkeypatch.setattr(builtins, "exec", lambda *a, **k: calls.append("exec"))
    monkeypatch.setattr(builtins, "eval", lambda *a, **k: calls.append("eval"))
    for text in _hostile(str(sentinel)):
        with pytest.raises(ProgramError) as ei:
            prog = parse_program(text)
            compile_program(prog)
            compile_vector(prog)
        assert "\n" not in str(ei.value) and ei.value.rule
    assert not sentinel.exists()
    assert calls == []


VALID = open(next(p for p in seed_paths() if p.stem == "roofline")).read()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_program_text_only_ever_raises_program_error(data):
    """Random edits of a valid program: the parser returns a program or a ProgramError, nothing else."""
    text = VALID
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text)))
        insert = data.draw(
            st.sampled_from(
                [
                    "__import__('os')",
                    ".__class__",
                    "lambda: 0",
                    "[x for x in f]",
                    "**99",
                    "(",
                    ")",
                    "\n",
                    "    ",
                    "import os\n",
                    "f.",
                    "c.",
                    "max(",
                    ",",
                    "if",
                    "else",
                    "not ",
                    "yield",
                    "'s'",
                    "1e999",
                    "exec(",
                    ":",
                ]
            )
            | st.text(max_size=6)
        )
        cut = data.draw(st.integers(0, 5))
        text = text[:pos] + insert + text[pos + cut :]
    try:
        prog = parse_program(text)
    except ProgramError as e:
        assert "\n" not in str(e)
        return
    cp = compile_program(prog)  # whatever passes validation must compile both ways
    compile_vector(prog)
    assert cp.entries[0] >= 0


@pytest.mark.parametrize(
    "source",
    [
        "def step_time(f, c):\n    return " + "9" * 400 + "\n",
        'CONSTANTS = {"a": ' + "9" * 400 + "}\ndef step_time(f, c):\n    return c.a\n",
        "def step_time(f, c):\n    return f.tokens ** " + "9" * 400 + "\n",
    ],
)
def test_integer_literals_too_large_for_a_float_are_rejected_not_raised(source):
    """float() of a 400-digit integer raises OverflowError: it must become a ProgramError, or one
    LLM reply could stop a search."""
    with pytest.raises(ProgramError, match="line"):
        parse_program(source)


def test_programs_parse_in_many_threads_at_once_while_garbage_collections_run_python_code():
    """The search fits children in threads and a fit may parse a program. CPython 3.11 keeps the
    AST converter's recursion depth in state every thread shares: a collection that runs a
    finalizer mid-parse lets another thread's parse interleave, and one of them then raises
    SystemError (it did, once, in CI). Parsing goes through one lock (dsl/pyparse.py)."""
    import gc
    import threading

    source = seed_paths()[0].read_text()
    expected = parse_program(source)

    class Finalized:
        def __del__(self):
            [i for i in range(20)]  # Python code inside a collection: a thread switch can happen here

    done = threading.Event()

    def churn():
        for _ in range(1_000_000):
            if done.is_set():
                return
            cycle = Finalized()
            cycle.me = cycle

    failures, parsed = [], []

    def parse():
        try:
            for _ in range(250):
                parsed.append(parse_program(source).source == expected.source)
        except Exception as e:  # noqa: BLE001 - any failure is what the test reports
            failures.append(repr(e))

    threshold = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        threads = [threading.Thread(target=parse) for _ in range(3)]
        churner = threading.Thread(target=churn)
        churner.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        done.set()
        churner.join()
        gc.set_threshold(*threshold)
    assert failures == []
    assert len(parsed) == 750 and all(parsed)
