"""A program's structure, apart from its constants' values: what the duplicate filter, the cascade's
seeding and the operators that must not propose one twice compare."""

from __future__ import annotations

import ast
import hashlib

from stepml_evolve.evaluator.dsl import Program


def structure_hash(program: Program) -> str:
    """Identity of a program's structure: its functions' ASTs, constant names, bounds and priors, not
    values (a program without bounds or priors hashes as it did before they existed)."""
    dump = [ast.dump(program.functions[n]) for n in sorted(program.functions)] + sorted(program.constants)
    dump += [f"{k} in [{lo!r}, {hi!r}]" for k, (lo, hi) in sorted(program.bounds.items())]
    dump += [f"{k} prior {p.centre!r} spread {p.spread!r}" for k, p in sorted(program.priors.items())]
    return hashlib.sha256("\n".join(dump).encode()).hexdigest()[:20]
