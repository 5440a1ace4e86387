"""`evolve emit-go --blis`: a fitted program installed into the real BLIS (the offline snapshot in
../shared/blis, built once per session by the `blis_build` fixture and copied per test), built,
vetted and tested there, then run by BLIS's own binary. BLIS's `go test -short ./sim/...` (every
package, BLIS's golden datasets skipped) runs once, in the first test; the others test ./sim/ and ./sim/latency/."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from typer.testing import CliRunner

from stepml_evolve.evolve.blis.install import DEFAULT_CASE, interface_methods
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

NARROW = ["--go-test", "./sim/ ./sim/latency/"]

TRACE_YAML = "trace_version: 2\ntime_unit: microseconds\nmode: real\nwarm_up_requests: 0\n"
TRACE_CSV = (
    "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,streaming,input_tokens,"
    "output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,reason_ratio,model,deadline_us,server_input_tokens,"
    "arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason\n"
    "0,,,,,0,sp0,100,true,491,247,0,0,0,0,0,,300000000,0,0,0,0,0,0,ok,,\n"
    "1,,,,,0,sp0,100,true,489,247,0,0,0,0,0,,300053490,0,53490,53490,0,0,0,ok,,\n"
    "2,,,,,0,sp1,100,true,500,247,0,0,0,0,0,,300064932,0,64932,64932,0,0,0,ok,,\n"
)
LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "torch_dtype": "float16",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """trained_physics fitted by CMA-ES on the synthetic sample (a small budget: real fitted constants)."""
    out = tmp_path_factory.mktemp("fitted") / "fitted.py"
    res = CliRunner().invoke(app, ["fit", str(seed_path("trained_physics")), "--max-evals", "16", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def install(program, blis, *args):
    return CliRunner().invoke(app, ["emit-go", str(program), "--blis", str(blis), *map(str, args)])


def tree(root) -> dict[str, tuple[str, int]]:
    """Every file's content hash and (but for the rebuilt binary) its mtime."""
    return {
        str(p.relative_to(root)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            0 if p.name == "blis" else p.stat().st_mtime_ns,
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def one_error_line(res, *needles):
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.output


def replay(blis, tmp_path, config: dict, *flags) -> tuple[subprocess.CompletedProcess, list]:
    (tmp_path / "t.yaml").write_text(TRACE_YAML)
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    folder = tmp_path / config["model_type"]
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    results = tmp_path / f"{config['model_type']}.results.json"
    proc = subprocess.run(
        [
            str(blis / "blis"),
            "replay",
            "--trace-header",
            str(tmp_path / "t.yaml"),
            "--trace-data",
            str(tmp_path / "t.csv"),
            "--model",
            config["model_type"],
            "--latency-model",
            "stepml-evolved",
            "--model-config-folder",
            str(folder),
            "--defaults-filepath",
            str(blis / "defaults.yaml"),
            "--hardware-config",
            str(blis / "hardware_config.json"),
            "--horizon",
            "100000000000",
            "--results-path",
            str(results),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads(results.read_text())


def test_installed_model_builds_vets_and_passes_blis_own_tests(blis_checkout, fitted):
    """The one run of every BLIS package's tests, in BLIS's own short mode (`go test -short
    ./sim/...`: it skips only BLIS's golden-dataset and end-to-end routing runs, 4 of the 4.5 min)."""
    res = install(fitted, blis_checkout, "--go-test", "-short ./sim/...")
    assert res.exit_code == 0, res.output + res.stderr
    for line in (
        "go build ./...: ok",
        "go build -o blis .: ok",
        "go vet ./sim/latency/: ok",
        "go test -short ./sim/...: ok",
    ):
        assert line in res.stdout, res.stdout
    latency = blis_checkout / "sim" / "latency"
    assert (latency / "stepml_evolved.go").read_text().startswith("// Code generated by stepml-evolve emit-go.")
    assert "func TestStepMLEvolvedFromConfigMatchesPresets" in (latency / "stepml_evolved_test.go").read_text()
    assert "// fitted: data=" in (latency / "stepml_evolved.go").read_text()


def test_second_install_changes_nothing_and_blis_replays_with_the_model(blis_checkout, fitted, tmp_path):
    res = install(fitted, blis_checkout, *NARROW)
    assert res.exit_code == 0, res.output + res.stderr
    assert "go test ./sim/ ./sim/latency/: ok" in res.stdout and "written" in res.stdout
    before = tree(blis_checkout)
    res = install(fitted, blis_checkout, *NARROW)
    assert res.exit_code == 0, res.output + res.stderr
    assert "unchanged" in res.stdout and "already installed: 4 edit(s)" in res.stdout
    assert tree(blis_checkout) == before

    # BLIS's binary runs the model: a dense model on H100 (the README's command) ...
    _, dense = replay(
        blis_checkout,
        tmp_path,
        LLAMA_7B,
        "--hardware",
        "H100",
        "--tp",
        "1",
        "--total-kv-blocks",
        "1000",
        "--log",
        "error",
    )
    assert sorted(r["request_id"] for r in dense) == [0, 1, 2]
    assert all(0 < r["ttft_us"] < r["e2e_us"] for r in dense)
    # ... and Mixtral (MoE fields from config.json) on BLIS's A100-80 at TP 2, KV blocks auto-calculated
    proc, moe = replay(blis_checkout, tmp_path, MIXTRAL, "--hardware", "A100-80", "--tp", "2", "--log", "info")
    assert sorted(r["request_id"] for r in moe) == [0, 1, 2]
    assert "auto-calculated total-kv-blocks" in proc.stderr
    assert min(r["e2e_us"] for r in moe) > max(r["e2e_us"] for r in dense)  # 8x7B on A100s is slower than 7B on H100


def test_reemitting_and_a_second_backend_never_duplicate_registrations(blis_checkout, fitted):
    assert install(fitted, blis_checkout, "--go-test", "./sim/latency/").exit_code == 0
    model = blis_checkout / "sim" / "latency" / "stepml_evolved.go"
    first = model.read_text()
    res = install(seed_path("roofline"), blis_checkout, "--name", "Other", "--go-test", "./sim/latency/")
    assert res.exit_code == 0, res.output + res.stderr
    assert "now calls NewOtherFromConfig" in res.stdout
    assert model.read_text() != first and "func NewOtherModel(" in model.read_text()
    res = install(
        fitted, blis_checkout, "--backend", "stepml-fitted", "--name", "Fitted", "--go-test", "./sim/latency/"
    )
    assert res.exit_code == 0, res.output + res.stderr
    latency = (blis_checkout / "sim" / "latency" / "latency.go").read_text()
    assert latency.count('case "stepml-evolved":') == 1 and latency.count('case "stepml-fitted":') == 1
    assert "return NewOtherFromConfig(hw)" in latency and "return NewFittedFromConfig(hw)" in latency
    bundle = (blis_checkout / "sim" / "bundle.go").read_text()
    assert bundle.count('"stepml-evolved": true') == 1 and bundle.count('"stepml-fitted": true') == 1
    test = (blis_checkout / "sim" / "bundle_test.go").read_text()
    assert (
        'exactly 4 backends\n\texpected := []string{"roofline", "stepml-evolved", "stepml-fitted", "trained-physics"}'
        in test
    )
    root = (blis_checkout / "cmd" / "root.go").read_text()
    assert root.count('stepMLEvolvedBackends := map[string]bool{"stepml-evolved": true, "stepml-fitted": true}') == 1
    assert root.count("if stepMLEvolvedBackends[backend] {") == 1

    # a name another file defines, a backend of BLIS's own: refused, nothing written
    before = tree(blis_checkout)
    one_error_line(
        install(fitted, blis_checkout, "--backend", "stepml-third", "--name", "Fitted"), "stepml_fitted.go", "--name"
    )
    one_error_line(install(fitted, blis_checkout, "--backend", "roofline"), "sim/bundle.go", "BLIS's latency backends")
    assert tree(blis_checkout) == before

    # a failing Go check: its line, the end of its output, one error line, exit 2
    (blis_checkout / "sim" / "latency" / "zz_fails_test.go").write_text(
        'package latency\n\nimport "testing"\n\nfunc TestZZFails(t *testing.T) { t.Fatal("deliberately") }\n'
    )
    res = install(fitted, blis_checkout, "--go-test", "./sim/latency/")
    assert res.exit_code == 2 and "go test ./sim/latency/: FAILED (exit 1" in res.stdout
    assert "deliberately" in res.stderr and res.stderr.rstrip().splitlines()[-1].startswith(
        "error: go test ./sim/latency/ failed"
    )


@pytest.mark.parametrize(
    "path, old, new",
    [
        ("sim/latency/latency.go", "unknown backend %q; valid options", "no such backend %q; valid options"),
        ("sim/bundle.go", "validLatencyBackends          = map", "validBackends = map"),
        ("sim/bundle_test.go", "exactly 2 backends", "exactly two backends"),
        ("cmd/root.go", "// Analytical backends: parse HF config", "// Analytical: parse HF config"),
        ("sim/latency/latency.go", DEFAULT_CASE, DEFAULT_CASE + ' hw.Backend, "")\n' + DEFAULT_CASE),  # twice
    ],
)
def test_an_anchor_missing_or_twice_leaves_the_checkout_untouched(blis_checkout, fitted, path, old, new):
    f = blis_checkout / path
    text = f.read_text()
    assert text.count(old) == 1
    f.write_text(text.replace(old, new))
    before = tree(blis_checkout)
    res = install(fitted, blis_checkout, "--go-test", "./sim/latency/")
    one_error_line(res, f"{blis_checkout / path}: anchor", "nothing was written")
    assert ("found 2 times" if new.count("default:") == 2 else "not found") in res.stderr
    assert tree(blis_checkout) == before


def test_a_five_method_blis_is_refused_naming_its_target(blis_checkout, fitted):
    f = blis_checkout / "sim" / "latency_model.go"
    f.write_text(
        f.read_text().replace(
            "\tPostDecodeFixedOverhead() int64\n",
            "\tSchedulingProcessingTime() int64\n\tPreemptionProcessingTime() int64\n",
        )
    )
    assert interface_methods(f.read_text())[-2:] == ("SchedulingProcessingTime", "PreemptionProcessingTime")
    before = tree(blis_checkout)
    one_error_line(
        install(fitted, blis_checkout),
        f"{f}: LatencyModel has the interface of target blis-2026-03",
        "--target blis-2026-03",
    )
    one_error_line(install(fitted, blis_checkout, "--target", "blis-2026-03"), "sim/request.go", "[]TokenID")
    f.write_text(f.read_text().replace("\tPreemptionProcessingTime() int64\n", ""))
    one_error_line(install(fitted, blis_checkout), f"{f}: LatencyModel's methods", "match no target")
    assert {k: v for k, v in tree(blis_checkout).items() if k != "sim/latency_model.go"} == {
        k: v for k, v in before.items() if k != "sim/latency_model.go"
    }


def test_a_directory_that_is_not_a_blis_checkout_is_refused(tmp_path, fitted):
    one_error_line(install(fitted, tmp_path / "missing"), "no such directory")
    (tmp_path / "go.mod").write_text("module example.com/other\n\ngo 1.22\n")
    one_error_line(install(fitted, tmp_path), f"{tmp_path}: not a BLIS checkout", "go.mod")
    (tmp_path / "go.mod").write_text("module github.com/inference-sim/inference-sim\n\ngo 1.24\n")
    one_error_line(install(fitted, tmp_path), "no sim/latency_model.go")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go.mod"]
    one_error_line(install(fitted, tmp_path, "--out", tmp_path / "x.go"), "--out and --test-out do not go with --blis")
