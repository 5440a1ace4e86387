"""A world's experiments: every configuration of the grid replayed under the world's law, with
measurement noise, written in the replay format beside its split files.

Per configuration: draw the workload's requests, find the saturated throughput with a pilot
replay (all of them arriving at once), offer the workload's share of it as
Poisson arrivals, replay, and measure E2E and TTFT with noise (a lognormal per request and one
per run, as repeated benchmark runs differ). Everything derives from (seed, configuration index),
and nothing is written until every configuration has replayed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.data.experiments import MAX_TIME_S, MAX_TIME_US, Experiment, ExperimentError
from stepml_evolve.evaluator.dsl import compile_program
from stepml_evolve.evaluator.dsl.numexpr_compile import compile_vector, evaluate_vector, step_times
from stepml_evolve.evaluator.dsl.vm import ScalarProgram
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.components import component_values
from stepml_evolve.evaluator.known_truth.configurations import GRID_SIZES, GRIDS, Configuration, configurations
from stepml_evolve.evaluator.known_truth.laws import World, WorldError
from stepml_evolve.evaluator.known_truth.replay_files import GeneratedExperiment, write_generated
from stepml_evolve.evaluator.known_truth.splits import make_inner_splits, make_splits, split_file
from stepml_evolve.evaluator.known_truth.workloads import WORKLOADS
from stepml_evolve.evaluator.outputs import check_output_dir, directory_written_whole
from stepml_evolve.evaluator.replay.closed_loop import experiment_coefficients, replay
from stepml_evolve.evaluator.replay.state import FINISHED

GENERATOR_VERSION = 1
WORLD_FILE = "world.json"  # written last: a directory with it holds a finished generation
REQUEST_NOISE_SIGMA = 0.03
RUN_NOISE_SIGMA = 0.01
PILOT_TIMEOUT_S = 1e6
MIN_STEP_US = 1.0  # the replay's resolution: a step the law makes shorter is replayed as 1 us


def _experiment(config: Configuration, arrival, reqs, timeout_s: float) -> Experiment:
    return Experiment.from_arrays(
        config.name,
        arrival,
        reqs.inputs,
        reqs.outputs,
        arch=config.arch,
        prefix_group=reqs.prefix_group,
        prefix_tokens=reqs.prefix_tokens,
        prompt=reqs.prompt,
        timeout_s=timeout_s,
        model=config.model,
        **config.server,
    )


def _replayed(world: World, compiled, consts, exp: Experiment):
    res = replay(exp, compiled, consts, record=True, rows=False)  # the steps, for _check_step_times
    if not res.ok:
        raise _refuse(world, f"its law fails on {exp.name}: {res.failure()}")
    return res


def _refuse(world: World, problem: str) -> WorldError:
    return WorldError(f"world {world.name}: {problem}; nothing written")


def _check_constant_times(world: World, consts: np.ndarray) -> dict[str, float]:
    """output_token_time and post_decode_time (they read only the constants), each a duration of at
    least 0 (the replay would take a negative one as 0: the data would not be the law's); their
    values, for the messages of the later checks. Non-finite and overflowing ones the replay refuses."""
    scalar = ScalarProgram(compile_program(world.program))
    values = {}
    for name in ("output_token_time", "post_decode_time"):
        if name in world.program.functions:
            x = values[name] = getattr(scalar, name)(consts)
            if x < 0:
                raise _refuse(world, f"its law's {name} is {x:.3g} us, not a duration (at least 0)")
    return values


def _check_step_times(world: World, consts: np.ndarray, exp: Experiment, res) -> tuple[float, float]:
    """step_time at every step the replay of `exp` ran is at least the replay's resolution (a
    shorter step would be timed MIN_STEP_US, not as the law says), and queueing_time at each of
    its requests, after the shortest and the longest of those steps, at least 0 (a negative one
    would be taken as 0). The shortest and longest step times, for the messages of later checks."""
    t = res.trajectory
    if t.n_steps == 0:
        return 0.0, 0.0
    comps = np.array(component_values(*t.totals.T, experiment_coefficients(exp)), dtype=np.float64)
    with np.errstate(all="ignore"):
        steps = step_times(world.program, comps, consts)
    lo, hi = float(np.min(steps)), float(np.max(steps))
    if lo < MIN_STEP_US:
        raise _refuse(
            world,
            f"its law's step_time is {lo:.3g} us at a step of {exp.name}, under the replay's resolution of "
            f"{MIN_STEP_US:g} us (it would time that step {MIN_STEP_US:g} us: the data would not be the law's)",
        )
    if "queueing_time" in world.program.functions:
        inputs = {f"c_{k}": consts[j] for j, k in enumerate(world.program.constants)}
        inputs |= {"r_input_tokens": exp.input_tokens, "r_output_tokens": exp.output_tokens}
        vf = compile_vector(world.program, "queueing_time")
        for last in (lo, hi):
            with np.errstate(all="ignore"):
                q = float(np.min(evaluate_vector(vf, inputs | {"r_last_step_us": np.float64(last)})))
            if q < 0:
                raise _refuse(
                    world,
                    f"its law's queueing_time is {q:.3g} us at a request of {exp.name}, not a duration (at least 0)",
                )
    return lo, hi


def _check_in_range(world: World, config: Configuration, what: str, value_s: float, times: str) -> None:
    """What a configuration would write is within what the experiment reader accepts (MAX_TIME_S,
    its MAX_TIME_US in seconds): `evolve data check` reads every world synth writes."""
    if not value_s <= MAX_TIME_S:  # NaN too
        raise _refuse(
            world,
            f"its law makes {what} of {config.name} {value_s:.3g} s, past the {MAX_TIME_S:.0e} s ({MAX_TIME_US:.0e} us) "
            f"an experiment may hold ({times}): not the times of a server",
        )


def _times(steps: tuple[float, float], constant_times: dict[str, float]) -> str:
    lo, hi = steps
    return ", ".join([f"step_time {lo:.3g} to {hi:.3g} us", *(f"{k} {v:.3g} us" for k, v in constant_times.items())])


def _check_finished(world: World, config: Configuration, res, done: np.ndarray, needed: int, limit_s: float, what):
    """A law is checked before anything is written: `needed` requests of a configuration's replay
    finish within the client's limit, else its step times are not a server's (1e14 us a step
    replays, and would write experiments without one successful request)."""
    if int(done.sum()) >= needed:
        return
    step_us = res.clock_us / max(res.n_steps, 1)
    raise WorldError(
        f"world {world.name}: its law finishes {int(done.sum())} of {len(done)} requests of {config.name} in "
        f"{what} within the client's limit of {limit_s:g} s (a step takes {step_us:.3g} us on average): "
        "not the step time of a server; nothing written"
    )


def _saturated_throughput(finish_s: np.ndarray) -> float:
    """Requests/s of a pilot whose requests all arrive at once: all of them over the time the last
    one takes (the server full from the start; the drain at the end makes it a lower bound)."""
    return len(finish_s) / max(float(finish_s.max()), 1e-3)


def generate_world(world: World, seed: int, size: str, grid: str = GRIDS[0]) -> list[GeneratedExperiment]:
    sizing = GRID_SIZES[size]
    compiled = compile_program(world.program)
    consts = np.array(list(world.program.constants.values()))
    constant_times = _check_constant_times(world, consts)
    out = []
    for index, config in enumerate(configurations(size, grid)):
        rng = np.random.default_rng([seed, index])
        workload = WORKLOADS[config.workload]
        reqs = workload.requests(rng, sizing.requests, sizing.n_prompts)
        n = len(reqs.inputs)
        pilot_exp = _experiment(config, np.zeros(n, np.int64), reqs, PILOT_TIMEOUT_S)
        pilot = _replayed(world, compiled, consts, pilot_exp)
        times = _times(_check_step_times(world, consts, pilot_exp, pilot), constant_times)
        _check_finished(world, config, pilot, pilot.state == FINISHED, n, PILOT_TIMEOUT_S, "the pilot (all at once)")
        throughput = _saturated_throughput(pilot.e2e_us / 1e6)
        rate = workload.utilization * throughput
        timeout_s = workload.timeout(n, throughput)
        _check_in_range(world, config, "the client's limit", timeout_s, times)
        arrival_s = np.cumsum(rng.exponential(1.0 / rate, size=n))
        arrival_s -= arrival_s[0]
        _check_in_range(world, config, "the last arrival", float(arrival_s[-1]), times)
        arrival = np.round(arrival_s * 1e6).astype(np.int64)
        measured = _experiment(config, arrival, reqs, timeout_s)
        res = _replayed(world, compiled, consts, measured)
        times = _times(_check_step_times(world, consts, measured, res), constant_times)
        done = res.state == FINISHED
        _check_finished(world, config, res, done, 1, timeout_s, "the measured replay")
        noise = rng.lognormal(0.0, RUN_NOISE_SIGMA) * rng.lognormal(0.0, REQUEST_NOISE_SIGMA, n)
        e2e = np.where(done, res.e2e_us / 1e6 * noise, timeout_s + rng.uniform(0, 1, n))
        ttft = np.minimum(np.where(done, res.ttft_us / 1e6 * noise, np.nan), e2e)
        _check_in_range(world, config, "a request's E2E", float(np.max(e2e)), times)
        out.append(
            GeneratedExperiment(
                name=config.name,
                model=config.model,
                model_config=catalog().models[config.model].model_config,
                workload=config.workload,
                arrival_us=arrival,
                input_tokens=reqs.inputs,
                output_tokens=reqs.outputs,
                done=done,
                e2e_s=e2e,
                ttft_s=ttft,
                generator={"version": GENERATOR_VERSION, "seed": seed, "world": world.name, "size": size}
                | ({} if grid == GRIDS[0] else {"grid": grid}),
                profile_data=reqs.profile_data,
                stages=[(float(arrival_s[-1]), float(rate))],
                config_extra={"client_timeout_s": timeout_s},
                failed_tokens=True,
                **config.server,
            )
        )
    return out


def write_world(
    world: World, out_dir: Path, seed: int, size: str, grid: str = GRIDS[0]
) -> tuple[list[Path], dict[str, Path]]:
    """Generate the world's `grid` into a new or empty directory: its experiments and a groups file
    per split of that grid (split-<name>.yaml). Nothing is written when any check or replay fails
    (the law's too: every configuration finishes requests within its client's limit), and the
    directory is written whole or not at all."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    configs = configurations(size, grid)
    splits, inner = make_splits(configs, grid), make_inner_splits(configs, grid)
    experiments = generate_world(world, seed, size, grid)
    with directory_written_whole(out_dir) as tmp:  # a full disk half-way leaves nothing, and a rerun is not refused
        dirs = [out_dir / write_generated(tmp, g).name for g in experiments]
        for d in dirs:  # read back as `evolve data check` reads it: a world is written only if it passes
            try:
                load_experiment(tmp / d.name)
            except ExperimentError as e:
                raise _refuse(world, f"the experiment reader refuses what its law makes: {e}") from None
        files = {}
        for name, folds in splits.items():
            files[name] = split_file(out_dir, name)
            split_file(tmp, name).write_text(yaml.safe_dump(folds, sort_keys=False))
            split_file(tmp, name, inner=True).write_text(yaml.safe_dump(inner[name], sort_keys=False))
        meta = {**world_identity(world, seed, size, grid), "experiments": len(dirs)}
        (tmp / WORLD_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return dirs, files


def world_identity(world: World, seed: int, size: str, grid: str = GRIDS[0]) -> dict:
    """What makes a generated world the same one: its WORLD_FILE holds these (and the count; the
    grid when it is not the standard one, so a world generated before grids existed is the same)."""
    identity = {"world": world.name, "seed": seed, "size": size, "generator": GENERATOR_VERSION}
    return identity if grid == GRIDS[0] else {**identity, "grid": grid}
