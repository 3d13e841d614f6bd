"""The house rules, checked: layers and no import cycles (import-linter), lint and import order
(ruff, which also refuses a private name imported from another module), short functions and
modules, the version in its own module, and the public API in one place.

docs/architecture.md explains the layers these tests hold the code to.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import shutil
import subprocess
import sys

import pytest

from tests import REPO
from tests.cpp_sizes import CPP_SUFFIXES, cpp_functions

PACKAGES = ("packer", "readers", "gpu_ops")
#: The limits of issue 27: a function a reader sees at once, a module a newcomer can read.
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 900

pytestmark = pytest.mark.timeout(300)


def _sources():
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_import_contracts_hold():
    """Layers one way down, the readers' decoders independent, and no cycle anywhere
    (pyproject.toml [tool.importlinter])."""
    lint = shutil.which("lint-imports") or pytest.fail("import-linter is not installed (pip install -e .[dev])")
    r = subprocess.run([lint, "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=REPO,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "broken" not in r.stdout.lower().replace("0 broken", "")


def test_ruff_passes_on_the_whole_tree():
    """Lint, import order, and no private name imported from another module (PLC2701)."""
    ruff = shutil.which("ruff") or pytest.fail("ruff is not installed (pip install -e .[dev])")
    r = subprocess.run([ruff, "check", "--no-cache", *PACKAGES, "tests", "scripts", "setup.py"], cwd=REPO,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_no_function_or_module_over_the_limit():
    too_long = []
    for path, tree in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: module of {n} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name}() has {lines} lines")
    assert not too_long, "\n".join(too_long)


def _native_sources():
    """gpu_ops' C++ and CUDA sources, less the vendored third_party/ (xxhash)."""
    csrc = REPO / "gpu_ops" / "csrc"
    return [p for p in sorted(csrc.rglob("*"))
            if p.suffix in CPP_SUFFIXES and "third_party" not in p.relative_to(csrc).parts]


def test_no_cpp_function_or_file_over_the_limit():
    """The same limits reach gpu_ops/csrc: no C++/CUDA function over MAX_FUNCTION_LINES lines, no
    file over MAX_MODULE_LINES (tests/cpp_sizes.py counts by matching braces)."""
    sources = _native_sources()
    assert any(p.name == "engine.h" for p in sources) and any(p.suffix == ".cu" for p in sources)
    too_long, unseen = [], []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: file of {n} lines")
        functions = cpp_functions(text)
        if not functions and path.suffix in (".cpp", ".cu"):
            unseen.append(str(path.relative_to(REPO)))  # the counter would be blind to this file
        too_long += [f"{path.relative_to(REPO)}:{f.line}: {f.head} has {f.lines} lines"
                     for f in functions if f.lines > MAX_FUNCTION_LINES]
    assert not unseen, f"no function found in {unseen}: teach tests/cpp_sizes.py their form"
    assert not too_long, "\n".join(too_long)


def test_the_cpp_counter_measures_functions_not_classes():
    """The counter on a synthetic snippet: a class is walked into, not counted as one function;
    a long method inside it, a constructor with an initializer list, a template, a CUDA kernel and
    a free function are measured head to closing brace; braces in comments, strings and macros,
    lambdas and blocks inside a body, initializers and enum bodies do not end or start one."""
    body = "\n".join(f"    x += {i};  // {{ not a brace" for i in range(120))
    snippet = f"""#include <vector>
#define BLOCK(x) do {{ x; }} while (0)
namespace outer {{
enum Kind : int {{ kA = 0, kB }};
static const bool kFlag = [] {{ return true; }}();
class Engine {{
 public:
  Engine(int a, int b)
      : a_(a), b_(b) {{
    BLOCK(a_ += 1);
  }}
  void run_job(int x) {{
    auto f = [&](int y) {{ return y + 1; }};
{body}
    if (x) {{ x = f(x); }}
  }}
  int small() const {{ return a_; }}
 private:
  int a_, b_;
  double t_[2] = {{0.0, 0.0}};
}};
template <typename T>
__global__ void kernel(T* p) {{
  p[0] = T(1);
}}
}}  // namespace outer
const char* name() {{ return "}}"; }}
"""
    found = {f.head.split("(")[0].split()[-1]: f for f in cpp_functions(snippet)}
    assert set(found) == {"Engine", "run_job", "small", "kernel", "name"}, found
    assert found["run_job"].lines == 124 and found["run_job"].line == 12
    assert found["Engine"].lines == 4 and found["Engine"].line == 8
    assert found["small"].lines == 1 and found["kernel"].lines == 4 and found["name"].lines == 1
    assert [f.head for f in cpp_functions(snippet) if f.lines > MAX_FUNCTION_LINES] == ["void run_job(int x)"]


