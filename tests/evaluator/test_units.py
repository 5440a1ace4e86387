"""Units (evaluator/dsl/units.py): every value is a power of microseconds, every function returns a
time; `evolve run --units check` rejects children (and refuses seeds) that are not unit-consistent."""

from __future__ import annotations

import json
import sqlite3
import timeit
from fractions import Fraction

import pytest
import typer
from conftest import LEAN, FixedEmitter
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import ProgramError, check_units, infer_units, parse_program
from stepml_evolve.evaluator.dsl.operators import OPERATORS, UNIT_RULES
from stepml_evolve.evaluator.hardware.components import COMPONENTS
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search import LEGACY_SETTINGS, UNITS_MODES, SearchConfig
from stepml_evolve.seeds import seed_path, seed_paths

HEADER = 'CONSTANTS = {"k": 2.0, "j": 3.0, "q": 100.0}\n\n\ndef step_time(f, c):\n'  # step_time's body starts on line 5


def program(*body: str, more: str = "") -> str:
    return HEADER + "".join(f"    {line}\n" for line in body) + more


def rejection(source: str) -> ProgramError:
    with pytest.raises(ProgramError) as info:
        check_units(parse_program(source))
    assert info.value.rule == "units"
    return info.value


# ---- the check ----


@pytest.mark.parametrize(
    "body, line, message",
    [
        (["return f.gemm_pf + f.n_req"], 5, "adds microseconds and a count (f.gemm_pf + f.n_req)"),
        (
            ["return f.weights * f.kv_read"],
            5,
            "step_time returns microseconds^2, which is not a time (f.weights * f.kv_read)",
        ),
        (["return c.k * exp(f.gemm_pf)"], 5, "takes exp of microseconds, which needs a count (exp(f.gemm_pf))"),
        (
            ["return c.k * max(f.tokens, f.weights)"],
            5,
            "takes the max of a count and microseconds (max(f.tokens, f.weights))",
        ),
        (["return min(f.gemm_pf, f.weights, f.n_req)"], 5, "takes the min of microseconds and a count"),
        (["x = f.gemm_pf", "y = f.tok_pf", "return x - y"], 7, "subtracts a count from microseconds (x - y)"),
        (["return c.k * log(f.kv_read)"], 5, "takes log of microseconds, which needs a count"),
        (
            ["return f.gemm_pf if f.tok_pf > f.weights else f.kv_read"],
            5,
            "compares a count with microseconds (f.tok_pf > f.weights)",
        ),
        (["return f.gemm_pf if f.tok_pf > 256 else f.n_req"], 5, "chooses between microseconds and a count"),
        (["return f.gemm_pf ** 1.5"], 5, "step_time returns microseconds^(3/2)"),
        (["return f.gemm_pf / f.weights"], 5, "step_time returns a count, which is not a time"),
        # a named constant has one value, so one unit: microseconds-per-second and per-request at once is no unit
        (["return c.k * f.gemm_pf + c.k * f.n_req"], 5, "adds microseconds and a count, each times unit(c.k)"),
        (["x = 2 * f.gemm_pf", "return x + x * f.gemm_pf"], 6, "adds microseconds and microseconds^2"),
    ],
)
def test_a_program_whose_units_disagree_is_rejected_naming_line_operation_and_units(body, line, message):
    e = rejection(program(*body))
    assert e.line == line and message in e.message, str(e)
    assert str(e).startswith(f"line {line}: ") and str(e).endswith(" [units]")


def test_the_message_is_the_one_the_issue_asks_for():
    e = rejection(program("return f.gemm_pf + f.n_req"))
    assert str(e) == "line 5: adds microseconds and a count (f.gemm_pf + f.n_req) [units]"


def test_every_function_must_return_a_time_and_a_constant_keeps_its_unit_across_functions():
    e = rejection(program("return f.gemm_pf", more="\n\ndef queueing_time(r, c):\n    return r.input_tokens\n"))
    assert e.line == 9 and e.message.startswith("queueing_time returns a count, which is not a time (r.input_tokens)")
    # c.k is a count in step_time (it scales a time), so output_token_time returning it returns a count
    e = rejection(program("return c.k * f.gemm_pf", more="\n\ndef output_token_time(c):\n    return c.k\n"))
    assert e.line == 9 and "output_token_time returns a count" in e.message and "c.k is a count (line 5)" in e.message
    e = rejection(program("return f.gemm_pf", more="\n\ndef post_decode_time(c):\n    return log(c.j)\n"))
    assert e.line == 9 and "post_decode_time returns a count" in e.message
    check_units(parse_program(program("return c.q * f.n_req", more="\n\ndef output_token_time(c):\n    return c.q\n")))


