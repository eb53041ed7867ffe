"""The house rules, measured on the source and its text: no import loop, floors respected, small files
and functions. An independent walk of the source's syntax trees, every import counted (also the
ones made inside a function, which Python resolves late but which tie modules together all the
same). Then the words a reader meets first: the README is a front page, nothing points where a
reader cannot go (a tracker number, a design document that does not ship), kernels use named
helpers rather than assigned lambdas, the file map lists every module, and the README's commands
are the commands `evalm --help` has."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
FOLDERS = {folder: name for name, folder in PYPROJECT["package-dir"].items()}
"""Source folder -> its import name: the repository's top-level folders are the parts of one
import namespace, `evalm` (pyproject.toml)."""

FLOORS = {
    "config_toolkit": set(),
    "storage": {"config_toolkit"},  # only its user-error types (config_toolkit.errors)
    "configs": set(),
    "text": {"config_toolkit", "storage"},
    "evalm": {"config_toolkit", "storage"},
    "data_pipeline": {"config_toolkit", "storage"},
    "train": {"config_toolkit", "storage", "text", "evalm"},
    "icl_eval": {"config_toolkit", "storage", "text", "evalm"},
    "launcher": set(FOLDERS),
}
"""What each folder may import besides itself."""

SIDEWAYS = {("evalm.train.metaicl", "icl_eval"), ("evalm.icl_eval.tasks.synthetic", "train"),
            ("evalm.icl_eval.methods.finetune", "train")}
"""Known exceptions to the floors, each with its reason (both inside functions, so neither package
loads the other at import):
- `evalm train metaicl` meta-trains a T5 on episodes laid out exactly as the evaluator lays out a
  prompt (the same PromptBuilder and segment split, SAICL §3.3): copying that code would let the
  two drift;
- `icl_eval.tasks.synthetic.train_tiny_model` (the built-in model of `evalm eval icl` without a
  checkpoint) trains through `train.local`, so that the project has one training step;
- `icl_eval.methods.finetune.tune` (`--methods finetune`) fine-tunes a copy of the scored model on a
  draw's demonstrations through the same `train.local`, for the same reason."""

MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def modules() -> dict[str, Path]:
    """Dotted import name -> file, for every source file of the packages."""
    found = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def floor(name: str) -> str:
    """The folder a dotted import name lives in (`evalm.train.x` -> `train`, `evalm.model` -> `evalm`)."""
    return max((f for f, n in FOLDERS.items() if name == n or name.startswith(n + ".")), key=lambda f: len(FOLDERS[f]))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that `name` imports, anywhere in the file.

    `from a.b import c` names the module `a.b.c` when that is a module, else `a.b`; relative
    imports are resolved against the importing module's package.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a module: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def test_the_walker_sees_a_loop_made_inside_a_function(tmp_path):
    """The oracle for the checker itself: a two-module loop through a function-level import."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n")
    known = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    edges = {n: imports(n, p, known) for n, p in known.items()}
    assert edges == {"a": {"b"}, "b": {"a"}}
    assert cycles(edges) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_anywhere():
    assert cycles(graph()) == []


def test_no_import_runs_up_or_across_a_floor():
    wrong = []
    for name, targets in graph().items():
        home = floor(name)
        for target in targets:
            other = floor(target)
            if other != home and other not in FLOORS[home] and (name, other) not in SIDEWAYS:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_of(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The dotted module a name or attribute chain stands for (`flash`, `evalm.flash`), else None."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = _module_of(node.value, aliases)
        return f"{parent}.{node.attr}" if parent else None
    return None


def private_reach_ins(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """Each place `name` uses a private name (`_x`, not a dunder) of another module of ours:
    `from m import _x`, or `m._x` on a module it imported (`import a.m`, `from a import m`, an alias)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in known and base != name and _is_private(alias.name):
                    found.append(f"{name}:{node.lineno}: from {base} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = _module_of(node.value, aliases)
            if owner in known and owner != name:
                found.append(f"{name}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_the_reach_in_checker_sees_each_form(tmp_path):
    """The oracle for the checker: every way one module can name another's private name, and
    the look-alikes it must leave alone (its own private names, an object's, a dunder)."""
    (tmp_path / "a.py").write_text("_x = 1\n__version__ = 2\n")
    (tmp_path / "b.py").write_text("import a\nimport a as m\nfrom a import _x\n"
                                   "def f(self):\n    return a._x, m._x, a.__version__, self._y, _z\n_z = 3\n")
    known = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    assert sorted(private_reach_ins("b", known["b"], known)) == ["b:3: from a import _x", "b:5: a._x", "b:5: a._x"]
    assert private_reach_ins("a", known["a"], known) == []


def test_no_module_uses_another_modules_private_names():
    """Modules meet through public interfaces, on every floor: a private helper can change without a
    second module breaking (the fused path's parts once reached into each other; `recall` once imported
    four private helpers of `icl_eval/cli.py`)."""
    known = modules()
    found = [hit for name, path in known.items() for hit in private_reach_ins(name, path, known)]
    assert found == []


MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "clear", "pop", "popitem", "remove", "discard"}
PROCESS_REGISTRIES = {
    "evalm.storage.lock._HELD": "the run-folder locks this process holds: the OS's lock is per process, so is its count",
    "evalm.storage.secrets._KNOWN": "the passwords this process was given: every later line it prints must mask them",
    "evalm.flex_kernel._NOT_COMPILING": "the device types where flex_attention did not compile in this process: a fact of its toolchain, so later calls route elsewhere",
}
"""Module-level containers written at run time on purpose: process-wide facts, not a call's state."""


def mutable_module_state(name: str, path: Path) -> list[str]:
    """`name.X` for each module-level list, dict or set that a function of the module changes: a call's
    results passed through a global (attention transfer's layer losses once were)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    containers = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            literal = isinstance(value, (ast.List, ast.Dict, ast.Set))
            made = isinstance(value, ast.Call) and getattr(value.func, "id", "") in {"list", "dict", "set", "defaultdict"}
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if literal or made:
                containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    written = set()
    for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(func):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and isinstance(node.func.value, ast.Name)):
                written.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for target in getattr(node, "targets", None) or [getattr(node, "target", None)]:
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        written.add(target.value.id)
    return sorted(f"{name}.{x}" for x in containers & written)


def test_the_state_checker_sees_each_form(tmp_path):
    (tmp_path / "m.py").write_text("A = []\nB: dict = {}\nC = set()\nD = (1, 2)\nE = []\n"
                                   "def f(x):\n    A.append(x)\n    B[x] = 1\n    C.add(x)\n    return D, E[0]\n")
    assert mutable_module_state("m", tmp_path / "m.py") == ["m.A", "m.B", "m.C"]


def test_no_module_level_container_is_written_at_run_time():
    """A call's state lives in the call or its objects (`EvaAttention.reported_paths`, attention
    transfer's losses on their modules), not in a module's globals; the process registries listed
    in PROCESS_REGISTRIES say why they are the exception."""
    found = [hit for name, path in modules().items() for hit in mutable_module_state(name, path)]
    assert sorted(set(found) - set(PROCESS_REGISTRIES)) == []
    assert set(PROCESS_REGISTRIES) <= set(found)  # a registry that became a constant leaves the list


def test_every_package_folder_is_installed_under_its_name():
    """A subpackage missing from pyproject's list would import from a checkout and not from a wheel."""
    wanted = sorted(".".join([name, *init.parent.relative_to(ROOT / folder).parts])
                    for folder, name in FOLDERS.items() for init in (ROOT / folder).rglob("__init__.py"))
    assert sorted(PYPROJECT["packages"]) == wanted
    assert set(FOLDERS) == set(FLOORS)


def benchmark_scripts() -> dict[str, Path]:
    """benchmarks/*.py under the same size rule as the package (scripts are read as often as modules)."""
    return {f"benchmarks.{p.stem}": p for p in sorted((ROOT / "benchmarks").glob("*.py"))}


def test_files_and_functions_are_small():
    long_files, long_functions = [], []
    for name, path in {**modules(), **benchmark_scripts()}.items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {length} lines")
    assert long_files == [] and long_functions == []


# ---------------------------------------------------------------- the words a reader meets first

README = ROOT / "README.md"
MAX_README_LINES, MAX_LINE_CHARS, MAX_PARAGRAPH_WORDS = 150, 200, 80
TRACKER = re.compile(r"\b[Ii]ssues?[ -]#?\d+\b")
OUTSIDE = re.compile(r"\b(?:EVA_SPEC|ICL_SPEC|DATA_SPEC)\b|\bARCHITECTURE\.md\b|\bSTYLE\.md\b")


def shipped_text_files() -> list[Path]:
    """Every tracked source, config and doc file (tests included)."""
    listed = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "*.sh"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / f for f in listed if (ROOT / f).is_file()]


