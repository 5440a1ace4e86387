"""Linear-time importers (issue 55): `evolve data import --from blis-trace` answers a CSV whose
header row has 100,000 columns (700 KB) with one line at the header row, as it answers any other
bad header, instead of comparing every column with every other (which had not answered after
400 s). A header wider than a BLIS trace can be is refused by its width; the duplicate check over
a header of legal width counts each name once."""

from __future__ import annotations

import pytest
import yaml
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.importers.blis_trace import MAX_COLUMNS, OPTIONAL_COLUMNS
from stepml_evolve.evaluator.importers.blis_trace_export import TRACE_COLUMNS
from stepml_evolve.evaluator.importers.common import hf_to_model_config
from stepml_evolve.evolve.cli.app import app

HEADER = {"trace_version": 2, "time_unit": "microseconds", "mode": "real"}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _trace(tmp_path, columns: list[str]):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(HEADER))
    (tmp_path / "t.csv").write_text(",".join(columns) + "\n" + ",".join("0" for _ in columns) + "\n")
    return tmp_path / "t.yaml"


def test_a_header_of_100k_columns_is_one_line_at_the_header_row(tmp_path):
    columns = [*TRACE_COLUMNS, *(f"extra_{i}" for i in range(100_000 - len(TRACE_COLUMNS)))]
    res = invoke("data", "import", "--from", "blis-trace", _trace(tmp_path, columns), "--out", tmp_path / "exp")
    only_error_line(res, str(tmp_path / "t.csv"), "header row has 100,000 columns", f"at most {MAX_COLUMNS}")
    assert not (tmp_path / "exp").exists()


def test_a_header_of_100k_copies_of_one_name_is_refused_by_its_width_too(tmp_path):
    res = invoke(
        "data", "import", "--from", "blis-trace", _trace(tmp_path, ["status"] * 100_000), "--out", tmp_path / "e"
    )
    only_error_line(res, "header row has 100,000 columns")


def test_a_duplicate_column_in_a_header_of_legal_width_is_still_named(tmp_path):
    columns = [*TRACE_COLUMNS, *OPTIONAL_COLUMNS[:-1], "status"]
    assert len(columns) == MAX_COLUMNS
    res = invoke("data", "import", "--from", "blis-trace", _trace(tmp_path, columns), "--out", tmp_path / "exp")
    only_error_line(res, "header row names the column 'status' twice")


def test_a_huge_integer_in_a_trace_header_or_a_model_config_is_one_line_naming_the_file(tmp_path):
    # the trace header's YAML and the Hugging Face config.json go through the one reader rule
    header = _trace(tmp_path, list(TRACE_COLUMNS))
    header.write_text(yaml.safe_dump(HEADER).replace("trace_version: 2", "trace_version: " + "9" * 5000))
    res = invoke("data", "import", "--from", "blis-trace", header, "--out", tmp_path / "exp")
    only_error_line(res, str(header), "more than 4300 digits")
    assert not (tmp_path / "exp").exists()
    config = tmp_path / "config.json"
    config.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    with pytest.raises(UserError) as e:
        hf_to_model_config(config)
    assert str(config) in str(e.value) and "more than 4300 digits" in str(e.value) and "\n" not in str(e.value)
