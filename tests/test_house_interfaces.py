"""House rules on the package's interfaces, read from its source (tests/test_house.py's walker):

    python -m pytest tests/test_house_interfaces.py -q

- the package changes no global torch setting (a command's thread count is scoped to it);
- one training loop: one `optimizer.step()`, and one function that runs steps in a loop;
- no function of ours takes more than six parameters (a stated few whose interface is torch's,
  transformers' or lm_eval's);
- EVA's ablation names are declared once, and the evaluator's command-line preamble is written once.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_house import ROOT, benchmark_scripts, modules

# ---------------------------------------------------------------- global torch settings

TORCH_SETTERS = {"set_default_dtype", "set_default_device", "set_default_tensor_type", "set_flush_denormal",
                 "set_float32_matmul_precision", "use_deterministic_algorithms", "set_num_threads",
                 "set_num_interop_threads", "set_printoptions", "set_detect_anomaly", "set_anomaly_enabled",
                 "manual_seed_all_devices", "set_warn_always"}
"""Calls that change a setting of the whole process (torch.* or torch.<module>.*)."""
SCOPED = {("config_toolkit/machine.py", "torch_threads")}
"""Where a setter may run: the context manager that puts the setting back when the block ends."""


def _rooted_at_torch(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "torch"


def torch_globals(path: Path, rel: str) -> list[str]:
    """Assignments to an attribute under `torch.` (torch._dynamo.config.x = ..., torch.backends...allow_tf32 = ...)
    and calls of a process-wide setter, outside the scoped helpers."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            targets = []
            if isinstance(child, ast.Assign):
                targets = child.targets
            elif isinstance(child, (ast.AugAssign, ast.AnnAssign)):
                targets = [child.target]
            if any(isinstance(t, ast.Attribute) and _rooted_at_torch(t) for t in targets):
                found.append(f"{rel}:{child.lineno} assigns {ast.unparse(targets[0])}")
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr in TORCH_SETTERS
                    and _rooted_at_torch(child.func) and (rel, function) not in SCOPED):
                found.append(f"{rel}:{child.lineno} calls {ast.unparse(child.func)}")
            visit(child, name)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_torch_settings_checker_sees_each_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import torch\ntorch._dynamo.config.recompile_limit = 64\ntorch.backends.cuda.matmul.allow_tf32 = True\n"
                    "def f():\n    torch.set_num_threads(2)\n    torch.set_flush_denormal(True)\n"
                    "    with torch._dynamo.config.patch(recompile_limit=64):\n        pass\n    x = torch.zeros(1)\n")
    assert len(torch_globals(path, "m.py")) == 4


def test_no_module_changes_a_global_torch_setting():
    """A setting changed for the whole process leaks into every caller (a test, a notebook, the next
    command in the same process): the package scopes what it needs to the call (flex.py's recompile limit
    through `torch._dynamo.config.patch`, a command's --threads through `machine.torch_threads`)."""
    found = []
    for path in modules().values():
        found += torch_globals(path, path.relative_to(ROOT).as_posix())
    assert found == []


# ---------------------------------------------------------------- one training loop

def _calls(node: ast.AST):
    """The calls under `node`, not descending into nested function definitions."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.Call):
            yield child
        yield from _calls(child)


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _functions(paths: dict[str, Path]):
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{name}.{node.name}", node


def optimizer_updates(paths: dict[str, Path]) -> list[str]:
    """Functions that call `<something>.step()` without arguments: an optimizer's update."""
    return sorted({where for where, fn in _functions(paths) for call in _calls(fn)
                   if isinstance(call.func, ast.Attribute) and call.func.attr == "step" and not call.args
                   and not call.keywords})


def stepping_loops(paths: dict[str, Path]) -> list[str]:
    """Functions with a loop (for, while, a comprehension) that takes optimizer steps: a call of `finish_step`,
    of a step that ends in it (a function that calls it: `train_step`, attention transfer's, MetaICL's), or
    a call in the `Step` contract (`x.step(model, optimizer, batches, runtime, ...)`)."""
    functions = list(_functions(paths))
    steppers = {"finish_step"} | {where.rsplit(".", 1)[1] for where, fn in functions
                                  if any(_name(c) == "finish_step" for c in _calls(fn))}
    loops = (ast.For, ast.While, ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)
    found = set()
    for where, fn in functions:
        for node in ast.walk(fn):
            if isinstance(node, loops) and any(
                    _name(c) in steppers or (_name(c) == "step" and len(c.args) >= 4) for c in _calls(node)):
                found.add(where)
    return sorted(found)


