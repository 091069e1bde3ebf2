"""Data scan: bad samples located end to end through the CLI; statistics against naive oracles."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from conftest import line_of
from nandoctor.instrument.batches import check_class_targets, iter_leaves, summarize
from nandoctor.instrument.loaders import dataset_index, watch_loader_batches
from nandoctor.instrument.origin import trace_nonfinite_origin
from nandoctor.instrument.provenance import ProvenanceTracer

STAGES = ("--stages", "data_scan,init_check,anomaly")


def _top(result) -> dict:
    causes = result.report["causes"]
    assert causes, result.stdout + result.stderr
    return causes[0]


# ---- end to end -------------------------------------------------------------------------------
def test_nan_rows_in_a_shuffled_worker_loader_are_located(nandoctor):
    result = nandoctor("run", "data_nan_rows_loader.py", *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    cause = _top(result)
    assert (cause["category"], cause["stage"]) == ("data", "data_scan")
    evidence = "\n".join(cause["evidence"])
    assert "feature/channel 3 (dim 1)" in evidence
    # The shuffled sampler's indices name the planted rows.
    assert "dataset indices of those samples: 37" in evidence or "samples: 150" in evidence
    assert "`features` (256, 6) holds NaN/Inf in 2 rows (rows 37, 150)" in evidence
    sample = int(cause["title"].split(" sample ")[1].split()[0])
    assert f"samples {sample};" in evidence
    assert "rows 37, 150 of `features`" in cause["fix"]
    assert cause["location"]["file"].endswith("data_nan_rows_loader.py")


def test_an_input_made_inf_by_a_float16_op_is_the_dtypes_not_the_datas(nandoctor):
    # finite sizes from the data; their product, computed in float16 before the forward, is inf
    result = nandoctor("run", "half_resolution_overflow.py", *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["dtype"]) == ("data", "float16")
    cause = _top(result)
    assert (cause["category"], cause["code"]) == ("precision", "PR101")
    assert cause["location"]["line"] == line_of("half_resolution_overflow.py", "sizes[:, :1] *")
    data = next(c for c in result.report["causes"] if c["category"] == "data")
    assert any("the data carried none" in line for line in data["evidence"])


def test_nan_made_in_getitem_points_at_the_division(nandoctor):
    result = nandoctor("run", "data_zero_mask_loader.py", *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    cause = _top(result)
    assert (cause["category"], cause["stage"]) == ("data", "data_scan")
    assert cause["location"]["line"] == line_of("data_zero_mask_loader.py", "mask / mask.max()")
    assert cause["location"]["function"] == "__getitem__"
    index = int(cause["title"].split("dataset index ")[1].rstrip(")"))
    assert index % 23 == 0  # the planted all-zero masks
    assert "mask / mask.max().clamp_min(1e-12)" in cause["fix"]
    assert cause["confidence"] > 0.85


def test_inputs_far_from_unit_scale_are_a_cause_when_standardizing_them_trains(nandoctor):
    # A VAE on raw counts in the thousands: exp() of its log-variance overflows. The re-run
    # that standardizes the batches is the evidence, not the magnitude alone.
    result = nandoctor("run", "data_raw_counts_vae.py")
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"], cause["verified_fix"]) == ("data", "DA204", True)
    assert any("re-ran with inputs standardized: batch[0]" in line for line in cause["evidence"])


def test_hand_indexed_batches_are_located(nandoctor):
    result = nandoctor("run", "data_hand_indexed.py", *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    cause = _top(result)
    assert (cause["category"], cause["stage"]) == ("data", "data_scan")
    assert cause["title"].startswith("Inf in the training data: input[0] sample")
    evidence = "\n".join(cause["evidence"])
    assert "feature/channel 4 (dim 1)" in evidence
    assert "`X` (200, 5) holds NaN/Inf in 2 rows (rows 11, 120)" in evidence
    assert cause["location"]["line"] == line_of("data_hand_indexed.py", "X = torch.cat")


def test_out_of_range_labels_in_dataclass_batches(nandoctor):
    result = nandoctor("run", "data_label_out_of_range.py", *STAGES)
    assert result.exit_code == 3, result.stdout + result.stderr  # cross_entropy raises on CPU
    cause = _top(result)
    assert (cause["category"], cause["stage"]) == ("data", "data_scan")
    assert "outside [0, 10)" in cause["title"]
    assert cause["location"]["line"] == line_of("data_label_out_of_range.py", "criterion(model(")
    evidence = "\n".join(cause["evidence"])
    assert "(batch.label)" in evidence and "dataset indices of those samples" in evidence
    assert "equal to ignore_index=-100 left out" in evidence
    assert "y - 1" in cause["fix"]


@pytest.mark.parametrize(
    "script",
    [
        "data_healthy_loader.py",
        "data_masked_missing_targets.py",
        "init_healthy_mixed.py",
        "healthy_mlp.py",
        "healthy_masked_attention.py",
    ],
)
def test_healthy_scripts_get_nothing_above_a_hint(nandoctor, script):
    result = nandoctor("run", script, *STAGES)
    assert result.exit_code == 0, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "healthy"
    for name in ("data_scan", "init_check"):
        assert report["stages"][name]["status"] == "ran"
    loud = [
        f
        for f in report["findings"]
        if f["stage"] in ("data_scan", "init_check") and f["severity"] != "hint"
    ]
    assert loud == []


# ---- oracles ----------------------------------------------------------------------------------
def _naive_summary(x: np.ndarray, magnitude: float) -> dict:
    """Element by element, the way one would check by hand."""
    rows = x.reshape(x.shape[0], -1)
    finite = [v for v in rows.flatten().tolist() if math.isfinite(v)]
    bad_rows = [i for i, row in enumerate(rows) if not all(math.isfinite(v) for v in row)]
    constant = [i for i, row in enumerate(rows) if len(set(row.tolist())) == 1]
    features = sorted(
        {j for i, row in enumerate(x) for j in range(x.shape[1]) if not np.isfinite(row[j]).all()}
    )
    big = [v for v in finite if abs(v) > magnitude]
    mean = sum(finite) / len(finite)
    return {
        "nan": sum(math.isnan(v) for v in rows.flatten().tolist()),
        "posinf": sum(v == math.inf for v in rows.flatten().tolist()),
        "neginf": sum(v == -math.inf for v in rows.flatten().tolist()),
        "bad_at": bad_rows,
        "bad_features": features,
        "constant": constant,
        "zero": [i for i in constant if rows[i][0] == 0],
        "min": min(finite),
        "max": max(finite),
        "mean": mean,
        "std": math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite)),
        "big_values": len(big),
        "big_at": [
            i
            for i, row in enumerate(rows)
            if any(abs(v) > magnitude and math.isfinite(v) for v in row)
        ],
        "largest": max((abs(v) for v in big), default=None),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_summary_matches_a_naive_count(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(12, 5, 3)).astype(np.float64)
    x[3, 1, 2] = np.nan
    x[7, 4, 0] = np.inf
    x[7, 0, 1] = -np.inf
    x[5] = 0.0  # an all-zero sample
    x[9] = 2.5  # a constant sample
    x[10, 2, 2] = 3.0e5  # beyond the magnitude threshold
    expected = _naive_summary(x, 1.0e4)
    got = summarize(torch.from_numpy(x), 1.0e4, limit=100)
    for key in ("nan", "posinf", "neginf", "bad_at", "bad_features", "big_values", "big_at"):
        assert got[key] == expected[key], key
    assert got["bad_samples"] == len(expected["bad_at"])
    assert got["first_bad"] == [3, 1, 2]
    assert got["constant_samples"] == len(expected["constant"]) == 2
    assert got["zero_samples"] == len(expected["zero"]) == 1
    assert got["constant_at"] == expected["constant"]
    for key in ("min", "max", "mean", "std", "largest"):
        assert got[key] == pytest.approx(expected[key], rel=1e-9), key


def test_summary_fast_path_edge_cases_in_float32():
    x = torch.randn(6, 50)
    x[1] = 1000.0 + 1e-3 * torch.arange(50)  # nearly constant: not constant
    x[2] = 7.0  # constant
    x[4, 3] = 3.0e20  # finite, but its square overflows float32
    got = summarize(x, 1.0e4)
    assert "nan" not in got and "bad_at" not in got
    assert (got["constant_samples"], got["constant_at"], got["zero_samples"]) == (1, [2], 0)
    assert (got["big_values"], got["big_at"], got["largest"]) == (1, [4], pytest.approx(3.0e20))
    reference = x.double().numpy()
    assert got["max"] == pytest.approx(reference.max())
    assert got["mean"] == pytest.approx(reference.mean(), rel=1e-6)
    assert got["std"] == pytest.approx(reference.std(), rel=1e-6)


def test_summary_of_a_finite_float16_tensor():
    x = torch.randn(64, 10).half()
    got = summarize(x, 1.0e4)
    reference = x.float().numpy()
    assert "nan" not in got and "constant_samples" not in got
    assert got["mean"] == pytest.approx(float(reference.mean()), abs=1e-6)
    assert got["std"] == pytest.approx(float(reference.std()), rel=1e-5)
    assert (got["min"], got["max"]) == (float(reference.min()), float(reference.max()))


def test_integer_tensors_get_range_only():
    labels = [3, 0, 7, 7]
    assert summarize(torch.tensor(labels), 1.0) == {
        "dtype": "int64",
        "shape": [4],
        "samples": 4,
        "min": 0.0,
        "max": 7.0,
        "mean": pytest.approx(np.mean(labels)),
        "std": pytest.approx(np.std(labels)),
    }


def test_class_targets_against_a_loop():
    logits = torch.zeros(6, 4)
    target = torch.tensor([0, 3, 4, -100, -1, 2])
    got = check_class_targets(logits, target, ignore_index=-100)
    outside = [i for i, t in enumerate(target.tolist()) if t != -100 and not 0 <= t < 4]
    assert got["out_of_range"] == len(outside) == 2
    assert got["bad_at"] == outside
    assert got["bad_values"] == [-1, 4]
    assert (got["classes"], got["ignored"], got["min"], got["max"]) == (4, 1, -1, 4)
    # Segmentation targets: (N, H, W) with C on dim 1 of the logits.
    seg = check_class_targets(
        torch.zeros(2, 3, 2, 2), torch.tensor([[[0, 1], [2, 2]], [[0, 5], [1, 1]]]), -100
    )
    assert (seg["out_of_range"], seg["bad_at"]) == (1, [1])
    assert check_class_targets(logits, torch.rand(6, 4), -100) is None  # probabilities


def test_leaves_of_nested_batches():
    from dataclasses import dataclass

    @dataclass
    class Pair:
        left: torch.Tensor
        right: list

    batch = {"a": (torch.zeros(1), [torch.ones(2)]), "b": Pair(torch.zeros(3), [torch.zeros(4)])}
    assert [path for path, _ in iter_leaves(batch)] == [
        "batch['a'][0]",
        "batch['a'][1][0]",
        "batch['b'].left",
        "batch['b'].right[0]",
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_sampler_indices_follow_their_batches(workers):
    """TensorDataset(arange): each value is its own dataset index, so the mapping is checkable."""
    torch.manual_seed(0)
    dataset = TensorDataset(torch.arange(40))
    seen = []
    undo = watch_loader_batches(lambda loaded: seen.append(loaded))
    try:
        loader = DataLoader(dataset, batch_size=6, shuffle=True, num_workers=workers)
        for _epoch in range(2):
            for (values,) in loader:
                loaded = seen[-1]
                assert [dataset_index(loaded, i) for i in range(len(values))] == values.tolist()
    finally:
        undo()
    assert len(seen) == 14


class _Masks(Dataset):
    def __init__(self):
        self.masks = np.ones((4, 3), dtype=np.float32)
        self.masks[2] = 0.0

    def __len__(self):
        return 4

    def __getitem__(self, index):
        mask = self.masks[index]
        scale = mask.max()
        with np.errstate(invalid="ignore"):
            normed = mask / scale
        return torch.from_numpy(normed)


def test_origin_tracer_finds_the_numpy_line_and_keeps_random_state():
    dataset = _Masks()
    random.seed(1)
    torch.manual_seed(1)
    before = (random.random(), torch.rand(1).item())
    random.seed(1)
    torch.manual_seed(1)
    origin, reproduced = trace_nonfinite_origin(lambda: dataset[2])
    assert reproduced
    assert origin.variable == "normed"
    assert origin.location.function == "__getitem__"
    assert "mask / scale" in origin.location.code()
    assert origin.counts == "nan=3 of 3"
    assert (random.random(), torch.rand(1).item()) == before
    assert trace_nonfinite_origin(lambda: dataset[0]) == (None, False)


def test_values_parsed_before_training_are_located_at_the_parse(nandoctor):
    # The Dataset serves rows of the tensor it was given; the NaN came from empty CSV fields,
    # through a helper's return, a scaler that ignores NaN and the Dataset's constructor. The
    # traced re-run from the start names the parse; the lines the values passed stay evidence.
    script = "data_parsed_csv_scaled.py"
    result = nandoctor("run", script, "--stages", "data_scan,anomaly")
    assert result.exit_code == 1
    top = _top(result)
    assert (top["category"], top["code"]) == ("data", "DA201")
    assert top["location"]["line"] == line_of(script, "# made here")
    assert top["location"]["function"] == "load_readings"
    traced = top["evidence"][0]
    assert "under a line tracer: `raw` first holds nan=2 of 3072" in traced
    assert f"line {line_of(script, 'data = Readings(')}" in traced or "passed through" in traced
    assert f"(line {line_of(script, '# made here')}: `raw = np.genfromtxt(" in top["fix"]


def test_values_a_tensordataset_serves_are_traced_to_the_parse(nandoctor):
    # No line of the script holds the NaN where they enter torch (`TensorDataset(torch.tensor(
    # x_train))` inside a function reading module globals): the walk starts at the statement
    # that built the dataset the first batch came from.
    script = "data_loadtxt_tensordataset.py"
    result = nandoctor("run", script, "--stages", "data_scan,anomaly")
    assert result.exit_code == 1
    top = _top(result)
    assert (top["category"], top["location"]["line"]) == ("data", line_of(script, "# made here"))
    assert "`data` first holds nan=8 of 4000" in top["evidence"][0]


def test_a_clean_up_that_lets_one_kind_through_is_the_line_to_fix(nandoctor):
    # `x[x != x] = 0` zeroes the NaN and keeps the -inf: the script already cleans these
    # values, so its clean-up, not the extractor, is the line to complete.
    script = "data_nan_only_cleanup.py"
    result = nandoctor("run", script, "--stages", "data_scan,anomaly")
    assert result.exit_code == 1
    top = _top(result)
    assert (top["category"], top["location"]["line"]) == ("data", line_of(script, "# fix here"))
    assert "nan=2, -inf=2 of 1536 before it, -inf=2 of 1536 after" in top["evidence"][0]
    assert "-inf included: test with `np.isfinite`" in top["fix"]


def _percent_change(close):
    out = np.full_like(close, np.nan)  # NaN in the first row, dropped later
    out[1:] = close[1:] / close[:-1] - 1.0  # +inf after a zero close
    return out


def _feature_table(close):
    change = _percent_change(close)
    label = np.r_[np.ones(len(close) - 1), np.nan]
    table = np.column_stack([change, label])
    table = table[~np.isnan(table).any(axis=1)]  # keeps the +inf row
    return table  # where the walk starts


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_provenance_follows_the_kind_of_value_that_reached_the_sink():
    # Two variables with NaN/Inf meet in one table; only the +inf survives the NaN filter, and
    # the walk back follows the +inf to the division that made it, not the NaN placeholders.
    tracer = ProvenanceTracer()
    tracer.start()
    try:
        table = _feature_table(np.array([1.0, 2.0, 0.0, 3.0, 4.0]))
    finally:
        tracer.stop()
    assert np.isposinf(table).sum() == 1 and not np.isnan(table).any()
    here = os.path.abspath(__file__)
    sink = tracer.first_at(here, line_of(here, "# where the walk starts"))
    chain = tracer.trace_back(sink, {"+inf"})
    made = chain[-1]
    assert made.location.line == line_of(here, "# +inf after a zero close")
    assert (made.name, made.counts) == ("out", "nan=1, +inf=1 of 5")
    assert [m.location.function for m in chain[:3]] == ["_feature_table"] * 3
    # the NaN filter on the way kept the +inf: a clean-up that missed a kind
    cleanup = tracer.filtered_in(chain)
    assert cleanup.location.line == line_of(here, "# keeps the +inf row")
    assert (cleanup.before, cleanup.after) == ("nan=2, +inf=1 of 10", "+inf=1 of 6")


def test_a_value_the_dataset_only_reads_is_located_where_its_container_was_filled(nandoctor):
    # __getitem__ returns `self.features[i], self.targets[i]`: the NaN was made when the table
    # was parsed, before training, inside the script's own `parse_table` (followed from the
    # line that calls it to its `return`); that line leads, the read stays as evidence.
    script = "data_container_filled_at_load.py"
    result = nandoctor("run", script, "--stages", "data_scan,anomaly")
    assert result.exit_code == 1
    top = result.report["causes"][0]
    assert (top["category"], top["code"]) == ("data", "DA201")
    assert top["location"]["line"] == line_of(script, "# fix here")
    read_line = line_of(script, "return self.features[i], self.targets[i]")
    assert any(f"line {read_line} only reads `self.targets`" in e for e in top["evidence"])
