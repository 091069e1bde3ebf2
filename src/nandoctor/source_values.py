"""Where a setting's value is written: from the call that uses it (`Adam(params, lr=lr)`) back
to the literal a user edits (`lr = 3e-2`, `parser.add_argument("--lr", default=3e-2)`,
`config = {"lr": 3e-2}`), by reading the script's source. Static and bounded: a value computed
at run time, or from another file, leaves the call's own line as the answer."""

from __future__ import annotations

import ast
import functools
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass

_MAX_HOPS = 6  # names followed from the call back to a literal


@dataclass(frozen=True)
class WrittenAt:
    line: int
    code: str
    how: str  # "the call", "an assignment", "an argparse default", "a config entry", "the command line"


def where_written(file: str, call_line: int, keyword: str, script_args=()) -> WrittenAt | None:
    """The line where the value of `keyword` in the call at `call_line` is written, or None when
    the source cannot be read or holds no such call."""
    tree, lines = _parse(file)
    if tree is None:
        return None
    call = _call_at(tree, call_line, keyword)
    if call is None:
        return None
    value = next(k.value for k in call.keywords if k.arg == keyword)
    in_call = range(call.lineno, (call.end_lineno or call.lineno) + 1)
    return _followed(tree, lines, value, in_call, keyword, script_args)


def _followed(tree, lines, value: ast.AST, in_call: range, keyword: str, script_args):
    """Where `value`, used on the lines `in_call`, is written: back through names, attributes
    of `self`, argparse options, config entries and the operand of a scaling that names the
    setting `keyword`."""
    for _ in range(_MAX_HOPS):
        if isinstance(value, ast.Name):
            assigned = (_value_of_name(tree, value, with_defaults=True)
                        or _last_assignment(tree, value.id, value.lineno)
                        or _module_assignment(tree, value.id))  # fmt: skip
            if assigned is None:
                return None
            value = assigned
            continue
        if isinstance(value, (ast.Attribute, ast.Subscript)) and not _torch_constant(value):
            if (held := _self_attribute_value(tree, value)) is not None:
                value = held  # `lr=self.alpha` -> `self.alpha = alpha` -> `MF(R, alpha=0.25)`
                continue
            if (held := _field_of_a_built_object(tree, value)) is not None:
                value = held  # `eps=self.args.eps` -> `self.args = Arguments(eps=1e-8)`
                continue
            return _option_or_entry(tree, lines, value, script_args)
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("float", "int") and len(value.args) == 1):  # fmt: skip
            value = value.args[0]  # `float(options["learning_rate"])`
            continue
        if isinstance(value, ast.UnaryOp) and not _is_literal(value):
            value = value.operand  # `alpha=-lr`
            continue
        # `lr=learning_rate / batch_size` in the call: the rate is the operand a user edits (an
        # assignment that scales a rate, `lr = base_lr * 8`, is itself that line)
        if (isinstance(value, ast.BinOp) and value.lineno in in_call and not _is_literal(value)
                and (operand := _operand_named_like(value, keyword)) is not None):  # fmt: skip
            value = operand
            continue
        # a torch constant (`torch.float16`), a number, or an expression computed on this line
        # (`base_lr * world_size`)
        return _at(value, lines, "the call" if value.lineno in in_call else "an assignment")
    return None


def hand_update_rate(file: str, script_args=()) -> WrittenAt | None:
    """For a script that updates its parameters itself, where the rate of that update is
    written: `p.data.add_(p.grad, alpha=-lr)`, `p -= step_size * grads[i]` or
    `p.data = p.data - lr * p.grad`, followed back as `where_written` follows a keyword. None
    unless the file's updates agree on one line."""
    tree, lines = _parse(file)
    if tree is None:
        return None
    found = set()
    grads = _gradient_names(tree)
    for node in ast.walk(tree):
        rate = _rate_of_update(node, grads)
        if rate is not None:
            at = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            found.add(_followed(tree, lines, rate, at, "lr", script_args))
    return found.pop() if len(found) == 1 else None


def _rate_of_update(node: ast.AST, grads: set[str]) -> ast.AST | None:
    """The rate in a hand-written gradient step, or None when `node` is not one."""
    if isinstance(node, ast.Call) and _called_name(node) in ("add_", "sub_"):
        alpha = next((k.value for k in node.keywords if k.arg == "alpha"), None)
        if alpha is not None and any(_mentions_grad(a, grads) for a in node.args):
            return alpha
        step = next(iter(node.args), None)
        return _factor_of_grad(step, grads) if isinstance(step, ast.BinOp) else None
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub):
        return _factor_of_grad(node.value, grads)
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp)
            and isinstance(node.value.op, ast.Sub)):  # fmt: skip
        return _factor_of_grad(node.value.right, grads)
    return None


def _factor_of_grad(product: ast.AST, grads: set[str]) -> ast.AST | None:
    """`lr` of `lr * p.grad` (or `p.grad * lr`)."""
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return None
    if _mentions_grad(product.right, grads) and not _mentions_grad(product.left, grads):
        return product.left
    if _mentions_grad(product.left, grads) and not _mentions_grad(product.right, grads):
        return product.right
    return None


def _mentions_grad(node: ast.AST, grads: set[str]) -> bool:
    """`p.grad`, `grads[i]`, `grad`, or a name `torch.autograd.grad` returned: a gradient."""
    return any((isinstance(n, ast.Attribute) and n.attr.startswith("grad"))
               or (isinstance(n, ast.Name) and (n.id.startswith("grad") or n.id in grads))
               for n in ast.walk(node))  # fmt: skip


