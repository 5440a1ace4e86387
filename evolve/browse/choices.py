"""The keys `evolve archive list` sorts by (listing.py sorts by them), kept in a module that imports
nothing so that the command line offers them without loading the archive."""

SORT_KEYS = ("id", "generation", "train", "val", "complexity", "cv")