def outside_code_blocks(text: str) -> list[tuple[int, str]]:
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((number, line))
    return lines


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each prose paragraph outside code blocks: headings and table rows are not prose."""
    found, current = [], []
    for number, line in [*outside_code_blocks(text), (0, "")]:
        prose = line.strip() and not line.startswith(("#", "|"))
        if prose:
            current.append((number, line))
        elif current:
            found.append((current[0][0], " ".join(part for _, part in current)))
            current = []
    return found


def test_the_readme_is_a_front_page():
    """It leads with the result and sends figures to the pages that hold them: short, lines that fit, no
    paragraph a reader must wade through (the front page once had paragraphs of 203 words and 35 figures)."""
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_README_LINES
    wide = [n for n, line in outside_code_blocks(text) if len(line) > MAX_LINE_CHARS]
    assert wide == [], f"README lines over {MAX_LINE_CHARS} characters: {wide}"
    long = [(n, len(p.split())) for n, p in paragraphs(text) if len(p.split()) > MAX_PARAGRAPH_WORDS]
    assert long == [], f"README paragraphs over {MAX_PARAGRAPH_WORDS} words (line, words): {long}"


def test_the_paragraph_reader_sees_prose_only():
    text = "# T\n\none two\nthree\n\n| a | b |\n```bash\nfour five\n```\nsix\n"
    assert paragraphs(text) == [(3, "one two three"), (10, "six")]


def test_nothing_cites_a_tracker_number_or_a_document_that_does_not_ship():
    found = []
    for path in shipped_text_files():
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if TRACKER.search(line) or OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == []


def test_no_assigned_lambdas():
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Lambda):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "name the function with def instead"


def test_the_file_map_lists_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    missing = sorted(str(path.relative_to(ROOT)) for path in modules().values()
                     if path.name != "__init__.py" and str(path.relative_to(ROOT)) not in layout)
    assert missing == [], "add a line for each to docs/layout.md"
    assert set(FOLDERS) <= {line.split("/")[0] for line in layout.splitlines() if "/" in line.split(" ")[0]}


ICL_EVAL_TOP = {"__init__", "__main__", "cli", "cli_args", "settings", "config", "report", "tables", "harness"}
"""The evaluator's top level: its command line and what every group shares (`tables`: every study table, for
the runs, the recall group and a study's report alike); the rest lives in the
group of what it holds (models, tasks, methods, protocol, stats, perplexity), as lm-evaluation-
harness groups `api/`, `models/`, `tasks/`."""


def test_the_evaluator_is_grouped_by_what_it_holds():
    icl_eval = ROOT / "icl_eval"
    flat = sorted(p.stem for p in icl_eval.glob("*.py") if p.stem not in ICL_EVAL_TOP)
    assert flat == [], f"icl_eval/{flat}: put each into the group of what it holds (docs/layout.md)"
    for group in sorted(p for p in icl_eval.iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = group / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), \
            f"{group.relative_to(ROOT)}: a package whose __init__ says in one line what it holds"
        assert len(list(group.glob("*.py"))) >= 3, f"{group.relative_to(ROOT)}: a group of one module is a folder too many"


def test_the_readme_and_evalm_help_agree_on_every_command():
    from evalm.launcher.cli import COMMANDS
    from evalm.data_pipeline.cli import DISPATCHER as DATA
    from evalm.icl_eval.cli import COMMANDS as EVAL
    from evalm.train.cli import COMMANDS as TRAIN

    groups = {"data": set(DATA.commands), "train": set(TRAIN), "eval": set(EVAL)}
    text = README.read_text(encoding="utf-8")
    used = re.findall(r"(?<![\w-])evalm (\w[\w-]*)(?: (\w[\w-]*))?", text)
    used = [(a, b) for a, b in used if a != "import" and not a.isupper()]  # code (`from evalm import`), placeholders
    unknown = sorted({f"{a} {b}".strip() for a, b in used if a not in COMMANDS
                      or (a in groups and b and not b.isupper() and b not in groups[a])})
    assert unknown == [], f"the README names commands `evalm --help` does not have: {unknown}"
    assert all(f"evalm {name}" in text for name in COMMANDS), "every command of `evalm --help` appears in the README"


def test_a_models_config_loads_no_torch():
    """`ModelConfig` is data, a leaf as nanoGPT's `GPTConfig` and torchtitan's model args are: reading and
    validating one (a run file, `--help`, a refusal) does not pull in torch and the attention tower."""
    code = "import sys, evalm.config; evalm.config.ModelConfig(attention='window'); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"


SAME_NAME_OTHER_FIELD = {("ModelConfig", "positions"), ("ModelConfig", "circular_period")}
"""Fields named as a placement's that are not one: `ModelConfig`'s learned position table (EVALM's own decoder has
no RoPE; its rows are taken at i mod M or clamped), which a rotary placement does not describe."""


def test_eva_settings_are_declared_once():
    """One EVA schema: the fields of `EvaSettings` (window, chunk, overlap, T5 bias, excluded window chunks, sink,
    maps) and of `RotaryPlacement` (positions, circular period, sink positions) are declared by those classes
    alone; every host holds or inherits them (`ModelConfig`, the conversion, the Llama config), so no second set of
    defaults can drift. A config class (`@dataclass(config=FROZEN, ...)`, what `build` reads from a file or flags)
    anywhere else annotating one of those names is a second schema; the rule a call runs (`Tiling`, derived from
    the settings) is not a schema. The inits of a converted model's maps are one Literal there too: no other
    tuple, list, set or Literal spells two of them."""
    from evalm import eva_settings
    from evalm.eva_settings import EVA_FIELDS, PLACEMENT_FIELDS

    MAP_INITS = getattr(eva_settings, "MAP_INITS", ("identity", "mean-key", "reference"))  # noqa: N806

    home = ROOT / "evalm" / "eva_settings.py"
    found, inits = [], []
    for path in modules().values():
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and "FROZEN" in " ".join(map(ast.unparse, node.decorator_list)):
                found += [f"{path.relative_to(ROOT)}:{item.lineno} {node.name}.{item.target.id}" for item in node.body
                          if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                          and item.target.id in (*EVA_FIELDS, *PLACEMENT_FIELDS)
                          and (node.name, item.target.id) not in SAME_NAME_OTHER_FIELD]
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                spelled = {e.value for e in node.elts if isinstance(e, ast.Constant)} & set(MAP_INITS)
                inits += [f"{path.relative_to(ROOT)}:{node.lineno}"] if len(spelled) > 1 else []
    assert found == [], f"EVA or placement settings declared outside evalm/eva_settings.py: {found}"
    assert inits == [], f"the map inits spelled outside evalm/eva_settings.py (MapInit): {inits}"
    code = "import sys, evalm.eva_settings, evalm.train.convert; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"


# ---------------------------------------------------------------- benchmarks/ only times

MAX_BENCHMARK_LINES = 1975  # 1,889 after the house pass, and selection's cost benchmark
"""benchmarks/ in all (3,569 lines when it was a client application, 2,486 with its own flags, clocks and
children in every script): scripts that time things and print ratios against a baseline measured in the
same run, what they share written once (benchmarks/timing.py), every measurement of a study a package
command or a study step, every table a study prints icl_eval/tables.py's."""


