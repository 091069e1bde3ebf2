"""Optimizer settings far outside any sensible range, and the line where a setting's value is
written (not where it is used)."""

import textwrap

import pytest

from conftest import line_of
from nandoctor.optimizer_settings import absurd_settings
from nandoctor.source_values import (
    clip_setting,
    clip_switched_off,
    clipping_call,
    container_origin,
    container_reads,
    framework_name,
    lightning_trainer,
    precision_setting,
    where_written,
)


def _optimizer(kind: str, **settings) -> dict:
    return {"type": kind, "index": 0, "settings": settings, "location": None}


@pytest.mark.parametrize(
    "optimizer",
    [_optimizer("Adam", lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0),
     _optimizer("SGD", lr=20.0, momentum=0.9, weight_decay=5e-4),  # word_language_model's lr
     _optimizer("AdamW", lr=3e-4, weight_decay=0.1),
     _optimizer("Adadelta", lr=1.0)],
)  # fmt: skip
def test_settings_that_recipes_use_are_not_absurd(optimizer):
    assert absurd_settings(optimizer) == {}


@pytest.mark.parametrize(
    ("optimizer", "names"),
    [(_optimizer("Adam", lr=5e5), {"lr"}),
     (_optimizer("AdamW", lr=1e-2, weight_decay=1000.0), {"weight_decay"}),
     (_optimizer("SGD", lr=0.1, momentum=1.5), {"momentum"}),
     (_optimizer("Adam", lr=1e-3, betas=[0.9, 1.2]), {"betas"})],
)  # fmt: skip
def test_settings_far_outside_any_sensible_range_are_named(optimizer, names):
    assert set(absurd_settings(optimizer)) == names


def test_the_value_is_traced_from_the_call_to_where_it_is_written(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import argparse, torch
        BASE_LR = 3e-2
        parser = argparse.ArgumentParser()
        parser.add_argument("--learning-rate", type=float, default=5.0)
        args = parser.parse_args()
        config = {"lr": 0.5}
        lr = BASE_LR * 8
        a = torch.optim.SGD([], lr=lr)
        b = torch.optim.SGD([], lr=args.learning_rate)
        c = torch.optim.SGD([], lr=config["lr"])
        d = torch.optim.SGD([], lr=BASE_LR)
        parser.add_argument("--base-lr", type=float, default=BASE_LR)
        e = torch.optim.SGD([], lr=parser.parse_args().base_lr)
    """)
    )
    assert where_written(str(script), 13, "lr").line == 2  # the constant the default names
    assert where_written(str(script), 8, "lr").line == 7
    assert where_written(str(script), 9, "lr").line == 4
    assert where_written(str(script), 9, "lr", ("--learning-rate", "1")).how == "the command line"
    assert where_written(str(script), 10, "lr").line == 6
    assert where_written(str(script), 11, "lr").line == 2
    assert where_written(str(script), 11, "momentum") is None


def test_a_rate_read_from_a_schedule_in_a_config_is_traced_to_its_entry(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import torch
        cfg = {
            "optim": {"rates": [0.2, 0.02]},
            "learning_rate": {0: 0.5, 10: 0.05},
        }
        class Model:
            def __init__(self):
                self.cfg = cfg
            def optimizers(self, epoch):
                rates = self.cfg["learning_rate"]
                a = torch.optim.SGD([], lr=rates[0])
                b = torch.optim.SGD([], lr=cfg["optim"]["rates"][-1])
                c = torch.optim.SGD([], lr=rates[epoch])
    """)
    )
    assert where_written(str(script), 11, "lr").line == 4
    assert where_written(str(script), 12, "lr").line == 3
    # which entry `rates[epoch]` reads is decided at run time
    assert where_written(str(script), 13, "lr") is None


