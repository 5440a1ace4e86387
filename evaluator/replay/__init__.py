"""The closed-loop replay: a vLLM-v1-like scheduler run with a program as its step-time model
(closed_loop.py; the numba loop in scheduler.py, with state.py, kv_cache.py and
decode_stretch.py), and where replays run (executor.py: threads, or Ray in ray_executor.py).
"""