def test_benchmarks_are_few_lines_in_all():
    total = sum((ROOT / name).read_text(encoding="utf-8").count("\n")
                for name in subprocess.run(["git", "ls-files", "benchmarks"], cwd=ROOT, capture_output=True,
                                           text=True, check=True).stdout.split())
    assert total < MAX_BENCHMARK_LINES, f"benchmarks/ holds {total} lines"


def test_one_writer_of_markdown_tables():
    """Every markdown table the package or a benchmark prints (a study's, a run's, the GPU run's, the main job's
    summary, the probe's) is spelled by one writer, config_toolkit/markdown.py: no other module spells a table's
    rule (`|---|`), as three study report writers once did."""
    writer = ROOT / "config_toolkit" / "markdown.py"
    found = sorted({str(path.relative_to(ROOT)) for path in {**modules(), **benchmark_scripts()}.values() if path != writer
                    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and "---" in node.value and set(node.value) <= {"|", "-"}})
    assert found == [], f"tables spelled outside config_toolkit/markdown.py: {found}"


def _takes_a_namespace(node: ast.FunctionDef, parsed: bool) -> bool:
    """A function annotated with argparse.Namespace, or (`parsed`) whose parameter is named `args`."""
    params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    return any((parsed and a.arg == "args") or "Namespace" in ast.unparse(a.annotation or ast.Constant(None))
               for a in params)


