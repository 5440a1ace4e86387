"""Physics a program may not trade away: the physical floor (floor.py: no step faster than the
hardware allows, on an envelope of steps users simulate) and the rules `--physics check` applies to
every new program (rules.py: no subtracted time, one role per constant, causal inputs).
"""
