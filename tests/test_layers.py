"""The package's layers, read from the source with `ast` (nothing is imported): every import between harness
modules goes down the layers or stays inside one package, and no import cycle exists, including imports
made inside functions. A process the harness starts itself through the command table (core/spawn.py:
`command_argv("<name>")`, `train_command(...)`) counts as an import of that command's module. The parent refuses
bad input without loading torch."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
from conftest import REPO

PACKAGE = REPO / "harness"
# Lower imports from nothing above it. runtime (inside a rank) and launcher (the parent) are siblings: neither
# may import the other. The modules directly in harness/ (the command table, commands.py, and `python -m harness`)
# are the top.
# backends (one package per strategy family) sit above runtime: a family's strategy.py subclasses the runtime's
# Strategy. config and theory reach them only through the registry (config/families.py), which loads a family's
# package by name, so no static import goes up. parallel (one package per parallel axis) sits beside them, reached
# the same way through config/axes.py; a family names the axes it composes with as data, never by import.
LAYERS = {"core": 0, "config": 1, "theory": 2, "reporting": 3, "runtime": 4, "launcher": 4, "backends": 5,
          "parallel": 5, "studies": 6}
COMMANDS = 7


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def command_modules() -> Dict[str, str]:
    """{command name: the module of its function}, read from the command table's source."""
    out = {}
    for node in ast.walk(ast.parse((PACKAGE / "commands.py").read_text())):
        if isinstance(node, ast.Dict) and node.keys and all(isinstance(k, ast.Constant) for k in node.keys):
            for key, row in zip(node.keys, node.values):
                target = row.args[0] if isinstance(row, ast.Call) and row.args else None
                if isinstance(target, ast.Constant):
                    out[key.value] = target.value.split(":")[0]
    return out


def spawned_by(tree: ast.AST) -> Set[str]:
    """The commands a module starts as processes of their own through core/spawn.py."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if called == "train_command":
                out.add("train")
            elif called == "command_argv" and node.args and isinstance(node.args[0], ast.Constant):
                out.add(node.args[0].value)
    return out


def imports_of(name: str, path: Path, known: Set[str], spawns: bool = True) -> Set[str]:
    """Harness modules that `name` imports anywhere in its file (top level or inside functions), and (`spawns`)
    the modules of the commands it spawns."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    table = command_modules()
    out = {table[c] for c in spawned_by(tree) if c in table} if spawns and name != "harness.core.spawn" else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("harness")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("harness"):
                continue
            for alias in node.names:  # `from pkg import module` imports the module, else the package itself
                out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {m for m in out if m in known and m != name}


def layer(module: str) -> Tuple[int, str]:
    parts = module.split(".")
    if len(parts) == 1:
        return COMMANDS, "harness"
    if parts[1] in LAYERS:
        return LAYERS[parts[1]], parts[1]
    return COMMANDS, "harness"  # harness/<command>.py


