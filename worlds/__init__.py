"""Known-truth worlds: hidden step-time laws for `evolve data synth --world` and `evolve bench --worlds`.

Each file is one world's law in the program DSL (the format of seeds/), with the physics it
stands for in its docstring. They are data, never read by the search: a search sees only seeds/
and prompts/, so what it finds in a world's experiments it found in the data.
"""
