"""nandoctor: find why a PyTorch training run goes NaN/Inf.

From the command line: `nandoctor run train.py`. Inside your own code:

    with nandoctor.guard():            # NonFiniteError at the first NaN/Inf that matters
        train_one_epoch(model, loader)
    nandoctor.watch(model, optimizer)  # cheap checks of loss, gradients, parameters per step

torch is imported only when a guard or a watch starts.
"""

from nandoctor.api import Watch, guard, watch
from nandoctor.errors import NonFiniteError

__all__ = ["NonFiniteError", "Watch", "guard", "watch"]
__version__ = "0.1.0"