def test_the_loop_checker_sees_each_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def finish_step(o):\n    o.step()\n\ndef my_step(o):\n    return finish_step(o)\n\n"
                    "def a(o):\n    for _ in range(3):\n        my_step(o)\n\n"
                    "def b(s, m, o, d, r):\n    while True:\n        s.step(m, o, d, r, 1)\n\n"
                    "def c(o):\n    return [my_step(o) for _ in range(2)]\n\n"
                    "def d(o):\n    my_step(o)\n\ndef e(opt):\n    for _ in range(2):\n        opt.step()\n")
    assert stepping_loops({"m": path}) == ["m.a", "m.b", "m.c"]
    assert optimizer_updates({"m": path}) == ["m.e", "m.finish_step"]


def test_one_training_loop():
    """Every trainer (pretraining, MSIT, uptraining, the in-process runs, MetaICL, the recall study, the
    benchmarks) runs its steps in `train.loop.run_steps`, and every step ends in its `finish_step`: a fix
    to the loop or the update (the clip, the non-finite check, the LR) reaches all of them."""
    everything = {**modules(), **benchmark_scripts()}
    assert optimizer_updates(everything) == ["evalm.train.loop.finish_step"]
    assert stepping_loops(everything) == ["evalm.train.loop.run_steps"]


# ---------------------------------------------------------------- short parameter lists

MAX_PARAMETERS = 6
NOT_OURS = {
    "evalm.hf_evalm.forward": "transformers' PreTrainedModel.forward: the generation loop passes these by name",
    "evalm.whole_sequence.forward": "torch.autograd.Function.forward: each tensor a positional input, or autograd "
                                    "does not track it",
    "evalm.hf_attention.eva_attention": "transformers' attention-function interface (ALL_ATTENTION_FUNCTIONS)",
    "evalm.train.attention_transfer.transfer_attention": "transformers' attention-function interface",
    "evalm.train.attention_probe.probe_attention": "transformers' attention-function interface",
    "evalm.cache.__init__": "the state a generation carries, field by field; a plain class and not a frozen "
                            "config on purpose (its docstring: FSDP2 rebuilds dataclass arguments)",
}
"""Functions allowed more than MAX_PARAMETERS, each with the reason its list is not ours to shorten."""
def long_parameter_lists() -> list[str]:
    """`module.function: n` for every function whose positional and keyword-only parameters, besides
    self and cls, are more than MAX_PARAMETERS."""
    found = []
    for where, fn in _functions(modules()):
        a = fn.args
        names = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs] if p.arg not in ("self", "cls")]
        if len(names) > MAX_PARAMETERS:
            found.append(f"{where}: {len(names)}")
    return sorted(found)


def test_no_function_of_ours_takes_more_than_six_parameters():
    """A long parameter list is a config that has not been named: the frozen dataclass says what the values
    are together, and a call cannot swap two of them unnoticed."""
    allowed = set(NOT_OURS)
    found = [line for line in long_parameter_lists() if line.split(":")[0] not in allowed]
    assert found == []


# ---------------------------------------------------------------- names declared once

ABLATION_NAMES = {"no-remote", "chunk-window"}


def test_ablation_names_are_declared_once():
    """EVA's ablations are spelled in one place, `eva_settings.EvaAblation` (torch-free); the evaluator's
    section, the uptraining section, the recall cells, the `Ablation` enum and the benchmarks read it, so
    a new ablation is one edit and no list can miss it."""
    home = ROOT / "evalm" / "eva_settings.py"
    found = []
    for path in [*modules().values(), *benchmark_scripts().values()]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in ABLATION_NAMES and path != home:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_evaluators_command_line_preamble_is_written_once():
    """`evalm eval icl|ppl|recall` read their command lines through `cli_args.parse_command` (overrides split
    off, the flags parsed, file and flags layered, the section built): one function, not three copies."""
    icl_eval = {name: path for name, path in modules().items() if name.startswith("evalm.icl_eval.")}
    preambles = sorted(where for where, fn in _functions(icl_eval)
                       if {"split_overrides", "Layers"} <= {_name(c) for c in _calls(fn)})
    assert preambles == ["evalm.icl_eval.cli_args.parse_command"]