def test_a_rate_held_by_an_object_or_scaled_is_traced_to_the_number_a_user_edits(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import torch
        from types import SimpleNamespace
        LEARNING_RATE = 1e-3
        CFG = \"\"\"
        [net]
        batch=16
        learning_rate=0.15
        \"\"\"
        cfg = SimpleNamespace(SOLVER=SimpleNamespace(BASE_LR=0.02, MOMENTUM=0.9))
        cfg.SOLVER.BASE_LR = 0.01
        class Factorization:
            def __init__(self, alpha, base_rate=LEARNING_RATE):
                self.alpha = alpha
                self.base_rate = base_rate
            def optimizers(self, options, batch_size):
                a = torch.optim.SGD([], lr=self.alpha)
                lr = self.base_rate
                b = torch.optim.SGD([], lr=lr)
                rate = float(options["learning_rate"])
                c = torch.optim.SGD([], lr=rate / batch_size, momentum=0.9)
                d = torch.optim.SGD([], lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM)
        model = Factorization(R, alpha=0.25)
    """)
    )
    assert where_written(str(script), 16, "lr").line == 22  # the argument of the constructor
    assert where_written(str(script), 18, "lr").line == 3  # the parameter's default
    assert where_written(str(script), 20, "lr").line == 7  # the rate operand, in a config text
    assert where_written(str(script), 21, "lr").line == 10  # the override, not the first value
    assert where_written(str(script), 21, "momentum").line == 9  # the config's own entry


def test_a_setting_read_from_an_object_a_class_built_is_traced_to_its_keyword(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import torch
        from dataclasses import dataclass, field
        @dataclass
        class Arguments:
            learning_rate: float = field(default=1e-5, metadata={"help": "rate"})
            adam_epsilon: float = 1e-8
            weight_decay: float = 0.0
        class Trainer:
            def __init__(self):
                self.args = Arguments(
                    adam_epsilon=1e-8,
                )
            def create_optimizer(self, params):
                return torch.optim.AdamW(params, lr=self.args.learning_rate, eps=self.args.adam_epsilon)
        options = Arguments(weight_decay=0.1)
        options.weight_decay = 10.0
        optimizer = torch.optim.AdamW([], weight_decay=options.weight_decay)
    """)
    )
    assert where_written(str(script), 14, "eps").line == 11  # the keyword the object was built with
    assert where_written(str(script), 14, "lr").line == 5  # else the class's field default
    assert where_written(str(script), 17, "weight_decay").line == 16  # a later override wins


def test_an_option_with_two_names_is_stored_under_its_first_long_one(tmp_path):
    # argparse's own rule: `"--lr", "--learning-rate"` is `args.lr`, whatever the longer name
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", "--learning-rate", type=float, default=1e-3)
        parser.add_argument("-m", "--momentum-value", dest="mom", type=float, default=0.9)
        args = parser.parse_args()
        a = torch.optim.SGD([], lr=args.lr, momentum=args.mom)
    """)
    )
    assert where_written(str(script), 6, "lr").line == 3
    assert where_written(str(script), 6, "momentum").line == 4
    assert where_written(str(script), 6, "lr", ("--learning-rate=1",)).how == "the command line"


def test_a_setting_of_an_optimizer_the_framework_builds_is_found_under_its_name(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        from transformers import TrainingArguments
        EPS = 1e-8
        args = TrainingArguments(
            "out",
            learning_rate=5e3,
            adam_epsilon=EPS,
        )
        second_stage = dict(weight_decay=0.1)
        third_stage = dict(weight_decay=0.0)
    """)
    )
    assert framework_name(str(script), "lr") == (
        "learning_rate",
        where_written(str(script), 5, "learning_rate"),
    )
    assert framework_name(str(script), "lr")[1].line == 5
    assert framework_name(str(script), "eps")[1].line == 2  # followed to the literal
    name, written = framework_name(str(script), "lr", ("--learning_rate", "1e-4"))
    assert (name, written.how) == ("learning_rate", "the command line")
    assert framework_name(str(script), "weight_decay") is None  # two calls: which one is unknown
    assert framework_name(str(script), "momentum") is None


def test_a_learning_rate_typo_is_named_at_the_line_that_wrote_it(nandoctor):
    result = nandoctor("run", "lr_typo_adam.py", "--stages", "anomaly")
    assert result.exit_code == 1
    top = result.report["causes"][0]
    assert top["category"] == "learning_rate"
    assert top["location"]["line"] == line_of("lr_typo_adam.py", "config = {")
    assert top["verified_fix"] is True


def test_an_absurd_weight_decay_outranks_the_learning_rate_it_interacts_with(nandoctor):
    result = nandoctor("run", "adamw_decay_typo.py")
    assert result.exit_code == 1
    top = result.report["causes"][0]
    assert top["category"] == "optimizer_config" and top["verified_fix"] is True
    assert top["location"]["line"] == line_of("adamw_decay_typo.py", '"--weight-decay"')


def test_an_lbfgs_without_a_line_search_is_fixed_by_one_when_its_rerun_trains(nandoctor):
    # L-BFGS at its defaults (lr=1, no line search) blows a curve fit up; the learning-rate
    # sweep trains too, at x1/100, but the line search keeps the rate and is the setting.
    script = "optimizer_lbfgs_no_line_search.py"
    result = nandoctor("run", script, "--stages", "anomaly")
    assert result.exit_code == 1
    top = result.report["causes"][0]
    assert (top["category"], top["code"], top["verified_fix"]) == (
        "optimizer_config",
        "OC603",
        True,
    )
    assert top["location"]["line"] == line_of(script, "# fix here")
    assert "line_search_fn='strong_wolfe'" in top["evidence"][-1]