def test_the_first_contradiction_in_source_order_is_reported_with_what_fixed_the_constant():
    e = rejection(program("a = f.tok_pf + c.j", "b = f.gemm_pf + c.j", "return a * b"))
    assert e.line == 6 and "adds microseconds and a count (f.gemm_pf + c.j)" in e.message
    assert "c.j is a count (line 5)" in e.message


@pytest.mark.parametrize(
    "body",
    [
        ["return c.k * f.n_req"],  # a constant may carry any unit (here microseconds per request)
        ["return c.k * c.j"],
        ["return c.k"],
        ["return 1500.0"],
        ["return sqrt(f.gemm_pf * f.weights)"],
        ["return f.gemm_pf ** 0.5 * f.weights ** 0.5"],
        ["return f.gemm_pf ** 0.3333333 * f.weights ** 0.6666667"],  # decimal exponents are exact as written
        ["return (c.k * f.n_req) ** 2"],  # c.k is us^(1/2) per request
        ["return 2 * f.gemm_pf + 2 * f.n_req"],  # each literal has its own unit
        ["return f.gemm_pf / f.n_req * f.tokens"],
        ["return log(c.k * f.gemm_pf) * f.weights + exp(f.tok_pf / f.tokens) * c.j"],
        ["compute = c.k * (f.gemm_pf + f.attn_pf)", "per_req = c.q * f.n_req", "return compute + per_req"],
        ["x = f.tok_pf + c.j", "return c.k * f.gemm_pf * x + f.weights"],
        ["return -abs(+f.gemm_pf) + max(f.weights, c.k * f.n_req, c.q)"],
        ["return f.gemm_pf if f.tok_pf > c.j and not (f.n_dc <= 4 or f.kv_read != f.weights) else c.k * f.ctx_max"],
        ["return f.gemm_pf * f.n_req ** 2 / f.tokens ** 2 + f.kv_read * f.layers / f.tp"],
    ],
)
def test_a_unit_consistent_program_passes(body):
    check_units(parse_program(program(*body)))


def test_every_seed_is_unit_consistent():
    for path in seed_paths():
        report = infer_units(parse_program(path.read_text()))
        assert all(u.exponent == 1 for u in report.functions.values()), path.stem


def test_infer_units_reports_functions_constants_and_locals():
    r = infer_units(
        parse_program(
            program("per = c.k * f.n_req", "scale = c.j * f.gemm_pf", "return per + (c.q * f.n_req) ** 2 + scale")
        )
    )
    assert {k: u.exponent for k, u in r.constants.items()} == {"k": 1, "j": 0, "q": Fraction(1, 2)}
    assert {k: u.exponent for k, u in r.locals["step_time"].items()} == {"per": 1, "scale": 1}
    assert r.functions["step_time"].exponent == 1
    free = infer_units(parse_program(program("return c.k * c.j")))  # k and j trade units: each is free, together a time
    assert free.constants["k"].exponent is None and str(free.constants["k"]) == "unit(c.k)"
    roof = infer_units(parse_program(seed_path("roofline").read_text()))
    assert str(roof.constants["overhead_us"]) == "microseconds" and str(roof.constants["c_compute"]) == "a count"


def test_component_units_come_from_the_components_table():
    for name, unit, _ in COMPONENTS:
        src = program(f"return f.{name}") if unit == "us" else program(f"return c.k * f.{name}")
        check_units(parse_program(src))
        if unit != "us":
            assert "returns a count" in rejection(program(f"return f.{name}")).message
    queueing = "\n\ndef queueing_time(r, c):\n    return r.output_tokens\n"
    assert "returns a count" in rejection(program("return f.gemm_pf", more=queueing)).message


def test_every_operator_has_a_unit_rule():
    assert {op.units for op in OPERATORS} == set(UNIT_RULES)


