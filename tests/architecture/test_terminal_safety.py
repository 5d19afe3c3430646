"""Terminal output never trusts data (issue 35, item 6): control characters (ANSI CSI and OSC
escapes, \\r, BEL, C1, bidirectional overrides) in prompt ids, completions, config keys, run names
and error messages are printed as visible escapes, and data inside rich markup is escaped, in the
`samples` command, error lines and the dashboard (errors.terminal_safe, docs/reliability.md)."""
from __future__ import annotations

import io
import json

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from aioareal.cli import main
from aioareal.errors import UserError, guarded, one_line, terminal_safe
from aioareal.monitor.dashboard import render
from aioareal.monitor.metrics import Snapshot

HOSTILE = ["\x1b[2J", "\x1b]0;owned\x07", "[bold red]x[/]", "\r", "\x9b31m", "\u202eevil", "\x00\x08\x7f"]
RAW = ("\x1b", "\r", "\x07", "\x9b", "\u202e", "\x00", "\x08", "\x7f")


def assert_inert(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)


@given(st.text())
def test_terminal_safe_leaves_no_control_character(text: str) -> None:
    safe = terminal_safe(text)
    assert all(c in "\n\t" or c.isprintable() or c in "\u200d\u00ad" for c in safe), repr(safe)
    assert "\n" not in one_line(text) and "\r" not in one_line(text)
    if all(c.isprintable() and c not in "\\" for c in text):  # printable text is left as it is
        assert terminal_safe(text) == text


def test_hostile_strings_become_visible_escapes() -> None:
    assert terminal_safe("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert one_line("x\ny\rz") == "x\\ny\\rz"
    assert terminal_safe("x\ny\tz") == "x\ny\tz"
    assert terminal_safe("\u202eevil") == "\\u202eevil"


def test_samples_output_escapes_every_field(tmp_path, capsys) -> None:
    rows = [{"step": 1, "reward": 1.0, "advantage": 0.5, "staleness": h, "prompt_id": h, "prompt": f"p{h}",
             "text": f"t{h}"} for h in HOSTILE]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["samples", str(tmp_path), "-n", "0"]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    assert "prompt \\x1b[2J" in out and "[bold red]x[/]" in out


def test_error_lines_escape_keys_and_messages(capsys) -> None:
    assert main(["config", "bad\x1b[31m\r.key=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "bad\\x1b[31m\\r" in err
    assert_inert(err)
    for hostile in HOSTILE:
        def fail(h: str = hostile) -> int:
            raise UserError(f"value {h}\nsecond line")
        assert guarded(False, fail) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, repr(err)
        assert_inert(err)


def draw(snap: Snapshot, header: object = None) -> tuple[str, str]:
    """(what the terminal receives, the screen's text) of one dashboard frame."""
    out = io.StringIO()
    console = Console(record=True, width=100, height=40, force_terminal=True, color_system="standard", file=out)
    console.print(render(snap, header))
    return out.getvalue(), console.export_text()


def test_dashboard_escapes_markup_and_control_characters() -> None:
    hostile = "".join(HOSTILE)
    snap = Snapshot(run_name=f"run{hostile}", mode=f"async{hostile}", objective=f"ppo{hostile}",
                    devices=f"cpu{hostile}", completion=f"answer {hostile}", completion_reward=1.0, completion_step=3)
    raw, text = draw(snap, header=f"sweep [bold red]x[/] {hostile}")
    assert "run\\x1b[2J" in text and "[bold red]x[/]" in text  # shown as written, not obeyed
    assert "sweep [bold red]x[/]" in text
    for c in ("\x1b]", "\x1b[2J", "\r", "\x07", "\u202e"):  # the styles rich adds are its own CSI codes
        assert c not in raw, repr(c)


def test_an_error_line_of_millions_of_characters_is_cut_to_a_readable_one(capsys, tmp_path) -> None:
    def fails() -> int:
        raise UserError("sweep.yaml: key 'name': " + "x" * 3_000_000 + " (expected a short name)")

    assert guarded(False, fails) == 2
    err = capsys.readouterr().err.strip()
    assert len(err) < 1_200 and err.startswith("error: sweep.yaml: key 'name': xxx")
    assert err.endswith("(expected a short name)") and "characters cut" in err
    # The command line end to end: an over-long config value.
    assert main([f"algo.objective={'z' * 500_000}"]) == 2
    assert len(capsys.readouterr().err) < 1_200