_CLIPS_FOR_VGG_ONLY = (
    "p.add_argument('--net', default='res101', type=str)\n"
    "loss.backward()\n"
    "if args.net == 'vgg16':\n"
    "    clip_gradient(model, 10.)\n"
)


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("optimizer_config = dict(grad_clip=None)\n", 1),  # an mmcv-style config
        ("cfg = {'lr': 0.1, 'clip_grad': None}\n", 1),
        (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--clip', default=5.0)\n"
            "torch.nn.utils.clip_grad_norm_(m.parameters(), args.clip)\n",
            3,
        ),
        ("args = TrainingArguments('out', max_grad_norm=0.0)\n", 1),
        ("trainer = Trainer(gradient_clip_val=None)\n", 1),
        ("x = 1\ntorch.nn.utils.clip_grad_norm_(params, max_norm=50.0)\n", 2),
        # a PPO ratio clip named `clip` in a script that never clips gradients
        (
            "p.add_argument('--clip', default=0.2)\nratio.clamp(1 - args.clip, 1 + args.clip)\n",
            None,
        ),
        ("emb = nn.Embedding(10, 4, max_norm=1.0)\n", None),  # a renorm, not clipping
        ("loss.backward()\n# clip_gradient(model, 100.)\n", 2),  # un-commented to clip
    ],
)
def test_the_line_where_a_script_sets_its_gradient_clipping(tmp_path, source, line):
    script = tmp_path / "train.py"
    script.write_text(source)
    found = clip_setting(str(script))
    assert (found.line if found else None) == line


@pytest.mark.parametrize(
    ("source", "script_args", "line"),
    [
        ("optimizer_config = dict(grad_clip=None)\n", (), 1),
        ('CONFIG = {"lr": 1.2, "clip_gradient": False}\n', (), 1),
        ("p.add_argument('--clip', default=0, type=float)\nclip_grad_norm_(ps, args.clip)\n", (), 1),
        ("p.add_argument('--clip', default=0, type=float)\nclip_grad_norm_(ps, args.clip)\n",
         ("--clip", "0.25"), None),  # given on the command line
        ("p.add_argument('--clip', default=5.0)\nclip_grad_norm_(ps, args.clip)\n", (), None),
        ("trainer = Trainer(gradient_clip_val=1.0)\n", (), None),
        ("x = 1\ntorch.nn.utils.clip_grad_norm_(params, max_norm=50.0)\n", (), None),
        ("def hook(grad_clip=None):\n    pass\n", (), None),  # a parameter, not a setting
        # a clipping call commented out, in a script that clips nowhere else
        ("loss.backward()\n#   torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)\n", (), 2),
        ("# clip_grad_norm_(ps, 5.0)\nclip_grad_norm_(ps, 1.0)\n", (), None),
        ('"""Example:\n# clip_grad_norm_(ps, 1.0)\n"""\n', (), None),  # a docstring
        ("# clip the gradients here some day\n", (), None),  # words, not a call
        # a clipping call only some configurations make: the `if` false in this run
        (_CLIPS_FOR_VGG_ONLY, (), 3),
        (_CLIPS_FOR_VGG_ONLY, ("--net", "vgg16"), None),
        (_CLIPS_FOR_VGG_ONLY, ("--net=res101",), 3),
        ("p.add_argument('--no-clip', action='store_true')\n"
         "if not args.no_clip:\n    clip_grad_norm_(ps, 1.0)\n", ("--no-clip",), 2),
        ("p.add_argument('--no-clip', action='store_true')\n"
         "if not args.no_clip:\n    clip_grad_norm_(ps, 1.0)\n", (), None),
        ("if step > 100:\n    clip_grad_norm_(ps, 1.0)\n", (), None),  # not an option
    ],
)  # fmt: skip
def test_a_gradient_clipping_setting_that_switches_clipping_off(
    tmp_path, source, script_args, line
):
    assert _line_found(clip_switched_off, tmp_path, source, script_args) == line


def test_a_clipping_option_given_on_the_command_line_is_said_to_be(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("p.add_argument('--max-grad-norm', type=float, default=0.0)\n")
    assert clip_setting(str(script), ("--max-grad-norm=0",)).how == "the command line"


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("loss.backward()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n", 2),
        ("clip_grad_norm_(a, 1.0)\nclip_grad_value_(b, 1.0)\n", None),  # which one is unsaid
        ("loss.backward()\n", None),
    ],
)
def test_the_clipping_call_a_command_line_clip_acts_in(tmp_path, source, line):
    script = tmp_path / "train.py"
    script.write_text(source)
    found = clipping_call(str(script))
    assert (found.line if found else None) == line