def test_the_check_costs_far_less_than_a_fit():
    programs = [parse_program(p.read_text()) for p in seed_paths()]
    seconds = min(timeit.repeat(lambda: [check_units(p) for p in programs], number=20, repeat=3)) / 20 / len(programs)
    assert seconds < 0.01, seconds  # measured about 0.1-0.3 ms; one closed-loop evaluation takes ~100 ms


# ---- the search ----

TINY = [
    "--seed-program-fit-evals",
    "6",
    "--quick-evals",
    "4",
    "--full-fit-evals",
    "6",
    "--children",
    "6",
    "--front-cv",
    "none",
    *LEAN,
]
BAD = (
    'CONSTANTS = {"base_us": 2000.0, "k": 1.0}\n\n\ndef step_time(f, c):\n    return c.base_us + f.gemm_pf + f.n_req\n'
)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def stored_search(d) -> dict:
    db = sqlite3.connect(d / Archive.FILE)
    (config,) = db.execute("SELECT config FROM runs").fetchone()
    db.close()
    return json.loads(config)["search"]


@pytest.mark.parametrize("units", UNITS_MODES)
def test_a_child_whose_step_time_is_not_a_time_is_rejected_before_fitting_unless_units_off(synthetic, tmp_path, units):
    from stepml_evolve.evaluator.scoring.pool import ReplayPool
    from stepml_evolve.evolve.search import Search
    from stepml_evolve.evolve.search.emitters import SymbolicEmitter

    child = BAD.replace("return", "return c.k * f.tok_pf +")
    fixed = FixedEmitter(child)
    cfg = SearchConfig(
        generations=1,
        seed=3,
        children=1,
        seed_fit_evals=6,
        full_fit_evals=6,
        quick_evals=4,
        units=units,
        time_components="free",  # the hand-made child drops roofline's components
        physics="off",  # and reads no attention: the units check, not the floor, is what this pins
    )
    with ReplayPool(synthetic.experiments, 2) as pool:
        archive = Archive(tmp_path, create=True)
        search = Search(
            archive,
            synthetic,
            pool,
            cfg,
            [SymbolicEmitter(), fixed],
            seeds=[("roofline", seed_path("roofline").read_text())],
        )
        search.run()
        programs, rejections = archive.programs(search.run_id), archive.rejections(search.run_id)
        archive.close()
    if units == "check":
        assert [o for o, _ in fixed.told] == ["invalid_program"] and [p.operator for p in programs] == ["seed"]
        (r,) = rejections
        assert (r.operator, r.rule, r.source) == ("fixed", "units", child)
        assert r.reason == (
            "line 5: adds microseconds and a count (c.k * f.tok_pf + c.base_us + f.gemm_pf + f.n_req); "
            "c.base_us is microseconds (line 5); c.k is microseconds (line 5) [units]"
        )
        assert search.status(1)["rejections"] == {"units": 1}
    else:
        assert (
            [o for o, _ in fixed.told] == ["archived"]
            and [p.operator for p in programs] == ["seed", "fixed"]
            and not rejections
        )


@pytest.fixture(scope="module")
def symbolic_runs(tmp_path_factory):
    """The same symbolic search (seed 6, two generations), with and without the units check."""
    out = {}
    for units in UNITS_MODES:
        d = tmp_path_factory.mktemp(f"units-{units}")
        res = invoke(
            "run",
            "--generations",
            2,
            "--seed",
            6,
            "--archive",
            d,
            *TINY,
            "--units",
            units,
            "--physics",
            "off",
            "--json",
        )
        assert res.exit_code == 0, res.output
        a = Archive(d)
        run = a.run()
        out[units] = (d, a.programs(run.id), a.rejections(run.id))
        a.close()
    return out


def _consistent(source: str) -> bool:
    try:
        check_units(parse_program(source))
        return True
    except ProgramError:
        return False


def test_a_checked_search_archives_only_unit_consistent_programs_and_records_the_rejections(symbolic_runs):
    d, programs, rejections = symbolic_runs["check"]
    assert len(programs) > 6 and all(_consistent(p.source) for p in programs)
    units = [r for r in rejections if r.rule == "units"]
    assert units, "this run (seed 6) proposes children that mix units"  # deterministic: same seed, same archive
    assert all(r.reason.endswith("[units]") and r.source and not _consistent(r.source) for r in units)
    assert stored_search(d)["units"] == "check"
    from stepml_evolve.evolve.browse.html_report import run_summary  # the run summary of `evolve archive report`

    a = Archive(d)
    try:
        assert run_summary(a, a.run(), programs)["rejections"]["units"] == len(units)
    finally:
        a.close()


