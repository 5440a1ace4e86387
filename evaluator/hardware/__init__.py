"""The hardware and the models every program's times come from: the catalog of GPUs and models
(catalog.py, catalog.yaml, hardware.py, model_arch.py) and the analytical per-step components
(components.py). What a program may not trade away of them is evaluator/physics/ (`--physics check`).
"""
