"""The physics every program builds on: the catalog of GPUs and models (catalog.py, catalog.yaml,
hardware.py, model_arch.py) and the analytical per-step components (components.py).
"""
