"""Known-truth worlds (evaluator/worlds, worlds/): hidden laws the seeds do not have, the grid of
configurations they are measured on, splits that extrapolate, `evolve data synth --world`, and
the benchmark `evolve bench --worlds --quick`."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from conftest import ROOT, archive_rows
from typer.testing import CliRunner

from stepml_evolve.archive.access import opened
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import load_program, parse_program
from stepml_evolve.evaluator.dsl.units import check_units
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.crossval import make_folds
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.known_truth import (
    SPLITS,
    WorldError,
    configurations,
    generate_world,
    load_world,
    make_inner_splits,
    make_splits,
    world_names,
    write_world,
)
from stepml_evolve.evaluator.known_truth.configurations import (
    HELD_OUT_WORKLOADS,
    KNOBS,
    TRAIN_WORKLOADS,
    TRAINED_SEQS,
    TRAINED_TOKENS,
    kv_blocks,
)
from stepml_evolve.evaluator.known_truth.workloads import STANDARD_WORKLOADS
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.commands.bench_worlds import SETTINGS_FILE, _check_resumable, _held_out, bench_world, started
from stepml_evolve.evolve.commands.bench_worlds_results import HeldOut, SplitResult
from stepml_evolve.evolve.deploy.rules import DEFAULT_RULE, RULES, choose
from stepml_evolve.evolve.search.cascade import structure_hash
from stepml_evolve.seeds import baseline_paths, seed_path, seed_paths


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# ---- the laws ---------------------------------------------------------------------------------


def test_there_are_at_least_eight_worlds_each_a_valid_law_with_documented_physics():
    names = world_names()
    assert len(names) >= 8
    for name in names:
        world = load_world(name)
        check_units(world.program)  # step_time is a time, queueing_time a time, ...
        assert len(world.program.doc) > 150, f"{name}: the docstring must say what physics the law stands for"
        assert world.summary and len(world.summary) < 60


def test_no_world_is_a_seed_and_the_search_cannot_see_them():
    seeds = {structure_hash(parse_program(p.read_text())) for p in seed_paths()}
    prompts = " ".join(p.read_text() for p in (ROOT / "prompts").glob("*.j2"))
    for name in world_names():
        assert structure_hash(load_world(name).program) not in seeds, name
        assert name not in prompts
    assert not {p.stem for p in seed_paths()} & set(world_names())
    assert "worlds" not in prompts


def test_a_law_file_by_path_is_a_world_too(tmp_path):
    law = tmp_path / "my_law.py"
    law.write_text((ROOT / "worlds" / "launch_bound.py").read_text())
    assert load_world(str(law)).name == "my_law"


# ---- the grid ---------------------------------------------------------------------------------


def test_the_full_grid_spans_gpus_models_tp_knobs_and_workloads():
    configs = configurations("full")
    assert {c.hardware for c in configs} == {"H100", "A100-80GB", "L40S"}
    assert {c.model for c in configs} == set(catalog().models)
    for new in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-14B", "allenai/OLMoE-1B-7B-0924"):  # GQA 8B, 14B, MoE
        assert new in catalog().models
    assert {c.tp for c in configs} == {1, 2, 4, 8}
    assert {(c.max_num_batched_tokens, c.max_num_seqs) for c in configs} == set(KNOBS)
    assert (
        min(c.max_num_batched_tokens for c in configs) == 256 and max(c.max_num_batched_tokens for c in configs) == 8192
    )
    assert min(c.max_num_seqs for c in configs) == 32 and max(c.max_num_seqs for c in configs) == 512
    assert {c.workload for c in configs} == set(STANDARD_WORKLOADS)
    assert len({c.name for c in configs}) == len(configs)


def test_a_deployment_is_in_the_grid_only_where_its_weights_leave_room_for_the_kv_cache():
    # 70B in BF16 is 138 GB: no single 80 GB GPU holds it, two L40S (96 GB) do not either
    assert kv_blocks("meta-llama/Llama-2-70b-hf", "H100", 1) == 0
    assert kv_blocks("meta-llama/Llama-2-70b-hf", "L40S", 2) == 0
    assert kv_blocks("meta-llama/Llama-2-70b-hf", "L40S", 4) > 0
    # more GPUs leave more room; a smaller memory less
    assert kv_blocks("meta-llama/Llama-3.1-8B", "H100", 2) > kv_blocks("meta-llama/Llama-3.1-8B", "H100", 1)
    assert kv_blocks("meta-llama/Llama-3.1-8B", "L40S", 1) < kv_blocks("meta-llama/Llama-3.1-8B", "H100", 1)
    for c in configurations("full"):
        assert c.kv_blocks == kv_blocks(c.model, c.hardware, c.tp) > 0
        assert c.tp == min(tp for tp in (1, 2, 4, 8) if kv_blocks(c.model, c.hardware, tp)) or c.tp % 2 == 0


@pytest.mark.parametrize("size", ["small", "medium", "full"])
def test_every_split_extrapolates(size):
    configs = configurations(size)
    splits = make_splits(configs)
    assert set(splits) == {s.name for s in SPLITS if s.grid == "standard"}
    by_name = {c.name: c for c in configs}
    for split, folds in splits.items():
        (held,) = folds.values()
        out = [by_name[n] for n in held]
        inside = [c for c in configs if c.name not in held]
        assert out and inside
        if split == "by-gpu":
            assert {c.hardware for c in out} == {"L40S"} and "L40S" not in {c.hardware for c in inside}
        elif split == "by-size":
            assert min(c.parameters for c in out) > max(c.parameters for c in inside)
        else:
            assert all(TRAINED_TOKENS[0] <= c.max_num_batched_tokens <= TRAINED_TOKENS[1] for c in inside)
            assert all(TRAINED_SEQS[0] <= c.max_num_seqs <= TRAINED_SEQS[1] for c in inside)
            assert all(not c.trained_knobs for c in out)


@pytest.mark.parametrize("size", ["small", "medium", "full"])
def test_inner_splits_extrapolate_the_same_way_inside_the_train_configurations(size):
    """What `bench --worlds --select inner` selects by: inside a split's train configurations,
    a trained GPU held out, the largest trained model(s), the trained knob range's ends."""
    configs = configurations(size)
    held = {name: set(*folds.values()) for name, folds in make_splits(configs).items()}
    by_name = {c.name: c for c in configs}
    for split, folds in make_inner_splits(configs).items():
        trained = [c for c in configs if c.name not in held[split]]
        for names in folds.values():
            out = [by_name[n] for n in names]
            assert out and len(out) < len(trained) and not set(names) & held[split]
        if split == "by-gpu":
            assert set(folds) == {c.hardware for c in trained} == {"H100", "A100-80GB"}
            assert all({by_name[n].hardware for n in names} == {gpu} for gpu, names in folds.items())
        elif split == "by-size":
            (names,) = folds.values()
            assert min(by_name[n].parameters for n in names) == max(c.parameters for c in trained)
        else:
            (names,) = folds.values()
            inside = [c for c in trained if c.name not in names]
            assert inside and all(c.trained_knobs for c in trained)
            tokens = [c.max_num_batched_tokens for c in inside]
            seqs = [c.max_num_seqs for c in inside]
            assert TRAINED_TOKENS[0] < min(tokens) and max(tokens) < TRAINED_TOKENS[1]
            assert TRAINED_SEQS[0] < min(seqs) and max(seqs) < TRAINED_SEQS[1]


