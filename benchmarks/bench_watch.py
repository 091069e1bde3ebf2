"""Overhead of a watched run: per-step time under `nandoctor run` vs the plain script.

Each workload script times its own steps (after warm-up) and writes the median to a file, so
start-up costs (torch import, child process) do not blur the per-step ratio; the whole-run
wall-time ratio is printed too. Plain and watched runs alternate in each round, and the ratio
is taken within a round, so load from other processes hits both sides alike.

    python benchmarks/bench_watch.py [--rounds 3] [--steps 40] [--device cuda]

With `--device cuda` the model and batch live on the GPU and each step ends with a
synchronize (in both runs alike), so a step's time includes its kernels: the watch's few
reductions per step are measured, and a check that synchronized per op would show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

WORKLOADS = {
    "mlp": """
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                              nn.ReLU(), nn.Linear(512, 10))
        x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
    """,
    "cnn": """
        model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
        x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    """,
}

TEMPLATE = """
import statistics, sys, time
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
{workload}
device = torch.device("{device}")
model, x, y = model.to(device), x.to(device), y.to(device)
synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
times = []
for step in range({steps}):
    start = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    synchronize()
    times.append(time.perf_counter() - start)
with open(sys.argv[1], "w") as out:
    out.write(str(statistics.median(times[5:])))
"""


def write_script(folder: str, name: str, steps: int, device: str) -> str:
    path = os.path.join(folder, f"{name}.py")
    workload = textwrap.dedent(WORKLOADS[name])
    with open(path, "w") as file:
        file.write(TEMPLATE.format(workload=workload, steps=steps, device=device))
    return path


def timed(command: list[str], result_file: str) -> tuple[float, float]:
    """(median step seconds, whole-run wall seconds) of one run."""
    start = time.perf_counter()
    subprocess.run(command, check=False, capture_output=True)
    wall = time.perf_counter() - start
    with open(result_file) as file:
        return float(file.read()), wall


def measure(name: str, script: str, folder: str, steps: int, rounds: int) -> dict:
    out = os.path.join(folder, f"{name}.step")
    plain = [sys.executable, script, out]
    watched = [sys.executable, "-m", "nandoctor", "run", "--stages", "anomaly",
               "--max-steps", str(steps + 1), script, "--", out]  # fmt: skip
    step_ratios, wall_ratios = [], []
    for round_index in range(rounds):
        pair = [("plain", plain), ("watched", watched)]
        if round_index % 2:
            pair.reverse()
        seen = {label: timed(command, out) for label, command in pair}
        step_ratios.append(seen["watched"][0] / seen["plain"][0])
        wall_ratios.append(seen["watched"][1] / seen["plain"][1])
    return {
        "step_ratio": statistics.median(step_ratios),
        "wall_ratio": statistics.median(wall_ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = {}
        for name in WORKLOADS:
            script = write_script(folder, name, args.steps, args.device)
            results[name] = measure(name, script, folder, args.steps, args.rounds)
            print(f"{name} on {args.device}: watched/plain per-step time {results[name]['step_ratio']:.2f}x, "
                  f"whole run {results[name]['wall_ratio']:.2f}x")  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
