"""Fitting a program's constants: the fit (fitting.py, with the surrogate's linear solve in
linear_solve.py), what the data decided (identifiability.py), cross-validation (crossval.py) and
the `# fitted:` header of a program file (fitted_header.py).
"""
