"""Scoring programs: per-experiment metrics of a replay against the truth (metrics.py), the loss
(objectives.py), the trajectory surrogate that re-times a recorded replay (surrogate.py), and the
pool that runs replays in parallel and turns them into metric rows (pool.py, `ReplayPool`).
"""
