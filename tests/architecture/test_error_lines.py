"""One function cuts every error line (issue 49, item 4): a line shown to the user as an error or a
warning goes through `errors.one_line` (or `terminal_safe`/`shown`), so no value read from a file,
a config or a model reaches the terminal whole or with its control characters.

The scan is deliberately simple. A *shown line* is a call of `print`, `log` or a `_warn`/`warn` helper
whose text starts with "error" or "warning", and any `print(..., file=sys.stderr)`. Its text must be
a plain string, a call of one of the cutting functions, or an f-string whose every value is either
cut by one of them or formatted as a number (`{n:,}`, `{x:.3f}`). `sys.exit` and `SystemExit` take a
status, never a message. Where a value is known to be safe (a number without a spec, our own
constant), wrap it anyway or format it as a number: the rule stays one sentence."""
from __future__ import annotations

import ast
from pathlib import Path

import aioareal

PACKAGE = Path(aioareal.__file__).parent
CUTTERS = {"one_line", "terminal_safe", "shown", "printable"}
SHOWERS = {"print", "log", "_warn", "warn"}
NUMBER_SPEC = set("0123456789,._%bdeEfFgGnxXo+- ")


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _is_cut(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _name(node.func) in CUTTERS


def _safe_text(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) or _is_cut(node):
        return True
    if isinstance(node, ast.JoinedStr):
        return all(_safe_part(part) for part in node.values)
    if isinstance(node, ast.BinOp):  # "a" + one_line(b)
        return _safe_text(node.left) and _safe_text(node.right)
    return False


def _safe_part(part: ast.AST) -> bool:
    if isinstance(part, ast.Constant):
        return True
    assert isinstance(part, ast.FormattedValue)
    if _is_cut(part.value) or isinstance(part.value, ast.Constant):
        return True
    spec = part.format_spec
    text = "".join(v.value for v in spec.values if isinstance(v, ast.Constant)) if spec else ""
    return bool(text) and set(text) <= NUMBER_SPEC and part.conversion == -1


def _starts_as_error(node: ast.AST) -> bool:
    first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
    text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    return text.lstrip("\n").startswith(("error", "warning"))


def _to_stderr(call: ast.Call) -> bool:
    return any(k.arg == "file" and _name(k.value) == "stderr" for k in call.keywords)


def offences(source: str, filename: str = "<source>") -> list[str]:
    """`filename:line: what` for each shown line that does not go through a cutting function."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name == "exit" and _name(getattr(node.func, "value", node.func)) == "sys" or name == "SystemExit":
            if node.args and not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, int)) \
                    and not isinstance(node.args[0], (ast.Call, ast.Name)):
                found.append(f"{filename}:{node.lineno}: {name} with a message (print it through one_line, exit 2)")
            continue
        if name not in SHOWERS or not node.args:
            continue
        text = node.args[0]
        if (_to_stderr(node) or _starts_as_error(text)) and not _safe_text(text):
            found.append(f"{filename}:{node.lineno}: {name}({ast.unparse(text)[:60]}...) not cut by one_line")
    return found


# Known and not yet fixed, each with why; an entry that no longer offends must go (the test says so).
NOT_YET: dict[tuple[str, str], str] = {}  # (file, snippet) -> why a known offender waits


def test_every_error_and_warning_line_goes_through_one_line():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += offences(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    known = [f for f in found if any(f.startswith(file) and snippet in f for file, snippet in NOT_YET)]
    assert [f for f in found if f not in known] == [], "\n".join(found)
    assert len(known) == len(NOT_YET), f"fixed, so take it out of NOT_YET: {sorted(NOT_YET)}"


PLANTED = {
    "an exception to stderr": "import sys\ntry:\n    pass\nexcept Exception as e:\n    print(e, file=sys.stderr)\n",
    "an f-string of a user value": "import sys\nprint(f'error: bad {path}', file=sys.stderr)\n",
    "a warning logged whole": "log(f'warning: row {uid} is odd')\n",
    "a message as the exit status": "import sys\nsys.exit(f'error: {e}')\n",
    "a repr of a value": "print(f'error: {value!r}: expected a number')\n",
}
ALLOWED = {
    "a cut line": "import sys\nprint(f'error: {one_line(e)}', file=sys.stderr)\n",
    "a whole line cut": "log(one_line(f'warning: row {uid} is odd'))\n",
    "numbers": "print(f'warning: {n:,} rows, {share:.0%} cut')\n",
    "a plain status": "import sys\nsys.exit(2)\n",
    "an ordinary line": "print(f'step {step}: {text}')\n",
}


def test_the_scan_finds_each_planted_way_and_passes_the_cut_ones():
    for what, source in PLANTED.items():
        assert offences(source), what
    for what, source in ALLOWED.items():
        assert not offences(source), what


def test_an_unknown_command_is_one_cut_line(capsys):
    from aioareal.cli import main

    assert main(["\x1b[2J" + "k" * 300_000]) == 2  # a word that is no command, quoted in the error
    err = capsys.readouterr().err
    assert err.startswith("error: unknown command '\\x1b[2Jkkk") and err.count("\n") == 1
    assert "\x1b" not in err and len(err) < 1_200