COMMAND_EDGES = ("evalm.data_pipeline.cli", "evalm.icl_eval.cli_args", "evalm.launcher.samples")
"""Modules that parse a command's flags and type them there: their functions may read the namespace."""


def test_no_argparse_namespace_passes_into_the_package():
    """Flags are typed at a command's edge: no package function is annotated to take a parsed argparse
    namespace, and no benchmarks/ function or class hands one around (a script's `main` parses its flags
    and passes values; a driver that kept the namespace grew into a second client of the package)."""
    package = [f"{name}.{node.name}" for name, path in modules().items() if name not in COMMAND_EDGES
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_a_namespace(node, False)]
    scripts = [f"{name}.{node.name}" for name, path in benchmark_scripts().items()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_a_namespace(node, True)]
    assert package == [] and scripts == []


def test_one_runner_for_run_files():
    """The main job's stages and a study's steps are units of one runner (`launcher/runner.py`), with one
    meaning of done: no other launcher module reads or writes a unit's key or its stale flag, or reads a
    marker to decide what runs; `evalm run` tells a study from the main job by the file's table, read once
    (no scan of the command line for the run file), and the study's folder is held by its owner (RunFolder),
    never by a lock taken by hand."""
    launcher = ROOT / "launcher"
    runner = launcher / "runner.py"
    found = []
    for path in sorted(launcher.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
                {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if path != runner:
            found += [f"{path.name}: the done-key {s!r}" for s in ("key", "stale") if s in strings]
            found += [f"{path.name}: {n}" for n in ("read_marker", "write_marker", "mark_stale", "plan_stage")
                      if n in names | defined]
        found += [f"{path.name}: {n}" for n in ("_config_of", "_is_study", "is_study", "folder_lock") if n in names | defined]
        found += [f"{path.name}: scans argv for --config" for s in strings if s.startswith("--config=")]
    assert found == [], f"a second runner, or its pieces: {found}"
    for job in ("run.py", "study.py"):
        assert "Runner(" in (launcher / job).read_text(encoding="utf-8"), job
