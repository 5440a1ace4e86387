"""The evaluator file OpenEvolve loads (by path) in its processes for `evolve run --engine openevolve`.

It reads the candidate's text and posts it to the run's judge (evolve/openevolve/engine.py), an
HTTP server on 127.0.0.1 in the `evolve run` process, whose address is in STEPML_JUDGE_URL. The
judge parses the text with the DSL validator (nothing executes it), fits and replays it, and
answers with OpenEvolve's metrics and artifacts. Standard library only, apart from OpenEvolve's
own result type, so it loads in any of OpenEvolve's worker processes.
"""

import json
import os
import random
import urllib.request

from openevolve.evaluation_result import EvaluationResult

JUDGE_URL_ENV = "STEPML_JUDGE_URL"
SEED_ENV = "STEPML_OPENEVOLVE_SEED"

# OpenEvolve's workers draw prompt variations and "diverse" examples from the global `random`,
# which nothing seeds in a spawned worker. A worker loads this file before it builds its first
# prompt, so seeding here makes a prompt a function of the parent and the population. (Which
# parent is sampled still varies from process to process: OpenEvolve 0.4 draws it from lists
# built from sets of random UUIDs; see the README.)
if os.environ.get(SEED_ENV):
    random.seed(int(os.environ[SEED_ENV]))


# what a candidate scores when the judge cannot be reached: OpenEvolve stops its whole run on an
# evaluation without the feature dimensions, so a failure still returns them
FAILED = {"combined_score": 0.0, "valid": 0.0, "dsl_complexity": 0.0, "n_components": 0.0}


def evaluate(program_path):
    with open(program_path, encoding="utf-8") as f:
        code = f.read()
    request = urllib.request.Request(
        os.environ[JUDGE_URL_ENV] + "/evaluate",
        data=json.dumps({"code": code}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request) as response:  # no timeout: a full fit may take many minutes
            out = json.load(response)
    except (OSError, ValueError) as e:
        return EvaluationResult(metrics=dict(FAILED), artifacts={"rejected": f"the judge failed: {e}"})
    return EvaluationResult(metrics=out["metrics"], artifacts=out["artifacts"])