@pytest.mark.parametrize(
    ("source", "script_args", "line"),
    [
        ('CONFIG = {"lr": 1e-3, "precision": "16-true"}\n', (), 1),  # Lightning, from a config
        ("p.add_argument('--precision', default='bf16-mixed')\n", (), 1),
        ("trainer = L.Trainer(max_epochs=3, precision=16)\n", (), 1),
        ("accelerator = Accelerator(mixed_precision='fp16')\n", (), 1),
        ("args = TrainingArguments('out', fp16=True)\n", (), 1),
        ("p.add_argument('--fp16', action='store_true')\n", ("--fp16",), 0),  # given on the line
        # full precision chosen, or a flag left off: no reduced precision is set
        ('trainer = L.Trainer(precision="32-true")\n', (), None),
        ("p.add_argument('--fp16', action='store_true')\n", (), None),
        ("args = TrainingArguments('out', fp16=False)\n", (), None),
        ("torch.set_float32_matmul_precision('high')\n", (), None),
    ],
)
def test_the_line_where_a_framework_option_chooses_reduced_precision(
    tmp_path, source, script_args, line
):
    assert _line_found(precision_setting, tmp_path, source, script_args) == line


def _line_found(finder, tmp_path, source: str, script_args) -> int | None:
    """The line `finder(script, script_args)` names in a script holding `source`, or None."""
    script = tmp_path / "train.py"
    script.write_text(source)
    found = finder(str(script), script_args)
    return found.line if found else None


_DATASET = """\
class Rows(Dataset):
    def __init__(self, table, names):
        self.x = torch.from_numpy(table[:, :-1])
        self.names = names
        self.items = []
    def __getitem__(self, i):
        return self.x[i], self.names[i]
    def other(self, i):
        return (self.x[i] - self.mean) / self.std
    def first(self, i):
        row = self.items[i]
        return row


def load(path):
    def parse(text):
        return text
    rows = np.genfromtxt(path, delimiter=",")
    return rows


def main():
    raw = read_csv("train.csv")
    table = raw.astype("float32")
    train = Rows(table[:800], names=["a"])
    test = Rows(load("test.csv"), names=["b"])
"""


def test_the_containers_a_line_only_reads_and_where_they_were_filled(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_DATASET)
    lines = _DATASET.splitlines()
    at = {code: i + 1 for i, line in enumerate(lines) for code in [line.strip()]}
    read = at["return self.x[i], self.names[i]"]
    assert container_reads(str(script), read) == ("x", "names")
    assert container_reads(str(script), at["return (self.x[i] - self.mean) / self.std"]) == ()
    # self.x = from_numpy(table[:, :-1]) <- the argument of Rows(...) <- table = raw.astype(...)
    filled = container_origin(str(script), read, "x")
    assert filled.line == at['table = raw.astype("float32")']
    assert (
        container_origin(str(script), read, "names").line
        == at['train = Rows(table[:800], names=["a"])']
    )
    # the first call is the one followed; a function of the script's is followed to its return
    rows = _DATASET.replace('Rows(table[:800], names=["a"])', 'Rows(table, names=["a"])')
    rows = rows.replace("table = raw.astype", "table = load(path)\n    unused = raw.astype")
    script = tmp_path / "train_from_a_loader.py"
    script.write_text(rows)
    lines = rows.splitlines()
    at = {code: i + 1 for i, line in enumerate(lines) for code in [line.strip()]}
    filled = container_origin(str(script), at["return self.x[i], self.names[i]"], "x")
    assert filled.line == at['rows = np.genfromtxt(path, delimiter=",")']
    # ... unless what it returns is changed in place after it is made: the call is shown
    for mutation in ("rows[0] = 0.0", "rows.append(row)", "rows += 1"):
        script = tmp_path / f"train_mutated_{len(mutation)}.py"
        script.write_text(rows.replace("    return rows", f"    {mutation}\n    return rows"))
        filled = container_origin(str(script), at["return self.x[i], self.names[i]"], "x")
        assert filled.code == "table = load(path)"
    # a container only ever set empty in the class has no line that filled it
    assert container_origin(str(script), at["row = self.items[i]"], "items") is None


@pytest.mark.parametrize(
    ("source", "line"),
    [("import lightning as L\nx = 1\ntrainer = L.Trainer(max_epochs=2)\n", 3),
     ("from pytorch_lightning import Trainer\ntrainer = Trainer(\n    max_epochs=2)\n", 2),
     ("from transformers import Trainer\ntrainer = Trainer(model)\n", None),  # not Lightning
     ("import lightning as L\na = L.Trainer()\nb = L.Trainer()\n", None)],  # which one?
)  # fmt: skip
def test_lightnings_clipping_goes_where_its_one_trainer_is_built(tmp_path, source, line):
    script = tmp_path / "train.py"
    script.write_text(source)
    found = lightning_trainer(str(script))
    assert (found.line if found else None) == line
