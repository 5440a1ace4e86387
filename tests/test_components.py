"""Analytical components against hand calculations, and scalar == vectorized."""
from __future__ import annotations

import numpy as np
import pytest

from evaluator.components import COMPONENT_INDEX, coefficients, component_values, from_trajectory
from evaluator.hardware import get_hardware
from evaluator.model_arch import ModelArch

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
    v = component_values(float(tok_pf), float(len(prefill)), pairs, float(pf_ctx), float(len(decodes)),
                         float(sum(decodes)), float(ctx_max), coefficients(arch, H100, tp))
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
        scalar = component_values(float(n[p].sum()), float(p.sum()), float((n[p] * (c[p] + n[p] / 2)).sum()),
                                  float(c[p].sum()), float(d.sum()), float(c[d].sum()), float(c[m].max()), k)
        np.testing.assert_allclose(vec[:, s], np.array(scalar, dtype=float), rtol=1e-12)


def test_model_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelArch.from_model_config({"num_layers": 2, "hidden_dim": 64, "num_heads": 8, "num_kv_heads": 3, "intermediate_dim": 128})
    with pytest.raises(ValueError, match="hidden_dim"):
        ModelArch.from_model_config({"num_layers": 2, "hidden_dim": -1, "num_heads": 8, "num_kv_heads": 8, "intermediate_dim": 128})


def test_hardware_table_has_units_and_rejects_unknown():
    a100 = get_hardware("a100-80gb")
    assert a100.peak_flops == 312e12 and a100.hbm_bytes_per_s == 2.039e12 and a100.link_bytes_per_s == 600e9
    assert get_hardware("h100").memory_bytes == 80e9
    with pytest.raises(KeyError, match="unknown hardware"):
        get_hardware("B300")
