"""What each root-cause category means, why it produces NaN/Inf, and the usual fixes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CategoryGuide:
    name: str
    summary: str
    why: str
    signs: tuple[str, ...]
    fixes: tuple[str, ...]


GUIDES: dict[str, CategoryGuide] = {
    guide.name: guide
    for guide in (
        CategoryGuide(
            "data",
            "The batches themselves carry NaN/Inf, absurd magnitudes or labels out of range.",
            "A single NaN in an input row propagates through every layer that touches it: the "
            "loss of the whole batch becomes NaN and so does every gradient. Values near the "
            "dtype's limit overflow in the first matmul.",
            (
                "the first non-finite value is already in a batch, or is born in the data pipeline",
                "missing values from CSV/numpy, 0/0 in a per-sample normalization, sentinel values",
            ),
            (
                "drop or impute non-finite samples (`torch.isfinite(x).all(dim=1)` as a filter)",
                "guard the normalization in the data pipeline (`x / x.max().clamp_min(1e-12)`)",
                "check label ranges against the number of classes",
            ),
        ),
        CategoryGuide(
            "learning_rate",
            "The step size is too large for the loss surface: updates overshoot and grow.",
            "When lr exceeds about 2/curvature, each update lands further from the minimum than "
            "the last; weights and activations grow geometrically until an op overflows.",
            (
                "the loss rises over several steps before it turns non-finite",
                "a smaller learning rate (lr x 1/2, 1/4, ...) trains stably: `nandoctor sweep-lr`",
            ),
            (
                "lower the learning rate to the sweep's recommendation",
                "add warmup, or gradient clipping as a guard",
            ),
        ),
        CategoryGuide(
            "initialization",
            "The model is born broken: weights far outside the scale their layer needs.",
            "With weights κ times too large per layer, activations grow like κ^depth: a deep "
            "network overflows float32 (or float16) in its first forward pass.",
            (
                "std(W)·√fan_in far from PyTorch's default (0.58) or He (1.41)",
                "activation scale grows by orders of magnitude from layer to layer at step 0",
            ),
            (
                "use the default init, or `nn.init.kaiming_normal_` / `xavier_uniform_`",
                "scale residual branches down (e.g. by 1/√(2·n_layers))",
            ),
        ),
        CategoryGuide(
            "invalid_operation",
            "An op was asked for a value outside its domain: log(0), 0/0, sqrt(-1), acos(1.5).",
            "These ops return -inf or NaN for such inputs, and their gradients are infinite at "
            "the edge of the domain (sqrt and log at 0), so even a finite forward pass can "
            "produce NaN gradients.",
            (
                "the first non-finite value is born at log/div/sqrt/pow with finite inputs",
                "a NaN gradient under `torch.where` that masks the forward value",
            ),
            (
                "clamp the input: `torch.log(p.clamp_min(1e-12))`, `a / b.clamp_min(1e-12)`",
                "use the stable fused form: `F.log_softmax`, `F.cross_entropy`, "
                "`F.binary_cross_entropy_with_logits`",
                "for masked values, mask the input too (the double-`where` trick)",
            ),
        ),
        CategoryGuide(
            "exploding_gradients",
            "Gradients grow by orders of magnitude (deep or recurrent nets, rare bad batches).",
            "Backpropagation multiplies Jacobians layer by layer (or step by step in an RNN); "
            "with norms above 1 the product explodes and one update throws the weights out of range.",
            (
                "the gradient norm jumps by orders of magnitude before the failure",
                "the first non-finite value is born in backward",
            ),
            (
                "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` before the step",
                "lower the learning rate; normalization layers; gated recurrent units",
            ),
        ),
        CategoryGuide(
            "precision",
            "A value exceeds the range of its dtype: float16 above 65504, exp beyond 88.7 in float32.",
            "Each floating dtype has a largest finite value; results beyond it become inf, and "
            "inf - inf or 0 x inf becomes NaN. float16 also loses small values (Adam's eps 1e-8 "
            "rounds to 0).",
            (
                "the same op is finite in a float64 (or float32) reference: `nandoctor compare-devices`",
                "overflow of exp/matmul/pow at values the math itself allows",
            ),
            (
                "compute the op in float32, or use bfloat16 autocast instead of `.half()`",
                "work in log space (`torch.logsumexp`, `F.log_softmax`)",
                "keep fp32 master weights with GradScaler; Adam eps >= 1e-4 in pure fp16",
            ),
        ),
        CategoryGuide(
            "device",
            "Two backends disagree at the same precision (CPU and accelerator, or compiled and "
            "eager kernels): a kernel or backend issue.",
            "Kernels differ between backends (reduction order, fused implementations, TF32 "
            "matmuls, torch.compile's generated code and its rewrites of the math); a rare bug "
            "or a numerically fragile op shows on one backend only.",
            (
                "the first op whose results differ beyond tolerance between CPU and accelerator",
                "NaN/Inf on the accelerator only, with the same seeds and inputs",
                "NaN/Inf only when the model is torch.compile'd: the eager run stays finite",
            ),
            (
                "disable TF32 (`torch.backends.cuda.matmul.allow_tf32 = False`)",
                "try another kernel (e.g. disable cuDNN/flash attention for that op), update torch",
                "compiled only: `@torch.compiler.disable` on the failing code, or another "
                "`mode`/backend of torch.compile",
                "report the op with the reproducer to the backend (for torch.compile, the "
                'minifier: `TORCHDYNAMO_REPRO_AFTER="aot"`)',
            ),
        ),
        CategoryGuide(
            "optimizer_config",
            "The optimizer's settings or its own update rule make its update non-finite (eps=0, "
            "huge weight decay, betas, a ported optimizer's formula).",
            "Adam divides by sqrt(v) + eps: with eps=0, a parameter whose gradient is 0 gives 0/0.",
            (
                "the first non-finite value is born inside `optimizer.step()`",
                "loss and gradients finite, parameters non-finite after the step",
            ),
            (
                "use the defaults (Adam eps=1e-8; 1e-4 or more in pure fp16)",
                "check weight decay and momentum values",
                "an optimizer written in the script: check its step() against the paper's rule",
            ),
        ),
    )
}
