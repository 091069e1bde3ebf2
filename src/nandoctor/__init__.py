"""nandoctor: find why a PyTorch training run goes NaN/Inf."""

__version__ = "0.1.0"