def violations(graph: Dict[str, Set[str]]) -> List[str]:
    out = []
    for src, targets in graph.items():
        (ls, ps) = layer(src)
        for dst in targets:
            (ld, pd) = layer(dst)
            if ld > ls or (ld == ls and pd != ps):
                out.append(f"{src} imports {dst}: from layer {ps} ({ls}) to {pd} ({ld})")
    return out


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def graph() -> Dict[str, Set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def test_imports_only_go_down_the_layers():
    g = graph()
    assert len(g) > 40 and any(g.values())  # the walk really found the package and its imports
    assert violations(g) == []


def test_there_is_no_import_cycle():
    assert cycles(graph()) == []


def test_the_checks_catch_an_upward_import_and_a_cycle():
    g = graph()
    g["harness.core.rundir"] = g["harness.core.rundir"] | {"harness.runtime.loop"}  # a deliberate upward import
    assert violations(g) == ["harness.core.rundir imports harness.runtime.loop: from layer core (0) to runtime (4)"]
    g = {"harness.config.rules": {"harness.config.derive"}, "harness.config.derive": {"harness.config.rules"}}
    assert cycles(g)


def test_every_subpackage_is_a_named_layer():
    packages = {p.parent.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert packages == set(LAYERS)
    # no forwarders: the command table is the only way in, and each of its rows names a module of a layer
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == ["__init__", "__main__", "commands"]
    table = command_modules()
    assert len(table) >= 20 and all(layer(m)[0] < COMMANDS and m in modules() for m in table.values()), table


def test_the_studies_are_grouped_by_question_and_share_no_command_module():
    """studies/ holds packages (one question each, said in its __init__ docstring) and the shared command-line checks;
    a helper two commands share lives in a module of its own, so no study imports another command's module."""
    studies = PACKAGE / "studies"
    assert sorted(p.name for p in studies.glob("*.py")) == ["__init__.py", "flags.py"]
    packages = [p for p in studies.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert len(packages) >= 8 and all(ast.get_docstring(ast.parse((p / "__init__.py").read_text())) for p in packages)
    mods = modules()
    commands = {m for m in command_modules().values() if m.startswith("harness.studies.")}
    shared = {name: imports_of(name, path, set(mods), spawns=False) & commands
              for name, path in mods.items() if name.startswith("harness.studies.")}
    assert {name: found - {name} for name, found in shared.items() if found - {name}} == {}


def test_a_spawn_through_the_table_is_seen_as_an_import():
    g = graph()
    assert "harness.launcher.warm_ops" in g["harness.launcher.ops"]  # ops.py starts `warm-ops` as a process
    assert "harness.launcher.train" in g["harness.studies.predict.hybrid"]  # a study starts runs as a user does


def test_the_parent_validates_without_importing_torch():
    code = ("import sys; import harness.launcher.train; from harness.config.compose import compose; "
            "from harness.config import rules; cfg = compose(['backend=ds_zero3', 'train.precision=fp16']); "
            "assert rules.problems(cfg, lambda: 0); print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_a_plan_for_a_named_card_is_priced_without_importing_torch_where_no_gpu_is():
    """The advisor's dry run for GPUs on a host without one imported torch only to be told there is none (2.4 s
    of its 15 here): its rates, its budget and its device costs' machine now ask core/gpus.py first."""
    from harness.core.gpus import DRIVER_NODES

    if any(Path(node).exists() for node in DRIVER_NODES):
        pytest.skip("a GPU driver is here: torch is asked, as it should be")
    code = ("import sys; from harness.config.compose import compose; from harness.studies.predict.rates import "
            "rates_for; from harness.studies.advise.search import default_budget; "
            "from harness.reporting.time_and_comm import machine; "
            "cfg = compose(['model=llama_70b', 'parallelism=gpu8', 'parallelism.card=h100-sxm']); "
            "rates = rates_for(cfg, 8); print(rates.source.split(',')[0], default_budget(cfg) // 2**30, "
            "machine('cuda'), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "H100 SXM 80GB 80 cuda (no GPU here) False", proc.stdout


def test_the_strategy_registry_and_the_fault_kinds_are_complete():
    from harness.config import families
    from harness.config.schema import CHOICES, FAULT_KINDS
    from harness.runtime import faults
    from harness.runtime.strategies.base import Strategy

    assert CHOICES["backend.family"] == tuple(families.FAMILIES)
    assert all(issubclass(f.strategy_class(), Strategy) and not f.missing_theory() for f in families.every())
    assert set(faults.ACTIONS) | set(faults.SAVE_ACTIONS) | {"none"} == set(FAULT_KINDS) == set(CHOICES["fault.kind"])


def summary_writers() -> List[str]:
    """Modules that pass a RunDir's `.summary` (summary.json) to `write_json`."""
    out = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "write_json"
                    and node.args and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "summary"):
                out.append(name)
    return sorted(set(out))


def test_only_the_launcher_writes_summary_json():
    """The ranks leave reports and outcome files; the launcher's process (harness.launcher) alone writes a run's
    summary.json, with the notes it never hands to the ranks."""
    writers = summary_writers()
    assert writers and all(w.startswith("harness.launcher.") for w in writers), writers


# a repo path in prose: dirs, then a file name with one of the repo's own source extensions
DOC_PATH = re.compile(r"(?<![\w./<>{-])((?:[\w.-]+/)+[\w.-]+\.(?:py|yaml|md|sh))\b")


def test_every_path_a_docstring_names_exists():
    """A docstring that points a reader to a file (`runtime/worker.py`, `tests/test_parity.py`) points to one that
    is there: relative to the repo, to harness/ or to tests/. Paths inside run dirs are not repo paths and do not
    match (their first part is not a folder of the repo or of harness/)."""
    roots = (REPO, PACKAGE, REPO / "tests")
    tops = {p.name for p in REPO.iterdir()} | {p.name for p in PACKAGE.iterdir()}
    missing = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "hydra_plugins").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for named in DOC_PATH.findall(ast.get_docstring(node) or ""):
                if named.split("/")[0] in tops and not any((root / named).exists() for root in roots):
                    missing.append(f"{path.relative_to(REPO)}: {named}")
    assert not missing, missing


def test_a_failed_row_keeps_the_models_size_when_no_rank_reported_it(tmp_path):
    # the fault drill's SIGKILL row lost its size about once in 20 runs: the killed rank leaves no outcome, and
    # torchrun stopped its peer before the peer wrote one; rank 0's settings.json, written once the model was
    # built, still holds it
    from harness.core.records import RankOutcome, Status
    from harness.core.rundir import RunDir, write_json
    from harness.launcher.outcome import params_reached

    run_dir = RunDir(tmp_path)
    silent = [RankOutcome(0, Status.FAILED), RankOutcome(1, Status.FAILED)]
    assert params_reached(run_dir, silent) is None  # nothing built yet: nothing to say
    write_json(run_dir.settings, {"workload": {"name": "full", "params": 125_248}})
    assert params_reached(run_dir, silent) == 125_248
    assert params_reached(run_dir, [RankOutcome(0, Status.FAILED, params=7), *silent]) == 7  # a rank's own count


# a tensor-parallel degree, plan or style by its name in code (not in comments or prose)
TP_NAMES = re.compile(r"^(tp|tps|TP_\w+|tensor_parallel\w*|\w+_tensor_parallel\w*|tensor_(?!peak|sizes)\w+|\w*tensor_plan"
                      r"\w*|sequence_parallel|loss_parallel|Colwise\w*|Rowwise\w*|SequenceParallel|PrepareModule\w*|"
                      r"tp_\w+|\w+_tp)$")


def test_few_modules_outside_the_axis_package_name_tensor_parallelism():
    """Tensor parallelism lives in harness/parallel/tp/ (and the backends that run it): everywhere else reaches
    it through the axes' registry (config/axes.py). At most 10 modules outside them name it in code (issue 70:
    43 files did), so that the next axis touches few files; docs/layout.md names the five that do."""
    import io
    import tokenize

    naming = []
    for name, path in modules().items():
        if name.startswith(("harness.parallel", "harness.backends")):
            continue
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if any(t.type == tokenize.NAME and TP_NAMES.match(t.string) or t.type == tokenize.STRING
               and re.fullmatch(r"[\"'](tp|parallelism\.tp=?)[\"']", t.string) for t in tokens):
            naming.append(name)
    assert len(naming) <= 10, sorted(naming)
    assert "harness.config.axes" in naming  # the registry: what the test reads is really there


def test_no_backend_is_named_in_code_outside_its_package_the_registry_and_conf():
    """A study's default backends and cells are data in conf/studies.yaml (harness/studies/flags.py), a refusal
    names what the registry says: outside harness/backends/, the families' registry and the independent loop
    (whose point is to be written without the harness), no string in code names a backend (issue 70: 22
    did, in 6 study files). Prose (docstrings, comments) may."""
    import io
    import tokenize

    names = sorted(p.stem for p in (REPO / "conf" / "backend").glob("*.yaml"))
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    allowed = ("harness.backends", "harness.config.families", "harness.studies.bench.independent_loop")
    found = []
    for name, path in modules().items():
        if name.startswith(allowed):
            continue
        for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if t.type == tokenize.STRING and not re.match(r"[rbfu]*(\"\"\"|''')", t.string) and pattern.search(t.string):
                found.append(f"{name}:{t.start[0]}: {t.string[:60]}")
    assert not found, found