def test_nothing_inside_packer_imports_the_package_root():
    """``__version__`` lives in packer/version.py; code inside the package imports its
    modules, never ``packer`` itself (whose ``__init__`` imports the whole public API). The one
    exception is the CLI, the top layer, which calls that public API."""
    found = []
    top = {REPO / "packer" / name for name in ("__init__.py", "__main__.py", "cli.py")}
    for path, tree in _sources():
        if path in top or not path.is_relative_to(REPO / "packer"):
            continue
        package = path.relative_to(REPO).with_suffix("").parts[:-1]   # the module's package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else ()
                target = ".".join([*base, *([node.module] if node.module else [])])
                if target == "packer":   # `from packer import x`, or `from . import x` at the top
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: from packer import ...")
            elif isinstance(node, ast.Import) and any(a.name == "packer" for a in node.names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: import packer")
    assert not found, "\n".join(found)
    version = importlib.import_module("packer.version")
    import packer
    assert packer.__version__ == version.__version__


@pytest.mark.parametrize("name", ["packer", "readers", "readers.gpu", "gpu_ops"])
def test_public_api_is_declared_and_documented(name):
    """Each package's ``__all__`` names what users call; every name resolves, and every public
    class and function in it has a docstring."""
    mod = importlib.import_module(name)
    assert mod.__doc__ and len(mod.__doc__.strip()) > 40, f"{name} has no module docstring"
    exported = getattr(mod, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ lists a name twice"
    undocumented = []
    for attr in exported:
        obj = getattr(mod, attr)   # AttributeError: __all__ names something that is not there
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
            undocumented.append(attr)
    assert not undocumented, f"{name}: no docstring on {undocumented}"


def test_public_api_covers_the_commands():
    """The CLI is a thin layer over the public API: every job it runs is exported by packer."""
    import packer
    for job in ("build", "verify", "info", "repair", "convert", "export", "export_dataset", "merge", "append",
                "open_store", "BuildOptions"):
        assert job in packer.__all__, job


def _lint_with(tmp_path, module: str, line: str):
    """lint-imports over a copy of the tree in which ``module`` (a path under packer/) ends with
    ``line``: (return code, output)."""
    lint = shutil.which("lint-imports") or pytest.fail("import-linter is not installed (pip install -e .[dev])")
    shutil.copytree(REPO / "packer", tmp_path / "packer", ignore=shutil.ignore_patterns("__pycache__"))
    for pkg in ("readers", "gpu_ops"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so", "csrc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / "packer" / module
    planted.write_text(planted.read_text() + f"\n{line}  # noqa: E402,F401\n")
    r = subprocess.run([lint, "--config", "pyproject.toml", "--no-cache"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=240, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    return r.returncode, r.stdout


def test_the_contract_would_catch_a_new_cycle(tmp_path):
    """The layers contract is live: a module that imports back up makes lint-imports fail."""
    rc, out = _lint_with(tmp_path, "core/errors.py", "from packer.jobs import steps")
    assert rc != 0 and "packer.core is not allowed to import packer.jobs" in out, out[-3000:]


def test_the_acyclic_contract_would_catch_a_cycle_inside_a_layer(tmp_path):
    """The acyclic contract is live on its own: two sibling modules of one layer that import each
    other (core/uri.py back to core/errors.py, which imports uri) break it, though no layer rule
    does."""
    rc, out = _lint_with(tmp_path, "core/uri.py", "from packer.core import errors")
    assert rc != 0, out[-3000:]
    broken = out[out.index("Broken contracts"):] if "Broken contracts" in out else out
    assert "no import cycles between sibling modules" in broken and ".uri -> .errors" in broken, out[-3000:]
    assert "layers, each importing only from those below" not in broken, out[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