def test_a_grid_without_a_configuration_in_a_split_is_refused_naming_the_split():
    only_h100 = [c for c in configurations("small") if c.hardware == "H100"]
    with pytest.raises(WorldError, match="split by-gpu: the grid holds out no configuration"):
        make_splits(only_h100)


# ---- generating a world -----------------------------------------------------------------------


def test_a_world_is_deterministic_by_seed():
    world = load_world("attention_switch")
    a, b, c = (generate_world(world, s, "small") for s in (3, 3, 4))
    for x, y in zip(a, b):
        assert x.name == y.name
        assert np.array_equal(x.arrival_us, y.arrival_us) and np.array_equal(x.e2e_s, y.e2e_s)
    assert not np.array_equal(a[0].e2e_s, c[0].e2e_s)


def test_data_synth_world_writes_experiments_the_law_explains_and_split_files_cv_reads(tmp_path):
    out = tmp_path / "world"
    res = cli("data", "synth", "--world", "prompt_hashing", "--out", out, "--size", "small", "--seed", "2")
    assert res.exit_code == 0, res.output
    assert "split by-gpu: evolve cv" in res.output
    assert sorted(p.name for p in out.glob("split-*.yaml")) == sorted(
        f"split-{s.name}{inner}.yaml" for s in SPLITS if s.grid == "standard" for inner in ("", ".inner")
    )
    assert json.loads((out / "world.json").read_text())["world"] == "prompt_hashing"
    loaded = load_data(out)
    assert not loaded.errors and len(loaded.experiments) == len(configurations("small"))
    assert {e.hardware.name for e in loaded.experiments} == {"H100", "A100-80GB", "L40S"}
    overloaded = [e for e in loaded.experiments if e.workload == "overloaded"]
    assert overloaded and all(0 < e.failed.mean() < 0.8 for e in overloaded)  # the client gave up on some
    assert not any(e.failed.any() for e in loaded.experiments if e.workload != "overloaded")

    check = cli("data", "check", "--data", out, "--json")
    assert check.exit_code == 0, check.output
    reuse = [e for e in json.loads(check.output)["experiments"] if "prompt-reuse" in e["name"]]
    assert reuse and all(e["prompt_reuse"]["cached_share"] > 0.5 for e in reuse)

    # the law, with its own constants, explains its data to the noise (3 % a request, 1 % a run)
    law = ROOT / "worlds" / "prompt_hashing.py"
    ev = cli("eval", law, "--data", out, "--split", "all", "--json")
    assert ev.exit_code == 0, ev.output
    report = json.loads(ev.output)
    assert report["loss"] < 6.0

    cv = cli(
        "cv", law, "--data", out, "--protocol", f"groups:{out / 'split-by-gpu.yaml'}", "--json", "--max-evals", "8"
    )
    assert cv.exit_code == 0, cv.output
    folds = json.loads(cv.output[cv.output.index("{") :])["folds"]  # after the fit's progress line
    assert [f["name"] for f in folds] == ["L40S"]
    assert all("l40s" not in n for n in folds[0]["train"])


