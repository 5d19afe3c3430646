"""House checks on the package's shape: every import points down the layers (LAYERS in
tests/layers.py; lazy imports inside functions and under `if TYPE_CHECKING:` included), no import
cycle, at most 12 modules loose at the package root, no file over 300 lines of code (docstrings,
comments and blank lines not counted: they should never be cut to fit), no function over 50, no
two modules with one file name, no whole Config below run/, tests in their package's folder."""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from layers import LAYERS, is_ancestor, layer_of

PACKAGE = Path(__file__).resolve().parents[2] / "aioareal"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 50
MAX_ROOT_MODULES = 12
MAX_LAYERS = 9  # few layers that say something (docs/architecture.md#layers)



def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Every module name an import statement may load: `from .x import y` loads `pkg.x`, and
    `pkg.x.y` too when y is a submodule rather than a name; `from . import m` loads `pkg.m`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {imported module: "file:line" of the first such import}. Only edges to modules of
    the package count. Loading `a.b.c` also runs `a/__init__` and `a/b/__init__`, so those get an
    edge too, unless the importer sits inside them (its own ancestors are already loading)."""
    mods = package_modules()
    graph: dict[str, dict[str, str]] = {m: {} for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in import_targets(module, path, node):
                parts = target.split(".")
                for name in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                    if name in mods and not is_ancestor(name, module):
                        where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                        if name != target and target in mods:
                            where += f", the package of {target}"
                        graph[module].setdefault(name, where)
    return graph


def strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm; returns the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph: dict[str, dict[str, str]], component: list[str], start: str) -> list[str]:
    """A shortest cycle through `start`, staying inside its component."""
    members = set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return paths[v] + [start]
                if w in members and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {component}")


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 1 and any(graph.values())  # the walk does find modules and their imports
    report = []
    for component in strongly_connected(graph):
        report.append(f"import cycle among {', '.join(component)}:")
        shown: set[str] = set()
        for start in component:  # cycles until every module of the component is on one
            if start not in shown:
                cycle = one_cycle(graph, component, start)
                shown.update(cycle)
                report += [f"    {a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    assert not report, "\n" + "\n".join(report)


def upward_imports(graph: dict[str, dict[str, str]]) -> list[str]:
    return [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)}) at {where}"
            for module, targets in sorted(graph.items()) for target, where in sorted(targets.items())
            if layer_of(target) > layer_of(module)]


def test_the_layers_are_few():
    assert len(LAYERS) <= MAX_LAYERS, f"{len(LAYERS)} layers in tests/layers.py: merge the ones that say nothing"


def test_every_module_has_a_layer():
    unplaced = [m for m in package_modules() if layer_of(m) is None]
    assert not unplaced, f"modules in no layer of LAYERS (place them): {unplaced}"


def test_every_import_points_down_the_layers():
    upward = upward_imports(import_graph())
    assert not upward, "\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import():
    graph = {"aioareal.trainer.trainer": {"aioareal.run.build": "aioareal/trainer/trainer.py:9",
                                          "aioareal.losses": "aioareal/trainer/trainer.py:10"},
             "aioareal.run.build": {"aioareal.trainer.trainer": "aioareal/run/build.py:20"}}
    assert upward_imports(graph) == ["aioareal.trainer.trainer (layer 4) imports aioareal.run.build (layer 6) "
                                     "at aioareal/trainer/trainer.py:9"]


def test_few_modules_sit_at_the_package_root():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= MAX_ROOT_MODULES, f"{len(loose)} modules at the root (give each a shelf): {loose}"


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of every module, class and function docstring."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return out


def code_lines(source: str) -> int:
    """Lines holding code: a token other than a comment or a line break, outside docstrings (a
    multi-line string or bracket counts each line it spans)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines(ast.parse(source)))


def test_code_lines_leave_out_docstrings_comments_and_blanks():
    source = ('"""Module\ndocstring."""\n\nimport os  # why\n\n\ndef f(x):\n    """Doc."""\n    # note\n'
              "    return (x +\n            1)\n")
    assert code_lines(source) == 4  # import, def, and the return's two lines


def test_no_file_over_300_lines():
    sizes = {path: code_lines(path.read_text()) for path in package_modules().values()}
    long = [f"{path.relative_to(PACKAGE.parent)}: {n} lines of code" for path, n in sorted(sizes.items())
            if n > MAX_FILE_LINES]
    assert not long, f"\nfiles over {MAX_FILE_LINES} lines of code:\n  " + "\n  ".join(long)


