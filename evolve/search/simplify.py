"""A child simplified before its fit, so the archive's front holds distinct physics, not the same
physics written twice.

Three rewrites, in step_time and queueing_time (locals inlined where one applies):
  * repeated terms merged: in a sum, two terms of one sign that differ only in their constant
    factors (`c.k1 * f.ctx_sum + c.k2 * f.ctx_sum`) are one term, kept with the first constant;
  * constants folded: in a product, two or more constants are one free factor
    (`c.a * c.k1 * f.x`), kept as the one with the tightest prior (the seed's physical one before a
    search-added one), its value their product;
  * bare constants summed: a sum's several constant terms (`c.base_us + c.k2`) are one.
A kept constant takes the folded value, moved into its bounds; constants no longer read are
dropped. A program with nothing to simplify comes back unchanged (same text).
"""

from __future__ import annotations

import ast
import math

from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.dsl.program import clip_to, inlined

from .symbolic import assemble

FUNCTIONS = ("step_time", "queueing_time")


def _is_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "c"


def _terms(node: ast.AST, sign: int = 1) -> list[tuple[int, ast.AST]]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        right = -sign if isinstance(node.op, ast.Sub) else sign
        return _terms(node.left, sign) + _terms(node.right, right)
    return [(sign, node)]


def _factors(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _join(items: list[ast.AST], op: ast.operator) -> ast.AST:
    out = items[0]
    for x in items[1:]:
        out = ast.BinOp(left=out, op=op, right=x)
    return out


class _Simplifier(ast.NodeTransformer):
    def __init__(self, program: Program, values: dict[str, float]):
        self.program, self.values, self.notes = program, values, []

    def _tightness(self, name: str) -> float:
        prior = self.program.priors.get(name)
        return prior.spread if prior and prior.relative else math.inf

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Mult):
            return self._fold_product(node)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return self._merge_sum(node)
        return node

    def _fold_product(self, node: ast.BinOp) -> ast.AST:
        factors = _factors(node)
        consts = [f for f in factors if _is_constant(f)]
        names = list(dict.fromkeys(c.attr for c in consts))
        if len(consts) < 2 or len(names) != len(consts):
            return node  # one constant, or one constant twice (c.k * c.k is its square, not a product of two)
        keep = min(names, key=lambda n: (self._tightness(n), names.index(n)))
        self.values[keep] = math.prod(self.values[n] for n in names)
        self.notes.append(f"folded {' * '.join('c.' + n for n in names)} into c.{keep}")
        rest = [f for f in factors if not _is_constant(f)]
        kept = next(c for c in consts if c.attr == keep)
        return _join([kept, *rest], ast.Mult())

    def _merge_sum(self, node: ast.BinOp) -> ast.AST:
        terms = _terms(node)
        out: list[tuple[int, ast.AST]] = []
        shapes: dict[tuple[int, str], int] = {}  # (sign, the term without its constant) -> its index in out
        bare: dict[int, int] = {}  # sign -> index in out of the first bare constant
        changed = False
        for sign, term in terms:
            factors = _factors(term)
            consts = [f for f in factors if _is_constant(f)]
            if _is_constant(term):
                if sign in bare:
                    first = out[bare[sign]][1].attr
                    self.values[first] += self.values[term.attr]
                    self.notes.append(f"summed c.{term.attr} into c.{first}")
                    changed = True
                    continue
                bare[sign] = len(out)
            elif len(consts) == 1:
                rest = [f for f in factors if not _is_constant(f)]
                key = (sign, ast.dump(_join(rest, ast.Mult())))
                if key in shapes:
                    first = next(f for f in _factors(out[shapes[key]][1]) if _is_constant(f)).attr
                    if first != consts[0].attr:
                        self.values[first] += self.values[consts[0].attr]
                    else:  # the same term twice: twice its constant
                        self.values[first] *= 2
                    self.notes.append(f"merged the repeated term {ast.unparse(term)} into c.{first}'s")
                    changed = True
                    continue
                shapes[key] = len(out)
            out.append((sign, term))
        if not changed:
            return node
        result = out[0][1] if out[0][0] > 0 else ast.UnaryOp(op=ast.USub(), operand=out[0][1])
        for sign, term in out[1:]:
            result = ast.BinOp(left=result, op=ast.Add() if sign > 0 else ast.Sub(), right=term)
        return result


def simplify(program: Program) -> tuple[Program, list[str]]:
    """The program with repeated terms merged and redundant constants folded, and what was done
    (nothing: the program itself)."""
    values = dict(program.constants)
    exprs, notes = {}, []
    for name in FUNCTIONS:
        if name not in program.functions:
            continue
        s = _Simplifier(program, values)
        expr = s.visit(inlined(program.functions[name]))
        if s.notes:
            exprs[name] = ast.unparse(ast.fix_missing_locations(expr))
            notes += s.notes
    if not exprs:
        return program, []
    text = program
    for name, expr in exprs.items():
        kept = {k: clip_to(v, program.bounds.get(k)) for k, v in values.items()}
        text = parse_program(assemble(text, name, expr, kept, program.doc, program.bounds, program.priors))
    return text, notes