def test_units_off_lets_those_children_through(symbolic_runs):
    d, programs, rejections = symbolic_runs["off"]
    assert not [r for r in rejections if r.rule == "units"]
    assert [p for p in programs if not _consistent(p.source)], "the children the checked run rejected are archived here"
    assert stored_search(d)["units"] == "off"


def test_resume_with_another_units_setting_is_refused_with_one_line(symbolic_runs):
    d, _, _ = symbolic_runs["check"]
    before = (d / Archive.FILE).read_bytes()
    res = invoke(
        "run", "--generations", 3, "--seed", 6, "--archive", d, *TINY, "--units", "off", "--physics", "off", "--resume"
    )
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()  # a note on the data, then the error
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert errors == lines[-1:] and "other search settings (units: run check, now off)" in errors[0], res.stderr
    assert (d / Archive.FILE).read_bytes() == before


def test_an_archive_stored_before_the_units_setting_resumes_as_off(tmp_path):
    d = tmp_path / "old"
    assert invoke("run", "--generations", 0, "--seed", 5, "--archive", d, *TINY, "--units", "off").exit_code == 0
    assert LEGACY_SETTINGS["units"] == "off"
    db = sqlite3.connect(d / Archive.FILE)
    run_id, config = db.execute("SELECT id, config FROM runs").fetchone()
    config = json.loads(config)
    del config["search"]["units"]
    db.execute("UPDATE runs SET config=? WHERE id=?", (json.dumps(config), run_id))
    db.commit()
    db.close()
    res = invoke("run", "--generations", 1, "--seed", 5, "--archive", d, *TINY, "--resume")  # default: check
    assert res.exit_code == 2 and "units: run off, now check" in res.stderr, res.output
    res = invoke("run", "--generations", 1, "--seed", 5, "--archive", d, *TINY, "--resume", "--units", "off", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["generations"] == 1


def test_a_seed_that_is_not_unit_consistent_is_a_one_line_error_naming_the_file(tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "good.py").write_text(seed_path("roofline").read_text())
    (seeds / "mixed.py").write_text(BAD)
    for given, named in ((seeds, seeds / "mixed.py"), (seeds / "mixed.py", seeds / "mixed.py")):
        res = invoke("run", "--generations", 0, "--archive", tmp_path / "run", "--seed-programs", given, *TINY)
        assert res.exit_code == 2, res.output
        assert res.stderr.strip().count("\n") == 0, res.stderr
        assert (
            str(named) in res.stderr
            and "line 5: adds microseconds and a count" in res.stderr
            and "[units]" in res.stderr
        )
        assert not (tmp_path / "run" / Archive.FILE).exists()
    res = invoke(
        "run",
        "--generations",
        0,
        "--archive",
        tmp_path / "run",
        "--seed-programs",
        seeds / "mixed.py",
        *TINY,
        "--units",
        "off",
        "--physics",
        "off",  # the mixed seed is below the floor too
    )
    assert res.exit_code == 0, res.output


def test_the_library_refuses_such_a_seed_too_before_storing_a_run(synthetic, tmp_path):
    from stepml_evolve.evaluator.scoring.pool import ReplayPool
    from stepml_evolve.evolve.search import Search, SearchError

    with ReplayPool(synthetic.experiments, 1) as pool:
        archive = Archive(tmp_path, create=True)
        try:
            with pytest.raises(
                SearchError, match=r"seed program mixed: line 5: adds microseconds and a count .*\[units\]"
            ):
                Search(archive, synthetic, pool, SearchConfig(), seeds=[("mixed", BAD)])
            assert archive.run() is None
        finally:
            archive.close()
    with pytest.raises(ValueError, match="units"):
        SearchConfig(units="loose")


def test_the_units_option_offers_the_search_modes():
    command = typer.main.get_command(app).commands["run"]
    (param,) = [p for p in command.params if p.opts == ["--units"]]
    assert param.default == SearchConfig().units == UNITS_MODES[0] == "check"
    res = invoke("run", "--units", "loose")
    assert res.exit_code == 2 and all(f"'{m}'" in res.stderr for m in UNITS_MODES), res.stderr