def test_unknown_world_or_a_law_the_dsl_rejects_exits_2_in_one_line_writing_nothing(tmp_path):
    res = cli("data", "synth", "--world", "no_such_world", "--out", tmp_path / "a")
    assert res.exit_code == 2
    assert "unknown world 'no_such_world' (known: allreduce_latency" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "a").exists()

    bad = tmp_path / "bad_law.py"
    bad.write_text('"""x"""\nimport os\n\ndef step_time(f, c):\n    return 1.0\n')
    res = cli("data", "synth", "--world", bad, "--out", tmp_path / "b")
    assert res.exit_code == 2 and str(bad) in res.output and "Traceback" not in res.output
    assert not (tmp_path / "b").exists()

    counts = tmp_path / "count_law.py"  # a step time that is a count, not a time
    counts.write_text('"""x"""\nCONSTANTS = {}\n\ndef step_time(f, c):\n    return f.n_req\n')
    res = cli("data", "synth", "--world", counts, "--out", tmp_path / "c")
    assert res.exit_code == 2 and str(counts) in res.output and "[units]" in res.output
    assert not (tmp_path / "c").exists()

    res = cli("data", "synth", "--size", "medium", "--out", tmp_path / "d")  # a grid's size, not the sample's
    assert res.exit_code == 2 and "--size medium is a size of a world's grid" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