def _gradient_names(tree: ast.AST) -> set[str]:
    """The names assigned from `torch.autograd.grad(...)` (`g1, g2 = autograd.grad(...)`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and _called_name(node.value) == "grad"):  # fmt: skip
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


# The names the HF Trainer's `TrainingArguments` gives the settings of the optimizer it builds
# itself: the script never calls that optimizer's constructor, it passes these.
_FRAMEWORK_NAMES = {
    "lr": ("learning_rate",),
    "eps": ("adam_epsilon",),
    "weight_decay": ("weight_decay",),
    "betas": ("adam_beta2", "adam_beta1"),
}


def passes_a_keyword(file: str, line: int, keywords) -> bool:
    """A call spanning `line` passes one of `keywords`: the optimizer is built there, whether
    or not its value can be followed to a literal."""
    tree, _ = _parse(file)
    return tree is not None and any(_call_at(tree, line, k) is not None for k in keywords)


def framework_name(file: str, keyword: str, script_args=()) -> tuple[str, WrittenAt] | None:
    """(the framework's name for the optimizer setting `keyword`, where it is written), for an
    optimizer the framework builds itself: `TrainingArguments(learning_rate=5e3)` followed back
    to its literal as `where_written` does, or the command line that gives it
    (`--learning_rate 5e3` to an `HfArgumentParser`). None unless exactly one call in the file
    passes that name: with two (a second stage's arguments, say) the source does not say which
    one the run used."""
    tree, _ = _parse(file)
    if tree is None:
        return None
    for name in _FRAMEWORK_NAMES.get(keyword, ()):
        if _given_on_command_line((f"--{name}",), script_args):
            return name, WrittenAt(0, " ".join(script_args), "the command line")
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and any(k.arg == name for k in node.keywords)]  # fmt: skip
        if len(calls) == 1 and (written := where_written(file, calls[0].lineno, name, script_args)):
            return name, written
    return None


# What a setting's operand is called in expressions that scale it (`base_lr * world_size`).
_NAMES_OF = {
    "lr": ("lr", "learning_rate", "rate", "step_size", "alpha"),
    "eps": ("eps", "epsilon"),
    "weight_decay": ("weight_decay", "decay", "wd"),
    "momentum": ("momentum",),
}


def _operand_named_like(expression: ast.BinOp, keyword: str) -> ast.AST | None:
    """The one operand of `expression` (a name, attribute or key, at any depth of its
    arithmetic) whose name says it is the setting `keyword`; None when none or several do."""
    names = _NAMES_OF.get(keyword, (keyword,))
    operands = []
    pending: list[ast.AST] = [expression]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.BinOp):
            pending += [node.left, node.right]
        elif isinstance(node, ast.UnaryOp):
            pending.append(node.operand)
        else:
            name = node.id if isinstance(node, ast.Name) else _attribute_or_key(node)
            if name is not None and any(n in name.lower() for n in names):
                operands.append(node)
    return operands[0] if len(operands) == 1 else None


def _self_attribute_value(tree: ast.AST, value: ast.AST) -> ast.AST | None:
    """What `self.<name>` holds, read in a method: the value its class last assigns to it."""
    attribute = _self_attribute(value)
    owner = _enclosing(tree, value.lineno, ast.ClassDef) if attribute is not None else None
    if owner is None:
        return None
    held = _last_attribute_assignment(owner, attribute)
    return held if held is not value else None


def _field_of_a_built_object(tree: ast.AST, value: ast.AST) -> ast.AST | None:
    """`obj.key`, where `obj` (a name or `self.name`) holds the result of a call: the call's
    `key=` argument, else the default its class, defined in the script, gives the field
    (`key: float = 1e-8`, a dataclass's or a config class's). A keyword given to a class is the
    attribute of that name for dataclasses, namedtuples, argparse and config namespaces."""
    if not isinstance(value, ast.Attribute) or _dotted_assignment(tree, value) is not None:
        return None  # `cfg.lr = 0.5` later in the script overrides what was built
    holder = value.value
    if isinstance(holder, ast.Name):
        built = _value_of_name(tree, holder) or _module_assignment(tree, holder.id)
    else:
        built = _self_attribute_value(tree, holder) if _self_attribute(holder) else None
    if not isinstance(built, ast.Call):
        return None
    given = next((k.value for k in built.keywords if k.arg == value.attr), None)
    if given is not None:
        return given
    return _class_field_default(tree, _called_name(built), value.attr)


def _class_field_default(tree: ast.AST, class_name: str, field: str) -> ast.AST | None:
    """The default of `field: T = default` (or `field = default`) in the body of the script's
    class `class_name`."""
    owner = next((node for node in ast.walk(tree)
                  if isinstance(node, ast.ClassDef) and node.name == class_name), None)  # fmt: skip
    for statement in owner.body if owner is not None else ():
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and statement.target.id == field and statement.value is not None):  # fmt: skip
            default = statement.value  # `lr: float = field(default=1e-5, metadata=...)`
            if isinstance(default, ast.Call) and _called_name(default) == "field":
                return next((k.value for k in default.keywords if k.arg == "default"), None)
            return default
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == field):  # fmt: skip
            return statement.value
    return None


def _option_or_entry(tree, lines, value, script_args) -> WrittenAt | None:
    """`args.lr` -> its argparse default (unless the command line gave it); `config["lr"]` or
    `config.lr` -> the dict entry or keyword that holds it."""
    name = _attribute_or_key(value)
    option = _argparse_option(tree, name) if name is not None else None
    if option is not None:
        flags, node = option
        if _given_on_command_line(flags, script_args):
            return WrittenAt(0, " ".join(script_args), "the command line")
        default = next((k.value for k in node.keywords if k.arg == "default"), node)
        if (constant := _constant_behind(tree, default)) is not None:
            return _at(constant, lines, "an assignment")  # `default=LR_DEFAULT`
        return _at(default, lines, "an argparse default")
    if (assigned := _dotted_assignment(tree, value)) is not None:
        return _at(assigned, lines, "an assignment")  # `cfg.SOLVER.BASE_LR = 0.01`
    # `rates[0]`, `cfg["lr"][-1]`: an entry of a schedule, or of a config nested in another
    entry = (_dict_entry(tree, name) if name is not None else None) or _nested_entry(
        tree, _key_path(tree, value)
    )
    if entry is not None:
        return _at(entry, lines, "a config entry")
    return _config_text_entry(tree, lines, name) if name is not None else None


def _dotted_assignment(tree, value: ast.AST) -> ast.AST | None:
    """The number last assigned (lowest in the file) to the same attribute chain as `value`
    (`cfg.SOLVER.BASE_LR = 0.01` for a read of `cfg.SOLVER.BASE_LR`): a config object's value
    overridden by the script."""
    if not isinstance(value, ast.Attribute):
        return None
    chain = ast.unparse(value)
    assigned = [(t.lineno, v) for t, v in _assigned_values(tree, lambda t: isinstance(t, ast.Attribute)
                and ast.unparse(t) == chain) if _is_literal(v)]  # fmt: skip
    return max(assigned, key=lambda item: item[0])[1] if assigned else None


def _config_text_entry(tree, lines, key: str) -> WrittenAt | None:
    """`key=0.15` or `key: 0.15` on a line of a config written as text in the script (a
    darknet `.cfg`, a YAML string the script parses), when exactly one line sets it."""
    setting = re.compile(rf"^\s*{re.escape(key)}\s*[=:]\s*[-+.\d]")
    found = [node.lineno + offset for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value
             for offset, text in enumerate(node.value.split("\n")) if setting.match(text)]  # fmt: skip
    if len(found) != 1:
        return None
    line = found[0]
    return WrittenAt(line, lines[line - 1].strip() if line <= len(lines) else "", "a config entry")


def _constant_behind(tree: ast.AST, value: ast.AST) -> ast.AST | None:
    """The number a name stands for (`LR_DEFAULT = 0.1`), through names assigned from names;
    None for anything else."""
    for _ in range(_MAX_HOPS):
        if not isinstance(value, ast.Name):
            return None
        value = _last_assignment(tree, value.id, value.lineno)
        if value is not None and _is_literal(value):
            return value
    return None


def _key_path(tree: ast.AST, value: ast.AST) -> list:
    """The keys and attributes `value` reads, outermost first, through names assigned from a
    read: `lr_dict[0]` after `lr_dict = self.cfg["learning_rate"]` -> ["cfg", "learning_rate",
    0]."""
    keys: list = []
    for _ in range(_MAX_HOPS):
        while isinstance(value, (ast.Subscript, ast.Attribute)):
            if isinstance(value, ast.Attribute):
                keys.append(value.attr)
            else:
                try:  # `["lr"]`, `[0]`, `[-1]`
                    keys.append(ast.literal_eval(value.slice))
                except ValueError:
                    return []  # `rates[epoch]`: which entry is read is not in the source
            value = value.value
        if not isinstance(value, ast.Name):
            break
        value = _last_assignment(tree, value.id, value.lineno)
        if not isinstance(value, (ast.Subscript, ast.Attribute)):
            break
    return keys[::-1]


def _nested_entry(tree: ast.AST, keys: list) -> ast.AST | None:
    """The number a path of keys reaches in nested literals: ("learning_rate", 0) in
    `{"learning_rate": {0: 0.2}}` or `{"lr": [0.1, 0.01]}`. The longest tail of the path that
    names an entry wins (the head may be the attribute that holds the dict, `self.cfg`)."""
    for start in range(len(keys) - 1):
        first, rest = keys[start], keys[start + 1 :]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            for entry in _values_under(node, first):
                if (found := _descend(entry, rest)) is not None:
                    return found
    return None


def _values_under(node: ast.Dict, key) -> list[ast.AST]:
    """The values of `key: v` in one dict literal."""
    return [v for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and k.value == key]  # fmt: skip


def _descend(node: ast.AST | None, keys: list) -> ast.AST | None:
    for key in keys:
        if isinstance(node, ast.Dict):
            node = next(iter(_values_under(node, key)), None)
        elif (isinstance(node, (ast.List, ast.Tuple)) and isinstance(key, int)
              and -len(node.elts) <= key < len(node.elts)):  # fmt: skip
            node = node.elts[key]
        else:
            return None
    return node if node is not None and _is_literal(node) else None


# Names a gradient-clipping setting goes by: `grad_clip`, `clip_grad_norm`, `gradient_clip_val`
# (Lightning), `max_grad_norm` (the HF Trainer, accelerate scripts), `clip_norm`.
_CLIP_NAMES = ("max_grad_norm", "clipnorm", "grad_norm_clip")
# A bare `clip` is gradient clipping only where the script clips gradients itself: PPO scripts
# call their ratio clip `clip` too.
_BARE_CLIP = "clip"
_CLIPS_GRADIENTS = ("clip_grad_norm", "clip_grad_value", "clip_gradients")


def clip_setting(file: str, script_args=()) -> WrittenAt | None:
    """Where the script sets its gradient clipping (`grad_clip=None` in a config, an argparse
    `--clip` default, `max_grad_norm=0` in a call, the `if` that skips its clipping call in
    this run), or None when it has no such setting: the
    line a user edits to clip, or to clip tighter."""
    tree, lines = _parse(file)
    if tree is None:
        return None
    if skipped := _clip_skipped_in_this_run(tree, lines, script_args):
        return skipped
    names_a_clip = _clip_names(lines)
    found = _first_setting(tree, lines, script_args, lambda name, value: names_a_clip(name))
    return found or _commented_out_clip(lines)


_LIGHTNING = ("lightning", "pytorch_lightning")


def lightning_trainer(file: str) -> WrittenAt | None:
    """The one `Trainer(...)` call of a file that imports Lightning: where Lightning's gradient
    clipping is set (`gradient_clip_val=`), for a script that never sets it. None for another
    file, or for two such calls (which one trained is not in the source)."""
    tree, lines = _parse(file)
    if tree is None or not any(_imports(node, _LIGHTNING) for node in ast.walk(tree)):
        return None
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _called_name(node) == "Trainer"]  # fmt: skip
    return _at(calls[0], lines, "the Lightning Trainer") if len(calls) == 1 else None


def _imports(node: ast.AST, packages: tuple[str, ...]) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] in packages for alias in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in packages


def clip_switched_off(file: str, script_args=()) -> WrittenAt | None:
    """The script's gradient-clipping setting, when it switches clipping off: `grad_clip=None`
    in a config, `"clip_gradient": False`, an argparse `--clip` defaulting to 0 (and not given
    on the command line), a clipping call under a condition on an option that is false in this
    run (`if args.net == "vgg16":`), or a clipping call commented out in a script that has no
    other clip.
    None when the script clips, has no such setting, or sets it at run time."""
    tree, lines = _parse(file)
    if tree is None:
        return None
    if skipped := _clip_skipped_in_this_run(tree, lines, script_args):
        return skipped
    names_a_clip = _clip_names(lines)
    settings = sorted(_settings(tree), key=lambda setting: setting[0].lineno)
    if not any(names_a_clip(name) for _, name, _ in settings):
        return _commented_out_clip(lines)
    for _, name, value in settings:
        if not names_a_clip(name) or name.startswith(_CLIPS_GRADIENTS):
            continue
        if value is None:  # an argparse option: its default, unless the command line sets it
            option = _argparse_option(tree, _dest(name))
            if option is None or _given_on_command_line(option[0], script_args):
                continue
            value = next((k.value for k in option[1].keywords if k.arg == "default"), None)
            if value is None:
                return _at(option[1], lines, "an argparse default")  # no default: None
        if isinstance(value, ast.Constant) and value.value in (None, False, 0):
            return _at(value, lines, name)
    return None


# The options that choose a framework's precision: Lightning's and Fabric's `precision`,
# accelerate's `mixed_precision`, the HF Trainer's `fp16` / `bf16`.
_PRECISION_NAMES = ("precision", "mixed_precision")
_PRECISION_FLAGS = ("fp16", "bf16")


def precision_setting(file: str, script_args=()) -> WrittenAt | None:
    """Where the script chooses a reduced precision through a framework option
    (`precision="16-true"`, an argparse `--precision` default, `mixed_precision="fp16"`,
    `fp16=True`), or None: the line a user edits to change the precision."""
    tree, lines = _parse(file)
    if tree is None:
        return None

    def chooses(name, value) -> bool:
        return _chooses_reduced_precision(tree, name, value, script_args)

    return _first_setting(tree, lines, script_args, chooses)


def _chooses_reduced_precision(tree, name: str, value, script_args) -> bool:
    name = _dest(name.lower())
    if name not in _PRECISION_NAMES + _PRECISION_FLAGS:
        return False
    if value is None:  # an argparse option: given on the command line, or its default
        option = _argparse_option(tree, name)
        if option is None:
            return False
        if _given_on_command_line(option[0], script_args):
            return True
        value = next((k.value for k in option[1].keywords if k.arg == "default"), None)
    if not isinstance(value, ast.Constant):
        return False
    if name in _PRECISION_FLAGS:
        return value.value is True
    return value.value == 16 or (isinstance(value.value, str) and "16" in value.value)


def _first_setting(tree, lines, script_args, matches) -> WrittenAt | None:
    """The first place the script names a setting `matches(name, value node)` accepts (an
    argparse option's value node is None), or that the command line gives that option."""
    found = [(node.lineno, name, value) for node, name, value in _settings(tree)
             if matches(name, value)]  # fmt: skip
    if not found:
        return None
    line, name, value = min(found, key=lambda item: item[0])
    if value is None:  # an argparse option
        option = _argparse_option(tree, _dest(name))
        if option is not None and _given_on_command_line(option[0], script_args):
            return WrittenAt(0, " ".join(script_args), "the command line")
    return WrittenAt(line, lines[line - 1].strip() if 0 < line <= len(lines) else "", name)


# A commented-out call of a function whose name starts so is a gradient clip the script has
# switched off: torch's `clip_grad_norm_` / `clip_grad_value_`, and a script's own
# `clip_gradient(model, 10.)`.
_CLIP_CALL_PREFIX = "clip_grad"


def _commented_out_clip(lines: tuple[str, ...]) -> WrittenAt | None:
    """The first comment that is a gradient-clipping call (`# clip_grad_norm_(m.parameters(),
    1.0)`): clipping the script's author wrote and switched off, un-commented to switch it on.
    Comments only, read by the tokenizer: a docstring's example is not a switched-off clip."""
    for number, comment in _comments(lines):
        try:
            statement = ast.parse(comment.lstrip("#").strip()).body
        except SyntaxError:
            continue
        if (len(statement) == 1 and isinstance(statement[0], ast.Expr)
                and isinstance(call := statement[0].value, ast.Call)
                and _called_name(call).startswith(_CLIP_CALL_PREFIX)):  # fmt: skip
            return WrittenAt(number, lines[number - 1].strip(), "a commented-out clipping call")
    return None


SKIPPED_CLIP = "a condition false in this run"


def _clip_skipped_in_this_run(tree, lines, script_args) -> WrittenAt | None:
    """The `if` in front of a clipping call whose test is false in this run: it compares an
    argparse option, at its default or as the command line gives it, with a constant (`if
    args.net == "vgg16":` run with --net res101), or tests the option alone. The script clips
    in other configurations only; the `if` is the line to change."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.If)
                and any(_clipping_calls(statement) for statement in node.body)
                and _false_in_this_run(node.test, tree, script_args) is True):  # fmt: skip
            return WrittenAt(node.lineno, lines[node.lineno - 1].strip(), SKIPPED_CLIP)
    return None


def _clipping_calls(node: ast.AST) -> list[ast.Call]:
    """The gradient-clipping calls in `node` (`clip_grad_norm_`, a script's `clip_gradient`)."""
    return [call for call in ast.walk(node) if isinstance(call, ast.Call)
            and _called_name(call).startswith(_CLIP_CALL_PREFIX)]  # fmt: skip


def _false_in_this_run(test: ast.AST, tree, script_args) -> bool | None:
    """Whether `test` is false with the script's options as this run has them; None when it
    is not a test on one option that can be read from the source and the command line."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _false_in_this_run(test.operand, tree, script_args)
        return None if inner is None else not inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        value = _option_in_this_run(test.left, tree, script_args)
        other = test.comparators[0]
        try:
            constant = ast.literal_eval(other)
        except ValueError:
            return None
        if value is _UNKNOWN:
            return None
        outcomes = {
            ast.Eq: lambda: value == constant,
            ast.NotEq: lambda: value != constant,
            ast.In: lambda: value in constant,
            ast.NotIn: lambda: value not in constant,
        }
        outcome = outcomes.get(type(test.ops[0]))
        try:
            return None if outcome is None else not outcome()
        except TypeError:
            return None
    value = _option_in_this_run(test, tree, script_args)
    return None if value is _UNKNOWN else not value


_UNKNOWN = object()


def _option_in_this_run(node: ast.AST, tree, script_args):
    """The value of `args.name` (an argparse option): the command line's, converted as its
    `type=` says, or its default; `_UNKNOWN` for anything else."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        return _UNKNOWN
    option = _argparse_option(tree, node.attr)
    if option is None:
        return _UNKNOWN
    flags, call = option
    keywords = {k.arg: k.value for k in call.keywords}
    action = keywords.get("action")
    if isinstance(action, ast.Constant) and action.value in ("store_true", "store_false"):
        switched = _given_on_command_line(flags, script_args)
        return switched == (action.value == "store_true")
    given = _command_line_value(flags, script_args)
    if given is not None:
        kind = getattr(keywords.get("type"), "id", "str")
        converters = {"str": str, "int": int, "float": float}
        if kind not in converters:
            return _UNKNOWN
        try:
            return converters[kind](given)
        except ValueError:
            return _UNKNOWN
    try:
        return ast.literal_eval(keywords["default"]) if "default" in keywords else None
    except ValueError:
        return _UNKNOWN


def _command_line_value(flags, script_args) -> str | None:
    """The value the command line gives one of `flags` (`--net res101`, `--net=res101`)."""
    args = list(script_args)
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in flags:
            if equals:
                return value
            return args[index + 1] if index + 1 < len(args) else None
    return None


def _comments(lines: tuple[str, ...]):
    """(line number, text) of each comment in the source."""
    readline = iter(line + "\n" for line in lines).__next__
    try:
        for token in tokenize.generate_tokens(readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
    except (tokenize.TokenError, SyntaxError):
        return


def clipping_call(file: str) -> WrittenAt | None:
    """The script's one gradient-clipping call (`clip_grad_norm_(model.parameters(),
    args.clip)`), or None for none or several: where a clip set on the command line acts."""
    tree, lines = _parse(file)
    if tree is None:
        return None
    calls = _clipping_calls(tree)
    return _at(calls[0], lines, "the clipping call") if len(calls) == 1 else None


def clipped_argument(file: str, call_line: int) -> WrittenAt | None:
    """Where the tensors given to the clipping call at `call_line` were made, when the call is
    given a name (`clip_grad_norm_(params_to_clip, 1.0)` -> `params_to_clip = ...`), or None."""
    tree, lines = _parse(file)
    if tree is None:
        return None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and _spans(node, call_line)
             and _called_name(node).startswith(_CLIPS_GRADIENTS)]  # fmt: skip
    given = [
        *(call.args[:1] for call in calls),
        *([k.value] for call in calls for k in call.keywords if k.arg == "parameters"),
    ]
    name = next((arg[0] for arg in given if arg and isinstance(arg[0], ast.Name)), None)
    if name is None:
        return None
    value = _last_assignment(tree, name.id, name.lineno)
    return _at(value, lines, "an assignment") if value is not None else None


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _dest(flag: str) -> str:
    """The attribute argparse stores an option under: `--max-grad-norm` -> `max_grad_norm`."""
    return flag.lstrip("-").replace("-", "_")


def _clip_names(lines: tuple[str, ...]) -> Callable[[str], bool]:
    """Which setting names are a gradient clip's in this script: a bare `clip` only where the
    script calls a clipping function (else it may be PPO's ratio clip)."""
    clips_itself = any(word in line for line in lines for word in _CLIPS_GRADIENTS)
    return lambda name: _is_clip_name(name, clips_itself)


def _is_clip_name(name: str, clips_itself: bool) -> bool:
    name = _dest(name.lower())
    if name == _BARE_CLIP:
        return clips_itself
    return name in _CLIP_NAMES or ("clip" in name and ("grad" in name or "norm" in name))


def _settings(tree: ast.AST):
    """(node, name, value node) of every place a script names a setting: argparse options (value
    None), dict entries, keyword arguments, and assignments to a name or an attribute."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = _called_name(node)
            if called == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        yield node, arg.value, None
                continue
            if called.startswith(_CLIPS_GRADIENTS):  # the clipping call is a setting too
                yield node, called, node
            for keyword in node.keywords:
                if keyword.arg:
                    yield keyword.value, keyword.arg, keyword.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield value, key.value, value
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in _targets(node):
                name = target.id if isinstance(target, ast.Name) else _attribute_or_key(target)
                if name:
                    yield node, name, node.value


@functools.lru_cache(maxsize=8)
def _parse(file: str) -> tuple[ast.AST | None, tuple[str, ...]]:
    try:
        with open(file, encoding="utf-8") as handle:
            text = handle.read()
        return ast.parse(text), tuple(text.splitlines())
    except (OSError, SyntaxError, ValueError):
        return None, ()


def _call_at(tree: ast.AST, line: int, keyword: str) -> ast.Call | None:
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and _spans(node, line) and any(k.arg == keyword for k in node.keywords)]  # fmt: skip
    return min(calls, key=lambda c: (c.end_lineno or c.lineno) - c.lineno, default=None)


def _is_literal(node: ast.AST) -> bool:
    """A number as written, or arithmetic on numbers (`1e-3 * 8`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) and _is_literal(node.right)
    return False


def _torch_constant(node: ast.AST) -> bool:
    """`torch.float16`, `torch.bfloat16`: a value written as it is, not a setting read."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )


def _last_assignment(tree: ast.AST, name: str, before: int) -> ast.AST | None:
    """The value of the last `name = ...` above line `before` (any scope: scripts rarely
    shadow a learning rate's name)."""
    assignments = [node for node in ast.walk(tree)
                   if node.__class__ in (ast.Assign, ast.AnnAssign)
                   and getattr(node, "value", None) is not None and node.lineno < before
                   and any(isinstance(t, ast.Name) and t.id == name for t in _targets(node))]  # fmt: skip
    last = max(assignments, key=lambda node: node.lineno, default=None)
    return last.value if last is not None else None


def _module_assignment(tree: ast.AST, name: str) -> ast.AST | None:
    """The value of the last `name = ...` of the module's own code (not of a function), wherever
    it lies: a global a function reads (`lr = args.lr` below `def train()`)."""
    assigned = [(t.lineno, v) for node in getattr(tree, "body", ()) if not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                for t, v in _assigned_values(node, lambda t: isinstance(t, ast.Name) and t.id == name)]  # fmt: skip
    return max(assigned, key=lambda item: item[0])[1] if assigned else None


def _targets(node: ast.AST) -> list[ast.AST]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _attribute_or_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return None


def _argparse_option(tree: ast.AST, dest: str) -> tuple[set[str], ast.Call] | None:
    """The `add_argument` call whose destination is `dest`, with its option strings."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):  # fmt: skip
            continue
        given = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str)]  # fmt: skip
        explicit = next((k.value.value for k in node.keywords if k.arg == "dest"
                         and isinstance(k.value, ast.Constant)), None)  # fmt: skip
        if dest == (explicit or _argparse_dest(given)):
            return set(given), node
    return None


def _argparse_dest(flags: list[str]) -> str:
    """argparse's own rule: the first long option (`--lr` of `"--lr", "--learning-rate"`),
    else the first option string, dashes stripped."""
    first = next((f for f in flags if f.startswith("--")), flags[0] if flags else "")
    return _dest(first)


# Calls that build a config from keywords: `dict(lr=0.1)`, `SimpleNamespace(BASE_LR=0.02)`.
_CONFIG_CALLS = ("dict", "SimpleNamespace", "Namespace", "CfgNode", "EasyDict", "edict",
                 "ConfigDict", "AttrDict")  # fmt: skip


def _dict_entry(tree: ast.AST, key: str) -> ast.AST | None:
    """The value of `"key": v` in a dict literal or of `key=v` in a call that builds a config
    (`dict(...)`, `SimpleNamespace(...)`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for v in _values_under(node, key):
                if _is_literal(v):
                    return v
        if isinstance(node, ast.Call) and _called_name(node) in _CONFIG_CALLS:
            for k in node.keywords:
                if k.arg == key and _is_literal(k.value):
                    return k.value
    return None


def _at(node: ast.AST, lines: tuple[str, ...], how: str) -> WrittenAt:
    line = node.lineno
    return WrittenAt(line, lines[line - 1].strip() if 0 < line <= len(lines) else "", how)


# ---- where a container's values were made --------------------------------------------------
# Calls that bring values into torch unchanged: followed to their argument, as slicing is.
_ENTERS_TORCH = ("from_numpy", "as_tensor", "tensor", "Tensor", "FloatTensor", "LongTensor")
# Calls that make a weight of their first argument's values (`torch.Tensor(n)` is not one: given
# a number it is a size, and the memory is left as it was).
_WRAPS_VALUES = ("Parameter", "from_numpy", "as_tensor", "tensor")
# Methods that return the same values in another container or dtype.
_SAME_VALUES = ("float", "double", "clone", "copy", "numpy", "tolist")
_MAX_CONTAINER_HOPS = 8


def container_reads(file: str, line: int) -> tuple[str, ...]:
    """The `name`s of the `self.<name>[...]` the statement at `line` only reads (`row =
    self.rows[i]`, `return self.images[i], self.labels[i]`): nothing computed from them on that
    line, so what they hold is what the line produces."""
    tree, _ = _parse(file)
    statement = _statement_at(tree, line) if tree is not None else None
    if statement is None or not isinstance(statement, (ast.Assign, ast.Return)):
        return ()
    value = statement.value
    parts = (value.values if isinstance(value, ast.Dict)
             else value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value])  # fmt: skip
    names = [_self_attribute(_unwrapped(part)) for part in parts if part is not None]
    return tuple(names) if names and all(names) else ()


def container_origin(file: str, line: int, attribute: str) -> WrittenAt | None:
    """Where the values a Dataset serves from `self.<attribute>` (read at `line`) were made:
    from the `self.<attribute> = ...` of its class back through names, slices, tensor
    conversions, the arguments its constructor was called with and the `return` of the script's
    own functions, to the first expression that computes them (a loading or preprocessing call,
    a conversion). None when the trail leaves the file."""
    tree, lines = _parse(file)
    owner = _enclosing(tree, line, ast.ClassDef) if tree is not None else None
    if owner is None:
        return None
    return _where_made(tree, lines, _last_attribute_assignment(owner, attribute), _ENTERS_TORCH)


def _where_made(tree, lines, value: ast.AST | None, wrappers) -> WrittenAt | None:
    """The first expression that computes `value`'s values, back through names, the calls of
    `wrappers` and slices that pass them on unchanged, the arguments of the script's own
    functions and their `return`; None when the trail leaves the file."""
    for _ in range(_MAX_CONTAINER_HOPS):
        if value is None:
            return None
        value = _unwrapped(value, wrappers)
        if isinstance(value, ast.Call) and (returned := _returned_by(tree, value)) is not None:
            value = returned  # `y = load_series(path)`: the line inside it that made `y`
            continue
        if not isinstance(value, ast.Name):
            return _at(value, lines, "an assignment")
        value = _value_of_name(tree, value)
    return None


def written_value_origin(file: str, line: int) -> WrittenAt | None:
    """Where the values that the line `line` writes into a weight were computed:
    `layer.bias = nn.Parameter(bias)` or `w.data.copy_(prior)` -> the line that made `bias`
    (`bias = torch.log(pos / neg)`), back through names, conversions and the arguments of the
    script's own functions. None when the line computes them itself (`torch.empty(n)`), or the
    trail leaves the file."""
    tree, lines = _parse(file)
    value = _value_written_at(tree, line) if tree is not None else None
    made = _where_made(tree, lines, value, _WRAPS_VALUES)
    return made if made is not None and made.line != line else None


def _value_written_at(tree: ast.AST, line: int) -> ast.AST | None:
    """The value a statement at `line` writes into an existing object: the right side of
    `obj.attr = value` or `obj[i] = value`, or the argument of `x.copy_(value)`."""
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) != line:
            continue
        if isinstance(node, ast.Assign) and any(
            isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets
        ):
            return node.value
        if isinstance(node, ast.Call) and _called_name(node) == "copy_" and node.args:
            return node.args[0]
    return None


def _returned_by(tree: ast.AST, call: ast.Call) -> ast.AST | None:
    """What a call of one of the script's own module-level functions returns, when the function
    has exactly one `return` with a value: the expression to follow further."""
    if not isinstance(call.func, ast.Name):
        return None
    function = next((node for node in getattr(tree, "body", ())
                     if isinstance(node, ast.FunctionDef) and node.name == call.func.id), None)  # fmt: skip
    if function is None:
        return None
    nodes = list(_own_statements(function))
    returns = [node for node in nodes if isinstance(node, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    value = returns[0].value
    if isinstance(value, ast.Name) and any(_mutates(node, value.id) for node in nodes):
        # `rows = []` then `rows.append(...)`, `table[i] = nan`: its last assignment is not
        # what it holds, and the call that builds it is the line to show
        return None
    return value


def _mutates(node: ast.AST, name: str) -> bool:
    """`node` changes what `name` holds in place: `name[i] = ...`, `name.x = ...`,
    `name += ...`, or a method call on it as a statement (`name.append(row)`)."""
    return any(_based_on(target, name) for target in _changed_targets(node))


def _based_on(node: ast.AST, name: str) -> bool:
    """`name`, or a subscript or attribute of it (`name[i]`, `name.x[j]`)."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == name


def _own_statements(function: ast.FunctionDef):
    """The nodes of `function`'s body, not those of functions or classes defined inside it."""
    pending = list(function.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


# Calls that convert a tensor to a dtype the script names.
_CASTS = ("to", "half", "bfloat16", "type")


def casts_explicitly(file: str, line: int) -> bool:
    """Whether the statement at `line` converts a tensor's dtype itself (`.to(x.dtype)`,
    `.half()`), as opposed to a conversion autocast inserts in front of an op."""
    tree, _ = _parse(file)
    statement = _statement_at(tree, line) if tree is not None else None
    return statement is not None and any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in _CASTS
        for node in ast.walk(statement)
    )  # fmt: skip


def enclosing_class(file: str, line: int) -> str | None:
    """The name of the class whose body holds `line`."""
    tree, _ = _parse(file)
    owner = _enclosing(tree, line, ast.ClassDef) if tree is not None else None
    return owner.name if owner is not None else None


def _statement_at(tree: ast.AST, line: int) -> ast.stmt | None:
    """The innermost statement on `line` that is not a definition."""
    return _enclosing(tree, line, ast.stmt,
                      but_not=(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))  # fmt: skip


def _self_attribute(node: ast.AST) -> str | None:
    """`name` of `self.name`, else None."""
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self"):  # fmt: skip
        return node.attr
    return None


def _enclosing(tree: ast.AST, line: int, kind, but_not=()):
    """The innermost node of `kind` (and not of `but_not`) whose lines hold `line`."""
    found = [node for node in ast.walk(tree) if isinstance(node, kind)
             and not isinstance(node, but_not) and _spans(node, line)]  # fmt: skip
    return max(found, key=lambda node: node.lineno, default=None)


def _spans(node: ast.AST, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def _given_on_command_line(flags, script_args) -> bool:
    """An option among `flags` is in the script's arguments (`--lr 0.1` or `--lr=0.1`)."""
    return any(arg.split("=")[0] in flags for arg in script_args)


def _assigned_values(scope: ast.AST, matches):
    """(target, value) of each assignment in `scope` whose target `matches`, tuple assignments
    (`a, b = x, y`) paired element by element."""
    for node in ast.walk(scope):
        if node.__class__ not in (ast.Assign, ast.AnnAssign) or node.value is None:
            continue
        for target in _targets(node):
            if matches(target):
                yield target, node.value
            elif isinstance(target, ast.Tuple):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else None
                for i, element in enumerate(target.elts):
                    if matches(element):
                        yield element, values[i] if values and i < len(values) else node.value


def _last_attribute_assignment(owner: ast.ClassDef, attribute: str) -> ast.AST | None:
    """The value last assigned to `self.<attribute>` in the class, an empty container aside."""

    def is_it(target) -> bool:
        return (isinstance(target, ast.Attribute) and target.attr == attribute
                and isinstance(target.value, ast.Name) and target.value.id == "self")  # fmt: skip

    values = [(t.lineno, v) for t, v in _assigned_values(owner, is_it)
              if not (isinstance(v, (ast.List, ast.Dict, ast.Tuple)) and not _items(v))]  # fmt: skip
    return max(values, key=lambda item: item[0])[1] if values else None


def _items(node) -> list:
    return node.keys if isinstance(node, ast.Dict) else node.elts


def _unwrapped(value: ast.AST, wrappers=_ENTERS_TORCH) -> ast.AST:
    """`torch.from_numpy(x)`, `x[:split]`, `x.float()` -> `x`: the same values."""
    while True:
        if isinstance(value, ast.Subscript):
            value = value.value
        elif (isinstance(value, ast.Call) and value.args
              and _called_name(value) in wrappers):  # fmt: skip
            value = value.args[0]
        elif (isinstance(value, ast.Call) and not value.args and isinstance(value.func, ast.Attribute)
              and value.func.attr in _SAME_VALUES):  # fmt: skip
            value = value.func.value
        else:
            return value


def _value_of_name(tree: ast.AST, name: ast.Name, with_defaults: bool = False) -> ast.AST | None:
    """The value `name` holds where it is used: its last assignment above in the same function,
    or, for a parameter of that function, the argument the first call of it passes (a Dataset's
    `__init__` is called as its class), or with `with_defaults` the parameter's default when no
    call passes it."""
    function = _enclosing(tree, name.lineno, (ast.FunctionDef, ast.AsyncFunctionDef))
    scope = function if function is not None else tree
    assigned = [(t.lineno, v) for t, v in _assigned_values(scope, lambda t: isinstance(t, ast.Name)
                and t.id == name.id) if t.lineno < name.lineno]  # fmt: skip
    if assigned:
        return max(assigned, key=lambda item: item[0])[1]
    if function is None:
        return None
    passed = _argument_passed(tree, function, name.id)
    return passed if passed is not None or not with_defaults else _default_of(function, name.id)


def _default_of(function: ast.FunctionDef, parameter: str) -> ast.AST | None:
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(arguments.defaults):]],
                        arguments.defaults, strict=True))  # fmt: skip
    defaults.update((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults,
                                                strict=True) if d is not None)  # fmt: skip
    return defaults.get(parameter)


def _argument_passed(tree: ast.AST, function: ast.FunctionDef, parameter: str) -> ast.AST | None:
    names = [a.arg for a in function.args.args]
    if parameter not in names:
        return None
    callee, position = function.name, names.index(parameter)
    if callee == "__init__":
        owner = _enclosing(tree, function.lineno, ast.ClassDef)
        callee, position = (owner.name if owner else callee), position - 1  # `self` not passed
    calls = sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and _called_name(node) == callee), key=lambda c: c.lineno)  # fmt: skip
    for call in calls:
        passed = next((k.value for k in call.keywords if k.arg == parameter), None)
        if passed is None and 0 <= position < len(call.args):
            passed = call.args[position]
        if passed is not None:
            return passed
    return None


# ---- what one line reads and changes, for tracing values back through a run ---------------
@dataclass(frozen=True)
class LineDataflow:
    start: int  # the first line of the statement
    reads: frozenset[str]  # names, and `self.<attr>` attributes, the statement reads
    changes: frozenset[str]  # names (and `self.<attr>`) it changes in place: `x[i] = v`, `x.append`
    # the objects it writes elements of, as dotted paths: `x` of `x[mask] = 0`, `ds.audio` of
    # `ds.audio[ds.audio != ds.audio] = 0`
    written: tuple[tuple[str, ...], ...] = ()


@functools.lru_cache(maxsize=4096)
def line_dataflow(file: str, line: int) -> LineDataflow | None:
    """What the statement at `line` reads and changes in place; of a compound statement (`for`,
    `if`, `with`, `while`) its header only, not its body. None when the file does not parse."""
    tree = _parsed(file)
    statement = _statement_at(tree, line) if tree is not None else None
    if statement is None:
        return None
    header = _header_of(statement)
    reads = {_read_name(node) for part in header for node in ast.walk(part)} - {None}
    changes = {_base_name(target) for target in _changed_targets(statement)} - {None}
    written = {_dotted(target.value) for target in _changed_targets(statement)
               if isinstance(target, ast.Subscript)} - {None}  # fmt: skip
    return LineDataflow(statement.lineno, frozenset(reads), frozenset(changes), tuple(written))


def _dotted(node: ast.AST) -> tuple[str, ...] | None:
    """("ds", "audio") of `ds.audio`, ("x",) of `x`; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, *reversed(parts)) if isinstance(node, ast.Name) else None


_NONFINITE_NAMES = ("nan", "NaN", "NAN", "inf", "Inf", "infty", "Infinity", "PINF", "NINF")


def writes_nonfinite_constant(file: str, line: int) -> bool:
    """The statement at `line` writes NaN/Inf on purpose: `np.nan`, `math.inf`, `float("nan")`
    (`x[mask] = np.nan`, `np.full(n, np.nan)`), the way missing values are marked."""
    tree = _parsed(file)
    statement = _statement_at(tree, line) if tree is not None else None
    return statement is not None and any(_nonfinite_constant(node) for node in ast.walk(statement))


def _nonfinite_constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in _NONFINITE_NAMES
    if isinstance(node, ast.Name):
        return node.id in _NONFINITE_NAMES
    if isinstance(node, ast.Call) and _called_name(node) == "float" and node.args:
        text = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
        return isinstance(text, str) and text.strip().lstrip("+-").lower() in (
            "nan",
            "inf",
            "infinity",
        )
    return False


@functools.lru_cache(maxsize=16)
def _parsed(file: str) -> ast.AST | None:
    return _parse(file)[0]


def _header_of(statement: ast.stmt) -> list[ast.AST]:
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        return [statement.iter]
    if isinstance(statement, (ast.While, ast.If)):
        return [statement.test]
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        return [item.context_expr for item in statement.items]
    if isinstance(statement, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    return [statement]


def _read_name(node: ast.AST) -> str | None:
    """`x` of a Name read, `self.x` of an attribute of `self` read."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        return f"self.{node.attr}" if _self_attribute(node) else None
    return None


def _changed_targets(statement: ast.AST) -> list[ast.AST]:
    """What a statement changes in place (or rebinds, for `x += ...`): the target of an
    augmented assignment, the subscript and attribute targets of an assignment, the object a
    method is called on in an expression statement."""
    if isinstance(statement, ast.AugAssign):
        return [statement.target]
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return [target for target in targets if isinstance(target, (ast.Subscript, ast.Attribute))]
    if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Attribute)):  # fmt: skip
        return [statement.value.func.value]
    return []


def _base_name(node: ast.AST) -> str | None:
    """`x` of `x[i]` or `x.y[j]`; `self.x` of `self.x[i]`."""
    while isinstance(node, (ast.Subscript, ast.Attribute)) and not _self_attribute(node):
        node = node.value
    if _self_attribute(node):
        return f"self.{node.attr}"
    return node.id if isinstance(node, ast.Name) else None
