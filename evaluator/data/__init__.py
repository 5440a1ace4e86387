"""Experiments: what one holds (experiments.py), how its directory is read and checked
(experiment_reader.py) and written, atomically (experiment_writer.py), and which requests sent the
same prompt (prompt_reuse.py). Where they come
from (a directory, or the built-in synthetic sample) is ../datasets.py.
"""