def test_data_worlds_lists_every_world():
    res = CliRunner().invoke(app, ["data", "worlds"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for name in world_names():
        assert name in res.output


# ---- the benchmark ----------------------------------------------------------------------------


def _bench_report(res) -> dict:
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{") :])


# the quick benchmark on one of its two worlds: each world is the same work (its search and its
# scoring), and one is half the suite's slowest fixture
QUICK = ["bench", "--worlds", "--quick", "--world", "launch_bound"]


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """One quick benchmark for the tests below (minutes): its directory and report."""
    out = tmp_path_factory.mktemp("bench") / "bench"
    report = _bench_report(CliRunner().invoke(app, [*QUICK, "--out", str(out), "--json"]))
    return out, report


def test_bench_worlds_quick_scores_seeds_search_and_law_held_out(quick_bench, tmp_path):
    out, report = quick_bench
    assert report == json.loads((out / "bench-worlds.json").read_text())
    results = report["results"]
    assert [(r["world"], r["split"]) for r in results] == [("launch_bound", "by-gpu")]
    for r in results:
        assert {s["program"] for s in r["seeds"]} == {p.stem for p in seed_paths()}
        assert r["best_seed"]["loss"] == min(s["loss"] for s in r["seeds"])
        # the baselines (BLIS's blackbox) are scored beside the seeds, never one of them
        assert [b["program"] for b in r["baselines"]] == [p.stem for p in baseline_paths()] == ["blackbox"]
        assert all(math.isfinite(b["loss"]) for b in r["baselines"])
        # the law refitted is the noise floor: below every seed held out
        assert r["law"]["loss"] < r["best_seed"]["loss"] and r["law"]["loss"] < 10
        # recovered: within 1.5x of the law, and better than the best seed (a law refitted worse than
        # a seed makes recovering it no feat)
        assert r["recovered"] == (r["winner"]["loss"] <= 1.5 * r["law"]["loss"] and r["beats_seed"])
        # every deployment rule's pick scored held out, the default rule's being the winner
        assert set(r["rules"]) == set(RULES) and r["rules"][DEFAULT_RULE] == r["winner"]
        assert r["search_seed"] == 0
        # the winner's and the law's fits on the train configurations say whether those could tell them apart
        assert r["train_ratio"] == pytest.approx(r["winner"]["train_loss"] / r["law"]["train_loss"])
        expected = "recovered" if r["recovered"] else "unidentified" if r["train_ratio"] <= 1.1 else "not found"
        assert r["diagnosis"] == expected
        assert r["beats_seed"] == (r["winner"]["loss"] < r["best_seed"]["loss"])
        assert r["winner_origin"]  # "seed roofline", or the operator that made the winner
        assert (out / r["world"] / "by-gpu-archive" / Archive.FILE).is_file()
        train = sorted(p.name for p in (out / r["world"] / "by-gpu-train").iterdir())
        assert train and not any("l40s" in n for n in train)  # the search never saw the held-out GPU
    assert report["summary"]["of"] == 1
    assert sum(report["summary"]["diagnoses"].values()) == 1
    # --quick fits each seed from one start, and says so in the settings a resume must keep
    assert json.loads((out / SETTINGS_FILE).read_text())["seed_starts"] == 1
    with opened(out / "launch_bound" / "by-gpu-archive") as archive:
        assert archive.run().config["search"]["seed_starts"] == 1
    assert started(out, "seed_starts") == 1  # what a resumed benchmark runs with, --quick or not
    stored = {k: v for k, v in json.loads((out / SETTINGS_FILE).read_text()).items() if k != "seed_starts"}
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(stored))
    assert started(tmp_path, "seed_starts") == 3  # stored before the setting: the default it ran with


def test_a_resumed_benchmark_keeps_what_it_finished_and_redoes_only_what_is_missing(quick_bench):
    """--resume: finished splits are kept as they are; a split killed after its search (no result
    file) is scored again from its archive, to the same numbers; the settings must be the same,
    and a search cannot be shortened."""
    out, report = quick_bench
    resume = [*QUICK, "--out", str(out), "--resume", "--json"]
    res = CliRunner().invoke(app, resume)
    assert "(search seed 0): done before, kept" in res.output
    assert _bench_report(res)["results"] == report["results"]

    killed = out / "launch_bound" / "by-gpu-result.json"
    killed.unlink()
    res = CliRunner().invoke(app, resume)
    assert "its search is at generation 2; nothing to run" in res.output  # the search was not run again
    assert _bench_report(res)["results"] == report["results"]  # its winner scored again, the same
    assert killed.is_file()

    for args, message in [
        (["--seed", "1"], "the benchmark started with seed 0, not 1; resume it with the same settings"),
        (["--search-seed", "1"], "the benchmark started with search_seed None, not 1; resume it"),
        (["--unexercised", "allow"], "the benchmark started with unexercised 'reject', not 'allow'"),
        (["--generations", "1"], "its search is at generation 2, past --generations 1"),
    ]:
        res = cli(*resume, *args)
        assert res.exit_code == 2 and message in res.output, res.output
    assert cli(*QUICK, "--out", out.parent / "new", "--resume").exit_code == 2
    assert not (out.parent / "new").exists()


def test_a_search_seed_draws_another_search_on_the_same_world_and_scores_its_own_baselines(quick_bench, tmp_path):
    """--search-seed S: the searches run with seed S on the world's data as generated; the
    baselines are the seeds as that search fitted them, so a winner that is a seed scores as it."""
    out, report = quick_bench
    copy = tmp_path / "bench"
    shutil.copytree(out / "launch_bound", copy / "launch_bound", symlinks=True)
    shutil.rmtree(copy / "launch_bound" / "by-gpu-archive")
    (copy / "launch_bound" / "by-gpu-result.json").unlink()
    (copy / "launch_bound" / "by-gpu-baselines.json").unlink()
    data = copy / "launch_bound" / "data" / "world.json"
    made = data.stat().st_mtime
    (result,) = bench_world(
        "launch_bound",
        copy,
        size="small",
        generations=1,
        seed=0,
        search_seed=3,
        splits=["by-gpu"],
        front_cv="inner",
        fits=1,
        seed_starts=1,  # as --quick: the search seed, not the seed fits' starts, is what this test is about
    )
    assert archive_rows(copy / "launch_bound" / "by-gpu-archive", "select seed from runs") == [(3,)]
    # --front-cv inner: the search's end asked the split's own question inside its train
    # configurations (one trained GPU held out), and the default rule ranked by that CV loss
    inner = f"groups:{copy / 'launch_bound' / 'data' / 'split-by-gpu.inner.yaml'}"
    assert {p for (p,) in archive_rows(copy / "launch_bound" / "by-gpu-archive", "select protocol from cv_scores")} == {
        inner
    }
    with opened(copy / "launch_bound" / "by-gpu-archive") as archive:
        assert choose(archive, DEFAULT_RULE).protocol == inner
    assert data.stat().st_mtime == made  # the world was not generated again
    assert result.search_seed == 3 and {s.program for s in result.seeds} == {p.stem for p in seed_paths()}
    if result.winner_origin.startswith("seed "):
        seed = next(s for s in result.seeds if s.program == result.winner_origin[5:])
        assert result.winner.loss == seed.loss


def test_archive_top_scores_the_archives_best_held_out_without_searching_again(quick_bench):
    """--archive-top K on a finished benchmark: each split gains the best held-out loss among its
    winner and the archive's K best by train loss (quick runs have no front CV), scored as the
    winner was; nothing else in the result changes and no search runs again."""
    out, report = quick_bench
    resume = [*QUICK, "--out", str(out), "--resume", "--archive-top", "2"]
    res = CliRunner().invoke(app, [*resume, "--json"])
    assert "nothing to run" not in res.output  # the searches were not resumed
    after = _bench_report(res)["results"]

    def plain(result: dict) -> dict:
        return {k: v for k, v in result.items() if not k.startswith("archive_")}

    for before, r in zip(report["results"], after):
        assert before["archive_best"] is None and before["archive_scored"] == 0
        assert plain(r) == plain(before)
        assert 1 <= r["archive_scored"] <= 3
        assert r["archive_best"]["loss"] <= r["winner"]["loss"]  # the winner is one of those scored
        assert r["archive_recovers"] == (
            r["archive_best"]["loss"] <= 1.5 * r["law"]["loss"] and r["archive_best"]["loss"] < r["best_seed"]["loss"]
        )
        with opened(out / r["world"] / "by-gpu-archive") as archive:
            ids = {f"#{p.id}" for p in archive.programs()}
        assert r["archive_best"]["program"] in ids
    res = CliRunner().invoke(app, resume, env={"COLUMNS": "320"})
    assert res.exit_code == 0 and "done before, kept" in res.output
    assert "best in" in res.output  # the column of --archive-top


def test_the_workload_grid_trains_on_resent_prompts_and_holds_out_long_prompts():
    """The by-workload split mirrors the shift the real data cannot show: every deployment under two
    resent prompt lists with fixed output lengths (train) and long prompts computed in full or
    behind one shared prefix, outputs of every length (held out)."""
    configs = configurations("small", "workloads")
    deployments = {(c.model, c.hardware, c.tp) for c in configs}
    assert len(configs) == 4 * len(deployments)
    for d in deployments:
        assert sorted(c.workload for c in configs if (c.model, c.hardware, c.tp) == d) == sorted(
            TRAIN_WORKLOADS + HELD_OUT_WORKLOADS
        )
    (folds,) = make_splits(configs, "workloads").values()
    (held,) = folds.values()
    by_name = {c.name: c for c in configs}
    assert {by_name[n].workload for n in held} == set(HELD_OUT_WORKLOADS)
    (inner,) = make_inner_splits(configs, "workloads").values()
    assert {by_name[n].workload for fold in inner.values() for n in fold} == {TRAIN_WORKLOADS[-1]}
    # the budgets of issue 52's runs: 64 (behind a shared prefix) and 4,096 (computed in full)
    assert {c.max_num_batched_tokens for c in configs if c.workload in HELD_OUT_WORKLOADS} == {64, 4096}


def test_data_synth_writes_the_workload_grid_the_loader_reads_as_resent_cached_and_varied(tmp_path):
    out = tmp_path / "w"
    res = cli("data", "synth", "--world", "launch_bound", "--grid", "workloads", "--out", out, "--size", "small")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.glob("split-*.yaml")) == [
        "split-by-workload.inner.yaml",
        "split-by-workload.yaml",
    ]
    assert json.loads((out / "world.json").read_text())["grid"] == "workloads"
    check = cli("data", "check", "--data", out, "--json")
    rows = {e["name"]: e for e in json.loads(check.output)["experiments"]}
    loaded = {e.name: e for e in load_data(out).experiments}
    for name, row in rows.items():
        exp = loaded[name]
        reuse = row["prompt_reuse"]
        if "prompt-reuse" in name:  # resent: the prefix cache serves most of each prompt; one output length
            assert reuse["cached_share"] > 0.8 and len(set(exp.output_tokens)) == 1
        elif "shared-prefix" in name:  # a 1,024-token prefix of 1,700-4,200: about a third cached
            assert 0.2 < reuse["cached_share"] < 0.5 and len(set(exp.output_tokens)) > 20
            assert exp.input_tokens.min() >= 1700 and exp.server.max_num_batched_tokens == 64
        else:  # computed in full
            assert reuse["cached_share"] == 0 and len(set(exp.output_tokens)) > 20


def test_recovering_the_law_requires_beating_the_best_seed():
    def held(name, loss):
        return HeldOut(name, loss, loss / 2, loss / 2)

    seeds = (held("roofline", 5.0), held("blackbox", 90.0))
    worse_law = SplitResult("w", "by-gpu", 3, seeds, held("#9", 6.0), held("law", 5.5), 10)
    assert not worse_law.recovered and not worse_law.beats_seed  # within 1.5x of a law that is worse than a seed
    better = SplitResult("w", "by-gpu", 3, seeds, held("#9", 4.0), held("law", 3.0), 10)
    assert better.recovered and better.beats_seed


def test_bench_worlds_with_an_unknown_world_exits_2_writing_nothing(tmp_path):
    res = cli("bench", "--worlds", "--world", "nope", "--out", tmp_path / "b")
    assert res.exit_code == 2 and "unknown world 'nope'" in res.output
    res = cli("bench", "--worlds", "--quick", "--select", "best", "--out", tmp_path / "b")
    assert res.exit_code == 2 and "--select must be one of validation, inner, not 'best'" in res.output
    res = cli("bench", "--worlds", "--split", "by-colour", "--out", tmp_path / "b")
    assert res.exit_code == 2 and "--split: unknown split 'by-colour' (the splits are by-gpu," in res.output
    assert not (tmp_path / "b").exists()


def test_a_programs_held_out_score_is_the_fit_with_the_lowest_train_loss_or_the_median(tmp_path):
    """--held-out-fits N: the program fitted with fit seeds seed .. seed + N - 1, the first from its
    own constants and the others from draws from its priors (as a search fits its seeds), every fit's
    held-out and train loss kept; its scores those of the fit with the lowest train loss (the
    default), or the median held-out fit's (--held-out-pick median); one fit is the first of them."""
    from stepml_evolve.evaluator.fit.starts import drawn_start

    world = load_world("launch_bound")
    _, split_files = write_world(world, tmp_path, seed=1, size="small")
    loaded = load_data(tmp_path)
    protocol = f"groups:{split_files['by-gpu']}"
    folds = make_folds(protocol, loaded.experiments)
    program = load_program(seed_path("roofline"))
    with ReplayPool(loaded.experiments) as pool:
        by_train = _held_out("roofline", program, loaded, pool, protocol, folds, 5, fits=3, max_evals=4)
        median = _held_out("roofline", program, loaded, pool, protocol, folds, 5, fits=3, max_evals=4, pick="median")
        rng = np.random.default_rng([5, 0x5EED])
        starts = [program] + [program.with_constants(drawn_start(program, program.constants, rng)) for _ in (6, 7)]
        ones = [
            _held_out("roofline", p, loaded, pool, protocol, folds, s, max_evals=4) for p, s in zip(starts, (5, 6, 7))
        ]
    assert [(o.losses, o.train_losses) for o in ones] == [((), ())] * 3
    assert by_train.losses == median.losses == tuple(o.loss for o in ones)  # fit seeds 5, 6, 7
    assert by_train.train_losses == median.train_losses and len(by_train.train_losses) == 3
    assert len(set(by_train.losses)) > 1  # the fits end apart: the test can fail
    picked = ones[int(np.argmin(by_train.train_losses))]
    assert (by_train.loss, by_train.e2e_ape, by_train.ttft_ape) == (picked.loss, picked.e2e_ape, picked.ttft_ape)
    middle = sorted(ones, key=lambda o: o.loss)[1]
    assert (median.loss, median.e2e_ape, median.ttft_ape) == (middle.loss, middle.e2e_ape, middle.ttft_ape)
    # the picked fit's train loss is kept with it, as one fit's is
    assert by_train.train_loss == min(by_train.train_losses) == picked.train_loss
    assert median.train_loss == middle.train_loss == by_train.train_losses[ones.index(middle)]


def _split(winner: HeldOut, law: HeldOut) -> SplitResult:
    seed = HeldOut("roofline", 9.0, 3.0, 4.0, train_loss=6.0)
    return SplitResult("w", "by-gpu", 4, (seed,), winner, law, 500)


def test_a_split_says_whether_its_train_configurations_could_tell_the_winner_from_the_law():
    """Not recovered, the winner either fits the train configurations as well as the law (within
    1.1x, or better: "unidentified", no rule selecting by them could prefer the law) or worse ("not
    found"); a result stored before the picked fit's train loss was kept reads it from its fits."""
    law = HeldOut("law", 3.0, 1.3, 1.4, train_loss=2.6)
    cases = [
        (4.4, 9.0, "recovered"),
        (8.7, 2.74, "unidentified"),
        (8.7, 1.45, "unidentified"),
        (21.1, 5.97, "not found"),
    ]
    for held, train, diagnosis in cases:
        r = _split(HeldOut("#7", held, 3.0, 5.0, train_loss=train), law)
        assert r.train_ratio == pytest.approx(train / 2.6) and r.diagnosis == diagnosis
        assert SplitResult.from_json(json.loads(json.dumps(r.to_json()))).diagnosis == diagnosis
    stored = {
        "program": "#7",
        "loss": 8.7,
        "e2e_ape": 3.0,
        "ttft_ape": 5.0,
        "losses": [9.1, 8.7],
        "train_losses": [1.9, 1.45],
    }
    legacy = SplitResult.from_json({**_split(HeldOut("#7", 8.7, 3.0, 5.0), law).to_json(), "winner": stored})
    assert legacy.winner.train_loss == 1.45 and legacy.diagnosis == "unidentified"
    unknown = _split(HeldOut("#7", 8.7, 3.0, 5.0), law)  # one fit, stored before: no train loss
    assert unknown.diagnosis is None and unknown.to_json()["train_ratio"] is None


def test_a_benchmark_started_before_the_pick_rule_resumes_with_the_median_it_used(tmp_path):
    started = {"worlds": ["launch_bound"], "seed": 0, "held_out_fits": 3}  # stored without held_out_pick
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(started))
    _check_resumable(tmp_path, {**started, "held_out_pick": "median"})
    with pytest.raises(UserError, match="started with held_out_pick 'median', not 'train'"):
        _check_resumable(tmp_path, {**started, "held_out_pick": "train"})
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({**started, "held_out_fits": 1}))
    _check_resumable(tmp_path, {**started, "held_out_fits": 1, "held_out_pick": None})  # one fit: no rule


def test_a_benchmark_started_before_unexercised_resumes_with_allow_it_ran(tmp_path):
    started = {"worlds": ["launch_bound"], "seed": 0}  # stored without unexercised
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(started))
    _check_resumable(tmp_path, {**started, "unexercised": "allow"})
    with pytest.raises(UserError, match="started with unexercised 'allow', not 'reject'"):
        _check_resumable(tmp_path, {**started, "unexercised": "reject"})


def test_a_benchmark_resumes_with_the_front_cv_it_started_with(tmp_path):
    """--front-cv is a benchmark's setting (default lomo, as evolve run; inner: the split's own
    question): a resume must keep it, and an unknown one is refused in one line."""
    started = {"worlds": ["launch_bound"], "front_cv": "lomo"}
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(started))
    _check_resumable(tmp_path, started)
    with pytest.raises(UserError, match="started with front_cv 'lomo', not 'inner'"):
        _check_resumable(tmp_path, {**started, "front_cv": "inner"})
    res = CliRunner().invoke(app, ["bench", "--worlds", "--front-cv", "groups", "--out", str(tmp_path / "new")])
    assert res.exit_code == 2 and "--front-cv must be one of lomo, lowo, none, inner" in res.output
    assert not (tmp_path / "new").exists()
