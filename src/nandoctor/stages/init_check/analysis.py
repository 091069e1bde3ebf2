"""What one model's first forward says about its init: measurements from the probe's events
(plain data, no torch): activation growth, per-layer gain, the first non-finite module, weights
off the default scale, the starting loss against ln C."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nandoctor.stages.init_check import Settings

_ELEMENTWISE_SKIP = 2  # parameter-free leaves (activation, dropout) between a layer and its norm


class ModelCheck:
    """The measurements of one `init_forward` event (and the run's first classification loss)."""

    def __init__(self, event: dict, loss: dict | None, settings: Settings) -> None:
        self.settings = settings
        self.root = event["root"]
        self.layers = event["layers"]
        self.nonfinite_params = event.get("nonfinite_params") or []
        self.leaves = [a for a in event["activations"] if a["leaf"]]
        self.order = {a["name"]: i for i, a in reversed(list(enumerate(self.leaves)))}
        self.input = event.get("input")
        # Non-finite model inputs are the data scan's business, not the init's.
        input_finite = self.input is None or self.input["finite"]
        self.loss = loss if input_finite and loss and loss.get("expected") else None
        self.growth, self.growth_at, self.reference = self._growth()
        self.chain, self.chain_names = self._chain()
        self.nonfinite = _first_nonfinite(event["activations"]) if input_finite else None

    def weights(self) -> Iterator[tuple[dict, dict]]:
        """(layer, weight record) for every weight the probe summarized."""
        for layer in self.layers:
            for weight in layer.get("weights", []):
                yield layer, weight

    def flagged(self) -> list[tuple[dict, dict]]:
        """Weights with kappa above `kappa_warn`, in execution order."""
        flagged = [
            (layer, w)
            for layer, w in self.weights()
            if w.get("kappa", 0.0) > self.settings.kappa_warn
        ]
        return sorted(flagged, key=lambda lw: self.order.get(lw[0]["name"], len(self.order)))

    def followed_by_norm(self, name: str) -> bool:
        """The next layer after `name` in execution order (past at most two parameter-free
        leaves such as an activation) is a normalization layer, which undoes its scale."""
        start = self.order.get(name)
        if start is None:
            return False
        for skipped, leaf in enumerate(self.leaves[start + 1 :]):
            if leaf["kind"] is not None or skipped >= _ELEMENTWISE_SKIP:
                return leaf["kind"] == "norm"
        return False

    def loss_level(self) -> str:
        """fine | warning | error for the starting cross-entropy against ln C."""
        if self.loss is None:
            return "fine"
        value, expected = self.loss["value"], self.loss["expected"]
        if not math.isfinite(value):
            # A NaN/Inf starting loss is the anomaly stage's to explain; the weights' scale
            # is judged by kappa and activation growth, not by a loss something else broke.
            return "fine"
        if value > self.settings.loss_factor_error * expected:
            return "error"
        return "warning" if value > expected + self.settings.loss_margin_warn else "fine"

    def _growth(self) -> tuple[float, str | None, float]:
        """Largest activation RMS over the input's, both floored at 1 (only growth above unit
        scale counts, so tiny inputs plus a bias do not read as growth). A norm layer restarts
        the reference; a layer right before a norm is left out. Stops at the first non-finite."""
        outputs = [a for a in self.leaves if a["output"] and a["output"]["finite"]]
        if self.input and self.input["finite"]:
            start = self.input["rms"]
        elif outputs:  # integer inputs (token ids): start from the first layer's output
            start = outputs[0]["output"]["rms"]
        else:
            return 0.0, None, 0.0
        reference, best, best_at = max(start, 1.0), 0.0, None
        for leaf in self.leaves:
            out = leaf["output"]
            if out is None:
                continue
            if not out["finite"]:
                break
            if leaf["kind"] == "norm":
                reference = max(out["rms"], 1.0)
            elif not self.followed_by_norm(leaf["name"]) and out["rms"] / reference > best:
                best, best_at = out["rms"] / reference, leaf["name"]
        return best, best_at, start

    def _chain(self) -> tuple[float, list[str]]:
        """Geometric mean of the growth from one weight layer's input to the next one's, over
        runs of at least `min_chain` Linear/Conv layers with no norm between them."""
        runs, run = [], []
        for leaf in self.leaves:
            if leaf["kind"] == "norm":
                runs.append(run)
                run = []
            elif leaf["kind"] in ("linear", "conv") and leaf["input"] and leaf["input"]["finite"]:
                run.append(leaf)
        runs.append(run)
        best, names = 0.0, []
        for run in runs:
            if len(run) < self.settings.min_chain:
                continue
            scales = [max(leaf["input"]["rms"], 1.0) for leaf in run]
            mean = (scales[-1] / scales[0]) ** (1 / (len(scales) - 1))
            if mean > best:
                best, names = mean, [leaf["name"] for leaf in run]
        return best, names

    def summary(self) -> str:
        counted = sum(1 for _, w in self.weights() if w.get("kappa") is not None)
        text = f"{self.root}: {counted} weights checked, activation growth x{self.growth:.3g}"
        if self.loss:
            text += f", starting loss {self.loss['value']:.4g} (ln C = {self.loss['expected']:.3g})"
        return text

    def details(self) -> dict:
        return {
            "root": self.root,
            "activation_growth": self.growth,
            "per_layer_gain": self.chain or None,
            "first_nonfinite_module": self.nonfinite["name"] if self.nonfinite else None,
            "starting_loss": self.loss["value"] if self.loss else None,
            "expected_loss": self.loss["expected"] if self.loss else None,
            "weights": [
                {"param": w["param"], "kappa": w.get("kappa"), "rms": w.get("rms")}
                for _, w in list(self.weights())[:64]
                if w.get("kappa") is not None
            ],
        }


def _first_nonfinite(activations: list[dict]) -> dict | None:
    """The first module (in completion order, so the innermost) whose output is non-finite
    while its input was finite."""
    for a in activations:
        out, inp = a["output"], a["input"]
        if out is not None and not out["finite"] and (inp is None or inp["finite"]):
            return a
    return None
