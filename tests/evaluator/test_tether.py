"""The tether (evaluator/physics/tether.py): how far step times stray from a reference's over the
floor's envelope, and the largest coefficient a term may take to stay within it, which bounds what
the screening weighs a term by and what the `residual_term` child may fit it to."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepml_evolve.evaluator.physics.tether import TETHER_FACTOR, TETHER_SHARE, coefficient_caps, stray


def test_a_cap_is_the_coefficient_at_which_the_tether_share_of_steps_reaches_the_factor():
    steps = np.full(1000, 100.0)
    g = np.linspace(0.0, 100.0, 1000)
    cap = coefficient_caps(g[None, :], steps, steps)[0]
    # at the TETHER_SHARE quantile g is q, and 100 + k q = 150 there
    q = float(np.quantile(g, TETHER_SHARE))
    assert cap == pytest.approx((TETHER_FACTOR - 1) * 100.0 / q, rel=1e-6)
    assert stray(steps + cap * g, steps) <= TETHER_FACTOR + 1e-9
    assert stray(steps + 1.01 * cap * g, steps) > TETHER_FACTOR


def test_no_room_no_term_and_a_term_that_adds_nothing_is_unbounded():
    steps, reference = np.full(200, 100.0), np.full(200, 100.0)
    g = np.stack([np.zeros(200), np.r_[np.full(199, 1.0), np.nan], np.full(200, 1.0)])
    caps = coefficient_caps(g, steps, reference)
    assert caps[0] == math.inf and caps[1] == 0.0 and caps[2] == pytest.approx(50.0, rel=1e-6)
    # a term that adds time on fewer points than the tether leaves free can never stray it
    rare, common = np.zeros(200), np.zeros(200)
    rare[:5], common[:20] = 1e6, 1.0
    assert coefficient_caps(np.stack([rare, common]), steps, reference)[0] == math.inf
    assert stray(steps + 1e9 * rare, reference) <= TETHER_FACTOR
    assert coefficient_caps(np.stack([rare, common]), steps, reference)[1] < math.inf
    # a parent already 2x its seed on every step leaves no room to any term
    assert (coefficient_caps(g, 2 * reference, reference) == 0.0).all()
    # a parent below its seed may add time up to the factor above the seed
    assert coefficient_caps(g[2:], 0.8 * reference, reference)[0] == pytest.approx(70.0, rel=1e-6)


def test_stray_is_symmetric_and_infinite_where_a_step_is_not_finite():
    a, b = np.full(100, 100.0), np.full(100, 200.0)
    assert stray(a, b) == pytest.approx(2.0) and stray(b, a) == pytest.approx(2.0)
    assert stray(np.r_[a[:-1], np.nan], a) == math.inf


def test_a_terms_column_over_the_envelope_is_computed_once_per_envelope_and_is_its_column(monkeypatch):
    """Every screening of a run caps the library's terms over the same envelope: envelope_columns
    computes each term's column there once, and gives exactly what columns_of does, on any envelope."""
    from stepml_evolve.evaluator.discovery import screening
    from stepml_evolve.evaluator.discovery.terms import library, step_values
    from stepml_evolve.evaluator.physics.floor import envelope_for

    env = envelope_for()
    terms = library(step_values([env.components]))[:60]
    computed = []
    plain = screening.columns_of
    monkeypatch.setattr(screening, "columns_of", lambda c, ts: computed.append(len(ts)) or plain(c, ts))
    monkeypatch.setattr(screening, "_ENVELOPE", [])  # as a new process starts
    monkeypatch.setattr(screening, "_ENVELOPE_COLUMNS", {})
    first = screening.envelope_columns(env.components, terms[:40])
    again = screening.envelope_columns(env.components, terms[::-1])  # 20 new ones, in another order
    assert computed == [40, 20]  # none of the first 40 computed twice
    assert np.array_equal(first, plain(env.components, terms[:40]), equal_nan=True)
    assert np.array_equal(again, plain(env.components, terms[::-1]), equal_nan=True)
    other = env.components * 2.0  # another envelope is never served the first one's columns
    assert np.array_equal(screening.envelope_columns(other, terms), plain(other, terms), equal_nan=True)
