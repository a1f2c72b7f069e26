"""A researcher's own package, outside rlstruct: tutorial 12's third part trains its ``myalgo`` module."""
