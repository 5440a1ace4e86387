"""Analytical components against hand calculations, scalar == vectorized; the catalog; the coefficient
function and the contract that lets evolve/go/components.py translate the physics to Go."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from stepml_evolve.evaluator.hardware import components
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.catalog import load as load_catalog
from stepml_evolve.evaluator.hardware.components import (
    COMPONENT_INDEX,
    K_ALLREDUCE_US_PER_TOKEN,
    K_ATTN_US_PER_PAIR,
    K_DENSE_WEIGHT_US,
    K_EXPERT_WEIGHT_US,
    K_GEMM_US_PER_TOKEN,
    K_KV_US_PER_TOKEN,
    K_LAYERS,
    K_NUM_EXPERTS,
    K_TOPK_FRACTION,
    K_TP,
    coefficient_values,
    coefficients,
    component_values,
    from_trajectory,
)
from stepml_evolve.evaluator.hardware.hardware import get_hardware
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.known_truth.synthetic_sample import MODELS
from stepml_evolve.evolve.go.components import coefficient_function_go, component_formulas_go, hardware_presets
from stepml_evolve.evolve.go.source import EmitError

H100 = get_hardware("H100")
LLAMA7 = ModelArch(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)
LLAMA70 = ModelArch(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000)
MIXTRAL = ModelArch(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, num_experts=8, top_k=2)

# A small known batch: one prefill chunk of 512 tokens on 96 cached tokens, decodes at contexts 100, 200, 300.
PREFILL = [(512, 96)]
DECODES = [100, 200, 300]


def _components(arch, tp, prefill=PREFILL, decodes=DECODES):
    tok_pf = sum(n for n, _ in prefill)
    pairs = sum(n * (c + n / 2) for n, c in prefill)
    pf_ctx = sum(c for _, c in prefill)
    ctx_max = max([c for _, c in prefill] + decodes)
    v = component_values(
        float(tok_pf),
        float(len(prefill)),
        pairs,
        float(pf_ctx),
        float(len(decodes)),
        float(sum(decodes)),
        float(ctx_max),
        coefficients(arch, H100, tp),
    )
    return {name: float(v[i]) for name, i in COMPONENT_INDEX.items()}


def test_llama2_7b_tp1_matches_hand_calculation():
    f = _components(LLAMA7, 1)
    # per token per layer: projections 2*(4096*(4096+2*4096) + 4096^2) = 134,217,728 FLOPs,
    # MLP 2*3*4096*11008 = 270,532,608 FLOPs; 32 layers -> 12,952,010,752 FLOPs per token
    flops_per_token = 32 * (134_217_728 + 270_532_608)
    assert f["gemm_pf"] == pytest.approx(512 * flops_per_token / 989.5e12 * 1e6)
    assert f["gemm_pf"] == pytest.approx(6701.8, abs=0.1)  # 6.70 ms for a 512-token chunk at peak
    assert f["gemm_dc"] == pytest.approx(3 * flops_per_token / 989.5e12 * 1e6)
    # attention: 4*H*dh = 4*4096 per (query, key) pair per layer
    assert f["attn_pf"] == pytest.approx(4 * 4096 * 32 * 512 * (96 + 256) / 989.5e12 * 1e6)
    assert f["attn_dc"] == pytest.approx(4 * 4096 * 32 * (101 + 201 + 301) / 989.5e12 * 1e6)
    # weights: 32 layers * (4*4096^2 + 3*4096*11008) + lm head 32000*4096 params, 2 bytes each
    weight_bytes = 2 * (32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096)
    assert f["weights"] == pytest.approx(weight_bytes / 3.35e12 * 1e6)
    assert f["weights"] == pytest.approx(3944.5, abs=0.1)  # 13.21 GB (6.61e9 params) at 3.35 TB/s
    kv_bytes_per_token = 2 * 32 * 4096 * 2  # K and V, 32 layers, 4096 wide, 2 bytes
    assert f["kv_read"] == pytest.approx(kv_bytes_per_token * (96 + 600) / 3.35e12 * 1e6)
    assert f["kv_write"] == pytest.approx(kv_bytes_per_token * 515 / 3.35e12 * 1e6)
    assert f["allreduce"] == 0.0 and f["experts"] == 0.0
    assert (f["n_req"], f["n_pf"], f["n_dc"], f["tok_pf"], f["tokens"]) == (4, 1, 3, 512, 515)
    assert (f["ctx_sum"], f["ctx_max"], f["layers"], f["tp"]) == (696, 300, 32, 1)


def test_llama2_70b_tp4_gqa_divides_by_tp_and_adds_allreduce():
    f = _components(LLAMA70, 4)
    d, dkv = 8192, 8 * 128  # GQA: 8 KV heads of 128
    proj = 2 * (d * (d + 2 * dkv) + d * d)
    mlp = 2 * 3 * d * 28672
    assert f["gemm_pf"] == pytest.approx(512 * 80 * (proj + mlp) / 4 / 989.5e12 * 1e6)
    assert f["attn_pf"] == pytest.approx(4 * 64 * 128 * 80 * 512 * (96 + 256) / 4 / 989.5e12 * 1e6)
    kv_bytes_per_token = 2 * 80 * dkv * 2
    assert f["kv_read"] == pytest.approx(kv_bytes_per_token * 696 / 4 / 3.35e12 * 1e6)
    # all-reduce: 2 per layer, each 2*(tp-1)/tp * tokens * d * 2 bytes, over 900 GB/s
    assert f["allreduce"] == pytest.approx(2 * 80 * (2 * 3 / 4) * 515 * d * 2 / 900e9 * 1e6)
    weight_bytes = 2 * (80 * (d * (d + 2 * dkv) + d * d + 3 * d * 28672) + 32000 * d)
    assert f["weights"] == pytest.approx(weight_bytes / 4 / 3.35e12 * 1e6)
    assert f["weights"] == pytest.approx(10300, rel=0.01)  # ~138 GB over 4 GPUs


def test_mixtral_tp2_moe_touches_expected_experts():
    f = _components(MIXTRAL, 2)
    d, dkv, dff = 4096, 8 * 128, 14336
    touched = 8 * (1 - (1 - 2 / 8) ** 515)
    assert f["experts"] == pytest.approx(touched)
    assert f["experts"] == pytest.approx(8.0, abs=1e-6)  # 515 tokens touch all experts
    per_token = 32 * (2 * (d * (d + 2 * dkv) + d * d) + 2 * 2 * 3 * d * dff + 2 * d * 8)
    assert f["gemm_pf"] == pytest.approx(512 * per_token / 2 / 989.5e12 * 1e6)
    dense = 32 * (d * (d + 2 * dkv) + d * d + d * 8) + 32000 * d
    assert f["weights"] == pytest.approx(2 * (dense + 32 * touched * 3 * d * dff) / 2 / 3.35e12 * 1e6)
    # a single decode token touches top-k = 2 experts per layer
    one = _components(MIXTRAL, 2, prefill=[(0, 0)], decodes=[50])
    assert one["experts"] == pytest.approx(2.0)
    assert one["weights"] == pytest.approx(2 * (dense + 32 * 2 * 3 * d * dff) / 2 / 3.35e12 * 1e6)
    assert one["weights"] < f["weights"]


@pytest.mark.parametrize("arch,tp", [(LLAMA7, 1), (LLAMA70, 4), (MIXTRAL, 2)])
def test_vectorized_over_a_trajectory_equals_per_step_scalar(arch, tp):
    rng = np.random.default_rng(3)
    k = coefficients(arch, H100, tp)
    steps, slots = 50, []
    for s in range(steps):
        for _ in range(rng.integers(1, 12)):
            pf = rng.random() < 0.3
            slots.append((s, int(rng.integers(1, 700)) if pf else 1, int(rng.integers(0, 3000)), pf))
    step, n, c, pf = (np.array(x) for x in zip(*slots))
    vec = from_trajectory(step, n, c, pf, steps, k)
    for s in range(steps):
        m = step == s
        p, d = m & pf, m & ~pf
        scalar = component_values(
            float(n[p].sum()),
            float(p.sum()),
            float((n[p] * (c[p] + n[p] / 2)).sum()),
            float(c[p].sum()),
            float(d.sum()),
            float(c[d].sum()),
            float(c[m].max()),
            k,
        )
        np.testing.assert_allclose(vec[:, s], np.array(scalar, dtype=float), rtol=1e-12)


def test_model_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelArch.from_model_config(
            {"num_layers": 2, "hidden_dim": 64, "num_heads": 8, "num_kv_heads": 3, "intermediate_dim": 128}
        )
    with pytest.raises(ValueError, match="hidden_dim"):
        ModelArch.from_model_config(
            {"num_layers": 2, "hidden_dim": -1, "num_heads": 8, "num_kv_heads": 8, "intermediate_dim": 128}
        )


def test_hardware_table_has_units_and_rejects_unknown():
    a100 = get_hardware("a100-80gb")
    assert a100.peak_flops == 312e12 and a100.hbm_bytes_per_s == 2.039e12 and a100.link_bytes_per_s == 600e9
    assert get_hardware("h100").memory_bytes == 80e9
    with pytest.raises(KeyError, match="unknown hardware"):
        get_hardware("B300")


# ---- the catalog ------------------------------------------------------------------------------


def test_catalog_hardware_equals_the_datasheet_figures_and_keeps_the_aliases():
    expected = {
        "H100": (989.5e12, 3.35e12, 900e9, 80e9),
        "A100-80GB": (312e12, 2.039e12, 600e9, 80e9),
        "L40S": (362.05e12, 864e9, 64e9, 48e9),
    }
    hw = catalog().hardware
    assert {n: (h.peak_flops, h.hbm_bytes_per_s, h.link_bytes_per_s, h.memory_bytes) for n, h in hw.items()} == expected
    for alias in ("h100", "H100-SXM", "h100_sxm", "h100-sxm5", "h100-80gb"):
        assert get_hardware(alias) is hw["H100"]
    for alias in ("a100", "A100-80GB", "a100_80gb", "a100-sxm4-80gb"):
        assert get_hardware(alias) is hw["A100-80GB"]
    assert get_hardware("l40s") is hw["L40S"]
    assert {h.go_name for h in hw.values()} == {"H100", "A100", "L40S"}


def test_catalog_models_are_the_replay_model_configs():
    models = catalog().models
    assert list(models) == [
        "meta-llama/Llama-2-7b-hf",
        "meta-llama/Llama-2-70b-hf",
        "mistralai/Mixtral-8x7B-v0.1",
        "codellama/CodeLlama-34b-Instruct-hf",
        "meta-llama/Llama-3.1-8B",
        "Qwen/Qwen2.5-14B",
        "allenai/OLMoE-1B-7B-0924",
    ]
    mixtral = models["mistralai/Mixtral-8x7B-v0.1"].model_config
    assert list(mixtral.items()) == [
        ("num_layers", 32),
        ("hidden_dim", 4096),
        ("num_heads", 32),
        ("num_kv_heads", 8),
        ("intermediate_dim", 14336),
        ("num_local_experts", 8),
        ("num_experts_per_tok", 2),
        ("vocab_size", 32000),
    ]
    assert models["meta-llama/Llama-2-70b-hf"].arch == LLAMA70 and models["mistralai/Mixtral-8x7B-v0.1"].arch == MIXTRAL
    assert MODELS["codellama/CodeLlama-34b-Instruct-hf"]["intermediate_dim"] == 22016


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda t: t.replace('unit: B/s, source: "H100 SXM5 datasheet: HBM3', 'unit: TB/s, source: "x'),
            "unit must be B/s",
        ),
        (lambda t: t.replace("value: 989.5e+12", "value: 989.5e12"), "not a positive number"),
        (lambda t: t.replace("go_name: A100", "go_name: H100"), "share the go_name H100"),
        (
            lambda t: t.replace("num_kv_heads: 8, intermediate_dim: 28672", "num_kv_heads: 7, intermediate_dim: 28672"),
            "Llama-2-70b-hf: model_config.num_heads is not a multiple of num_kv_heads",
        ),
    ],
)
def test_catalog_loader_rejects_bad_entries(tmp_path, edit, message):
    text = (resources.files("stepml_evolve.evaluator.hardware") / "catalog.yaml").read_text()
    bad = edit(text)
    assert bad != text
    (tmp_path / "c.yaml").write_text(bad)
    with pytest.raises(ValueError, match=message):
        load_catalog(tmp_path / "c.yaml")


# ---- the coefficient function, and its translation to Go ---------------------------------------


def test_coefficients_of_llama2_70b_tp4_by_hand():
    k = coefficients(LLAMA70, H100, 4)
    # per token: 80 layers * (2 * 150,994,944 attention params + 2*3*8192*28672 MLP FLOPs)
    assert k[K_GEMM_US_PER_TOKEN] == pytest.approx(136_902_082_560 / 4 / 989.5e12 * 1e6, rel=1e-15)
    assert k[K_GEMM_US_PER_TOKEN] == pytest.approx(34.5887, abs=1e-4)
    assert k[K_ATTN_US_PER_PAIR] == pytest.approx(4 * 64 * 128 * 80 / 4 / 989.5e12 * 1e6, rel=1e-15)
    # 80 * (150,994,944 + 3*8192*28672) + 32000*8192 params, 2 bytes each
    assert k[K_DENSE_WEIGHT_US] == pytest.approx(137_426_370_560 / 4 / 3.35e12 * 1e6, rel=1e-15)
    assert (k[K_EXPERT_WEIGHT_US], k[K_NUM_EXPERTS], k[K_TOPK_FRACTION]) == (0.0, 0.0, 0.0)
    assert k[K_KV_US_PER_TOKEN] == pytest.approx(2 * 80 * 1024 * 2 / 4 / 3.35e12 * 1e6, rel=1e-15)
    assert k[K_ALLREDUCE_US_PER_TOKEN] == pytest.approx(2 * 80 * 1.5 * 8192 * 2 / 900e9 * 1e6, rel=1e-15)
    assert (k[K_LAYERS], k[K_TP]) == (80.0, 4.0)


def test_coefficients_of_mixtral_tp2_by_hand():
    k = coefficients(MIXTRAL, H100, 2)
    # per token: 32 * (2 * 41,943,040 attention params + 2*3*4096*14336 * top-2 + 2*4096*8 router)
    assert k[K_GEMM_US_PER_TOKEN] == pytest.approx(25_235_030_016 / 2 / 989.5e12 * 1e6, rel=1e-15)
    # read every step: 32 * (41,943,040 + 4096*8 router) + 32000*4096 lm_head, 2 bytes each
    assert k[K_DENSE_WEIGHT_US] == pytest.approx(2_948_595_712 / 2 / 3.35e12 * 1e6, rel=1e-15)
    assert k[K_EXPERT_WEIGHT_US] == pytest.approx(32 * 3 * 4096 * 14336 * 2 / 2 / 3.35e12 * 1e6, rel=1e-15)
    assert (k[K_NUM_EXPERTS], k[K_TOPK_FRACTION]) == (8.0, 0.25)
    assert k[K_ALLREDUCE_US_PER_TOKEN] == pytest.approx(2 * 32 * 1.0 * 4096 * 2 / 900e9 * 1e6, rel=1e-15)


@pytest.mark.parametrize("model", list(catalog().models))
def test_coefficients_on_float64_arguments_equal_the_exact_integer_ones(model):
    """Go computes in float64 what Python computes with exact ints: equal bit for bit (the 2**53 rule)."""
    arch = catalog().models[model].arch
    for hw in catalog().hardware.values():
        for tp in (1, 2, 4, 8):
            args = (
                arch.layers,
                arch.hidden,
                arch.heads,
                arch.head_dim,
                arch.kv_heads,
                arch.ffn,
                arch.vocab,
                arch.num_experts,
                arch.top_k,
                hw.peak_flops,
                hw.hbm_bytes_per_s,
                hw.link_bytes_per_s,
                tp,
            )
            exact = np.array(coefficient_values(*args))
            assert np.array_equal(exact, coefficients(arch, hw, tp))
            assert np.array_equal(
                exact.view(np.uint64), np.array(coefficient_values(*map(float, args))).view(np.uint64)
            )


def test_the_go_translator_accepts_both_physics_functions():
    formulas = component_formulas_go("XComponents")
    assert formulas[-1].startswith("return XComponents{GemmPf: gemmPf, GemmDc: gemmDc,")
    assert "experts := float64(m.k[4] * (1.0 - math.Pow(1.0 - m.k[5], tokens)))" in formulas
    params, code = coefficient_function_go("xSelect")
    assert [p for p, _ in params][:4] == ["layers", "hidden", "heads", "headDim"]
    assert ("headDim", "float64(arch.HiddenDim / arch.NumHeads)") in params
    assert "topkFraction := xSelect(numExperts > 0.0, topK / numExperts, 0.0)" in code
    assert code[-2:] == ["\ttp,                  // K_TP", "}"]
    presets = {p["go_name"]: p["fields"] for p in hardware_presets()}
    assert presets == {
        "H100": "PeakFlops: 989.5e12, HBMBytesPerS: 3.35e12, LinkBytesPerS: 900e9",
        "A100": "PeakFlops: 312e12, HBMBytesPerS: 2.039e12, LinkBytesPerS: 600e9",
        "L40S": "PeakFlops: 362.05e12, HBMBytesPerS: 864e9, LinkBytesPerS: 64e9",
    }


def _with_numpy_call(
    layers,
    hidden,
    heads,
    head_dim,
    kv_heads,
    ffn,
    vocab,
    num_experts,
    top_k,
    peak_flops,
    hbm_bytes_per_s,
    link_bytes_per_s,
    tp,
):
    us = np.float64(1e6)
    return (us, us, us, us, num_experts, us, us, us, layers, tp)


def _in_wrong_order(
    layers,
    hidden,
    heads,
    head_dim,
    kv_heads,
    ffn,
    vocab,
    num_experts,
    top_k,
    peak_flops,
    hbm_bytes_per_s,
    link_bytes_per_s,
    tp,
):
    return (layers, hidden, heads, head_dim, kv_heads, ffn, vocab, num_experts, top_k, tp)


def _conditional_on_arrays(tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max, k):
    tokens = tok_pf if n_dc > 0 else n_dc
    return (tokens,)


@pytest.mark.parametrize(
    "attr,fn,message",
    [
        ("coefficient_values", _with_numpy_call, r"line \d+\): cannot translate `np.float64\(1000000.0\)`"),
        ("coefficient_values", _in_wrong_order, r"a return other than \(gemm_us_per_token, attn_us_per_pair,"),
        ("component_values", _conditional_on_arrays, r"cannot translate `tok_pf if n_dc > 0 else n_dc`"),
    ],
)
def test_the_go_translator_names_what_breaks_the_contract(monkeypatch, attr, fn, message):
    monkeypatch.setattr(components, attr, fn)
    with pytest.raises(EmitError, match=message):
        coefficient_function_go("xSelect") if attr == "coefficient_values" else component_formulas_go("X")