def function_sizes(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, line of the `def`, lines from the `def` to the function's last line)."""
    out: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_function_over_50_lines():
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name}: {n} lines"
            for path in package_modules().values() for name, line, n in function_sizes(path)
            if n > MAX_FUNCTION_LINES]
    assert not long, f"\nfunctions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(long)


def repeated_file_names(paths: list[Path]) -> dict[str, list[str]]:
    """File name -> the modules that share it (package markers aside), for names held by several."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    return {name: sorted(held) for name, held in sorted(by_name.items()) if len(held) > 1}


def test_each_file_name_has_one_meaning():
    repeated = repeated_file_names(list(package_modules().values()))
    assert not repeated, f"file names shared by several modules (name each for its job): {repeated}"


def test_the_name_check_sees_a_repeated_name():
    paths = [PACKAGE / "tools" / "loop.py", PACKAGE / "orchestrator" / "loop.py", PACKAGE / "tools" / "__init__.py",
             PACKAGE / "orchestrator" / "__init__.py"]
    assert repeated_file_names(paths) == {"loop.py": ["aioareal/orchestrator/loop.py", "aioareal/tools/loop.py"]}


# Lower layers get their own config section (`config.data`, `config.run`, ...) or plain values, never
# the whole run's `Config`: a module's inputs then say what it reads (issue 33: each question asked
# once). The modules below `aioareal.run` allowed to name it, each for a reason:
WHOLE_CONFIG_ALLOWED = {
    "aioareal.config": "defines, loads and validates it",
    "aioareal.checkpoint.resume_plan": "a resume decides which whole config the run continues under: it loads "
                                  "config.yaml and compares every key with the one given",
}


def whole_config_uses(module: str, source: str) -> list[str]:
    """Lines where `module` imports the root `Config` from aioareal.config or names it in an annotation."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "Config" for alias in node.names):
            path = Path(*module.split(".")).with_suffix(".py")
            target = import_targets(module, path, node)[0]
            if is_ancestor("aioareal.config", target):
                found.append(f"{module}:{node.lineno} imports Config from {target}")
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]
            annotations += [a.annotation for a in args if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for annotation in filter(None, annotations):
            if _names_config(annotation):
                found.append(f"{module}:{annotation.lineno} annotates with Config: {ast.unparse(annotation)}")
    return found


def _names_config(annotation: ast.expr) -> bool:
    for node in ast.walk(annotation):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
            try:
                if _names_config(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                pass
        if (isinstance(node, ast.Name) and node.id == "Config") or (isinstance(node, ast.Attribute)
                                                                   and node.attr == "Config"):
            return True
    return False


def test_no_module_below_run_takes_the_whole_config():
    run_layer = layer_of("aioareal.run")
    below = {m: p for m, p in package_modules().items() if layer_of(m) < run_layer
             and not any(is_ancestor(allowed, m) for allowed in WHOLE_CONFIG_ALLOWED)}
    assert "aioareal.tasks" in below and "aioareal.monitor.trackers" in below  # the walk does see them
    found = [line for m, p in sorted(below.items()) for line in whole_config_uses(m, p.read_text())]
    assert not found, "\npass the section (config.data, config.run, ...) or plain values:\n  " + "\n  ".join(found)


def test_the_whole_config_check_sees_an_import_and_annotations():
    source = ("from ..config import Config, DataConfig\n"
              "def build(config: 'Config', data: DataConfig) -> None: ...\n"
              "def run(cfg: schema.Config) -> None: ...\n"
              "held: Config | None = None\n")
    assert whole_config_uses("aioareal.tasks.example", source) == [
        "aioareal.tasks.example:1 imports Config from aioareal.config",
        "aioareal.tasks.example:2 annotates with Config: 'Config'",
        "aioareal.tasks.example:3 annotates with Config: schema.Config",
        "aioareal.tasks.example:4 annotates with Config: Config | None"]
    assert whole_config_uses("aioareal.tasks.example", "from ..config import DataConfig\n"
                                                       "def build(data: DataConfig) -> None: ...\n") == []


def test_tests_mirror_the_package_layout():
    """Each test file sits in tests/<package>/, named for the package (or root module) it tests, or in
    tests/architecture/ for the repository-wide rules; tests/ itself holds only shared helpers."""
    tests = PACKAGE.parent / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {
        p.stem for p in PACKAGE.glob("*.py")}
    assert folders - packages == {"architecture"}, f"test folders naming no package: {folders - packages}"
    assert not list(tests.glob("test_*.py")), "test files loose in tests/: put each in its package's folder"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files share a name (pytest imports them by file name)"
