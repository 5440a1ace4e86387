"""Random DSL programs for the tests that hold two compilations of one program to each other
(the scalar VM against numexpr in test_dsl, Go against Python in test_emit_go)."""

from __future__ import annotations

import random

from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES


def random_expr(rng: random.Random, depth: int, consts: list[str], locals_: list[str]) -> str:
    if depth <= 0 or rng.random() < 0.25:
        kind = rng.random()
        if kind < 0.45:
            return f"f.{rng.choice(COMPONENT_NAMES)}"
        if kind < 0.75:
            return f"c.{rng.choice(consts)}"
        if kind < 0.85 and locals_:
            return rng.choice(locals_)
        return repr(round(rng.uniform(-3, 3), 3))
    a = lambda: random_expr(rng, depth - 1, consts, locals_)  # noqa: E731
    op = rng.randrange(12)
    if op < 4:
        return f"({a()} {'+-*/'[op]} {a()})"
    if op == 4:
        return f"max({a()}, {a()}, {a()})"
    if op == 5:
        return f"min({a()}, {a()})"
    if op == 6:
        return f"{rng.choice(['abs', 'sqrt', 'log', 'exp'])}({a()})"
    if op == 7:
        return f"({a()}) ** {rng.choice(['2', '3', '-1', '0.5', '1.5', '-2'])}"
    if op == 8:
        return f"(-{a()})"
    cmp = rng.choice(["<", "<=", ">", ">=", "==", "!="])
    cond = f"{a()} {cmp} {a()}"
    if op == 9:
        cond = f"({cond}) and not ({a()} > {a()})"
    elif op == 10:
        cond = f"({cond}) or {a()} < {a()} < {a()}"
    return f"({a()} if {cond} else {a()})"


def random_program(seed: int) -> str:
    rng = random.Random(seed)
    consts = [f"k{i}" for i in range(rng.randint(1, 5))]
    body, locals_ = [], []
    for j in range(rng.randint(0, 3)):
        body.append(f"    v{j} = {random_expr(rng, 3, consts, locals_)}")
        locals_.append(f"v{j}")
    body.append(f"    return {random_expr(rng, 4, consts, locals_)}")
    cdict = ", ".join(f'"{k}": {rng.uniform(-2, 5):.4f}' for k in consts)
    return f"CONSTANTS = {{{cdict}}}\n\ndef step_time(f, c):\n" + "\n".join(body) + "\n"
