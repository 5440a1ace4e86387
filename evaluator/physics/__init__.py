"""Physics a program may not trade away: the physical floor (floor.py: no step faster than the
hardware allows, on an envelope of steps users simulate, each branch on its own), the signs and
polarities of a program's values (signs.py), thresholds inside the envelope (thresholds.py), and the
rules `--physics check` applies to every new program (rules.py: no time taken away, no component
counted twice, one role per constant, causal inputs).
"""
