"""Per-step cost of precise localization (per-op checks, as in nandoctor's replay of the failing
step and `nandoctor.guard()`) against `torch.autograd.detect_anomaly`, both relative to the plain
step, measured side by side in one process.

    python benchmarks/bench_localize.py [--rounds 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch import nn

import nandoctor


def mlp():
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                          nn.ReLU(), nn.Linear(512, 10))  # fmt: skip
    return model, torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))


def cnn():
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))  # fmt: skip
    return model, torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))


MODES = {
    "plain": contextlib.nullcontext,
    "nandoctor localization": nandoctor.guard,
    "detect_anomaly": torch.autograd.detect_anomaly,
}


def step_time(model, optimizer, x, y, mode, steps: int) -> float:
    times = []
    with MODES[mode]():
        for _ in range(steps):
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for name, build in (("mlp", mlp), ("cnn", cnn)):
        model, x, y = build()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        ratios: dict[str, list[float]] = {mode: [] for mode in MODES if mode != "plain"}
        for round_index in range(args.rounds):
            order = list(MODES) if round_index % 2 == 0 else list(reversed(MODES))
            seen = {mode: step_time(model, optimizer, x, y, mode, args.steps) for mode in order}
            for mode in ratios:
                ratios[mode].append(seen[mode] / seen["plain"])
        summary = ", ".join(f"{mode} {statistics.median(r):.2f}x" for mode, r in ratios.items())
        print(f"{name}: per-step time vs plain: {summary}")


if __name__ == "__main__":
    main()
