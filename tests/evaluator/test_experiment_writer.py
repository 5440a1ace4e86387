"""The one writer of an experiment directory (evaluator/data/experiment_writer.py): the files as
given, or nothing; a write that fails half-way leaves no partial directory and an existing one as
it was."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.data.experiment_writer import write_experiment
from stepml_evolve.evaluator.known_truth.replay_files import write_generated
from stepml_evolve.evaluator.known_truth.synthetic_sample import generate
from stepml_evolve.evaluator.outputs import OutputError

FILES = {"requests.json": '{"a": 1}', "ground_truth.json": "[]\n", "exp-config.yaml": "model: m\n"}


def _fail_on_second_write(monkeypatch):
    real, written = Path.write_text, []

    def write_text(self, text, *args, **kwargs):
        if written:
            raise OSError(28, "No space left on device", str(self))
        written.append(self)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def test_the_files_are_written_as_given(tmp_path):
    out = write_experiment(tmp_path / "exp", FILES)
    assert out == tmp_path / "exp" and os.listdir(tmp_path) == ["exp"]
    assert {p.name: p.read_text() for p in out.iterdir()} == FILES


def test_a_write_that_fails_half_way_leaves_nothing_and_names_the_file_in_out(tmp_path, monkeypatch):
    _fail_on_second_write(monkeypatch)
    with pytest.raises(OSError) as e:
        write_experiment(tmp_path / "exp", FILES)
    assert e.value.filename == str(tmp_path / "exp" / "ground_truth.json")
    assert os.listdir(tmp_path) == []  # neither the directory nor a temporary one beside it


def test_a_refused_check_or_a_failed_rename_leaves_an_existing_empty_directory_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "exp"
    out.mkdir()

    def refuse(tmp: Path) -> None:
        assert sorted(p.name for p in tmp.iterdir()) == sorted(FILES)  # checked whole, before the rename
        raise ValueError("does not load")

    with pytest.raises(ValueError, match="does not load"):
        write_experiment(out, FILES, check=refuse)
    assert os.listdir(tmp_path) == ["exp"] and os.listdir(out) == []

    def rename(src, dst):
        raise OSError(28, "No space left on device", str(src))

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError):
        write_experiment(out, FILES)
    assert os.listdir(tmp_path) == ["exp"]


def test_an_existing_experiment_is_refused_and_left_intact(tmp_path):
    out = write_experiment(tmp_path / "exp", FILES)
    with pytest.raises(OutputError, match="exists and is not an empty directory"):
        write_experiment(out, {"requests.json": "other"})
    assert {p.name: p.read_text() for p in out.iterdir()} == FILES


def test_a_generated_experiment_that_cannot_be_written_leaves_no_partial_directory(tmp_path, monkeypatch):
    g = generate(0, "small")[0]
    bad = dataclasses.replace(g, profile_data={"unserialisable": object()})  # fails after requests.json is made
    with pytest.raises(TypeError):
        write_generated(tmp_path, bad)
    assert os.listdir(tmp_path) == []
    _fail_on_second_write(monkeypatch)
    with pytest.raises(OSError):
        write_generated(tmp_path, g)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    d = write_generated(tmp_path, g)
    assert d == tmp_path / g.name and load_experiment(d).n_requests == len(g.arrival_us)
