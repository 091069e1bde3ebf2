"""Everything that touches torch internals lives in this package and nowhere else."""
