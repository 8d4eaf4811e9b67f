"""The package's layers import only downwards (docs/architecture.md), the code that runs inside
every rank stays on the standard library and torch, and ``ddpdoctor run`` starts without the
modules only the other commands need."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ddpdoctor"

# What each folder may import from ddpdoctor (besides the package root's __version__). The
# command line (cli/) sits on top and may import anything.
ALLOWED = {
    "trace": {"trace"},
    "runtime": {"runtime", "trace"},
    "knowledge": {"knowledge"},
    "analysis": {"analysis", "trace", "knowledge"},
    "render": {"render", "analysis", "trace", "knowledge"},
    "launch": {"launch", "trace", "analysis", "runtime.env", "runtime.stderr_tail",
               "runtime.torch_internals", "runtime.source_capture"},
}
# Third-party packages the in-rank code may use: it runs inside every training process.
IN_RANK = {"runtime", "trace"}
IN_RANK_THIRD_PARTY = {"torch"}


def _imports(path: Path) -> list[str]:
    """Modules imported by ``path`` at run time (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    names = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "ddpdoctor":  # from ddpdoctor import x: x is the module
                names.extend(f"ddpdoctor.{alias.name}" for alias in node.names)
            else:
                names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(folder: str) -> None:
    allowed = ALLOWED[folder]
    wrong = []
    for path in _modules(folder):
        for name in _imports(path):
            if not name.startswith("ddpdoctor.") or name == "ddpdoctor.__version__":
                continue
            inner = name.split(".", 1)[1]
            if not any(inner == a or inner.startswith(a + ".") for a in allowed):
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("folder", sorted(IN_RANK))
def test_in_rank_code_uses_only_the_standard_library_and_torch(folder: str) -> None:
    wrong = []
    for path in _modules(folder):
        for name in _imports(path):
            root = name.split(".", 1)[0]
            if root in sys.stdlib_module_names or root in IN_RANK_THIRD_PARTY or \
                    root == "ddpdoctor" or root == "__future__":
                continue
            wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_every_module_belongs_to_a_layer() -> None:
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not loose
    assert folders == set(ALLOWED) | {"cli"}


# The package's declared dependencies (pyproject.toml), by import name. typer vendors its
# click: importing click directly works only where something else installed it.
DECLARED = {"torch", "typer", "rich", "yaml"}


def test_the_package_imports_only_its_declared_dependencies() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _imports(path):
            root = name.split(".", 1)[0]
            if root in sys.stdlib_module_names or root in DECLARED or \
                    root in ("ddpdoctor", "__future__"):
                continue
            wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not wrong, "\n".join(wrong)


# Private torch names (and the modules that hold them) that only runtime/torch_internals/ may
# reach, so that a new torch release is that package and its contract test.
TORCH_PRIVATE = ("_get_default_group", "_get_default_store", "_world", "_register_backend",
                 "_set_default_backend", "_set_sequence_number_for_group", "_timeout",
                 "_create_work_from_future", "_dump_fr_trace", "_dump_nccl_trace", "_pre_forward",
                 "_DDPJoinHook", "main_hook", "_poll", "_wrap", "_C", "_option_string_actions",
                 "trace_rules", "TCPStore", "get_args_parser", "SubprocessContext")
TORCH_MODULES = ("torch.distributed.elastic", "torch.multiprocessing.spawn", "torch._dynamo",
                 "torch.distributed.run", "torch._C")


# Underscored names of the standard library the package may use (they are not torch's):
# sys's and argparse's, and a named tuple's public methods.
STDLIB_PRIVATE = frozenset({"_current_frames", "_getframe", "_actions", "_exit", "_replace",
                            "_fields", "_asdict", "_make"})


def _own_names() -> set[str]:
    """Every name the package itself defines (functions, classes, attributes it assigns,
    variables, parameters): an underscored attribute that is none of these is another
    library's private name."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _torch_private_uses(path: Path, own: frozenset[str] = frozenset(),
                        root: Path = PACKAGE) -> list[str]:
    """Private torch names ``path`` reaches: those listed above, and (given ``own``, the
    package's own names) any underscored attribute the package does not define."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    where = path.relative_to(root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (node.attr in TORCH_PRIVATE or own and (
                node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in own and node.attr not in STDLIB_PRIVATE)):
            found.append(f"{where}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (node.value in TORCH_PRIVATE or node.value.startswith(TORCH_MODULES)):
            found.append(f"{where}:{node.lineno} {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(TORCH_MODULES):
            found.append(f"{where}:{node.lineno} from {node.module}")
    return found


def test_torch_internals_are_reached_from_one_package() -> None:
    homes = sorted((PACKAGE / "runtime" / "torch_internals").glob("*.py"))
    assert len(homes) > 4  # split by concern: c10d, DDP, launchers, ...
    assert all(_torch_private_uses(home) for home in homes
               if home.stem in ("c10d", "ddp", "launchers", "compiler")), \
        "the check no longer sees the names it looks for"
    # The table of torch functions whose frames label DDP's collectives is data the trace
    # readers use too (test_torch_contract checks each name against the installed torch).
    labels = PACKAGE / "trace" / "ddp_sites.py"
    assert _torch_private_uses(labels)
    own = frozenset(_own_names())
    wrong = [use for path in sorted(PACKAGE.rglob("*.py")) if path not in (*homes, labels)
             for use in _torch_private_uses(path, own)]
    assert not wrong, "\n".join(wrong)


def test_the_private_name_check_sees_a_name_outside_its_list(tmp_path: Path) -> None:
    """A private torch attribute that no list names (DDP's ``_get_ddp_logging_data``) is
    still found where the package does not define it."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(ddp):\n    return ddp._get_ddp_logging_data()\n")
    assert _torch_private_uses(probe, frozenset(_own_names()), tmp_path) == [
        "probe.py:2 ._get_ddp_logging_data"]


def _all_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports anywhere: at the top, inside functions, under
    ``if TYPE_CHECKING:``, relative or absolute."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    here = ".".join(rel.parts[:-1] if path.name == "__init__.py" else rel.parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.add(name if name in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & modules


def test_no_two_modules_import_each_other() -> None:
    """Not even through a function-level or a TYPE_CHECKING import (issue 57)."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    modules = set(paths)
    imports = {name: _all_imports(path, modules) for name, path in paths.items()}
    assert imports["ddpdoctor.analysis.digest"] >= {"ddpdoctor.analysis.hang_rules"}
    both = sorted(f"{a} <-> {b}" for a in imports for b in imports[a]
                  if a < b and a in imports[b])
    assert not both, "\n".join(both)


# Modules `ddpdoctor run` never needs to start and watch a job, nor to report one that ends
# clean: the other commands' (attach, diff of a post-mortem or snapshot, schedule), PyYAML (a
# ddpdoctor.yaml, a schedule, the causes of a finding), a progress bar for reading many traces.
# Every launch paid ~40 ms of CPU importing them (bench/RESULTS.md, session 49).
NOT_AT_LAUNCH = ("yaml", "rich.progress", "ddpdoctor.launch.spy", "ddpdoctor.launch.discover",
                 "ddpdoctor.analysis.attach", "ddpdoctor.analysis.postmortem",
                 "ddpdoctor.trace.snapshot", "ddpdoctor.trace.job_logs")


def test_the_command_line_starts_without_what_only_other_commands_need() -> None:
    code = ("import sys, ddpdoctor.cli, ddpdoctor.cli.run; "
            f"print(sorted(m for m in {NOT_AT_LAUNCH!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    # The probe sees an import: writing a schedule still imports PyYAML.
    code = ("import sys, ddpdoctor.cli.diff as d, ddpdoctor.analysis.schedule as s; "
            "s.to_yaml(s.Schedule(world_size=1, iteration=0, groups={}, ranks=[])); "
            "print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert out.stdout.strip() == "True", out.stdout + out.stderr
