"""Tools that cannot hurt the host (docs/architecture.md rule 9): the calculator parses bounded arithmetic and
refuses everything else; a user's tool that raises, hangs or returns garbage is an error observation,
counted, and the caller goes on."""
from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.errors import ConfigError, UserError
from aioareal.lab.simulate.virtualclock import run_virtual
from aioareal.tools import CalculatorError, Tool, ToolBox, build_toolbox, calculate, load_tools


@pytest.mark.parametrize("expression, value", [
    ("123*456", "56088"), ("2**10", "1024"), ("7/2", "3.5"), ("1/3", "0.333333333333"), ("-3+4*(2-5)", "-15"),
    ("10//3", "3"), ("10%3", "1"), ("3 x 4", "12"), ("2^8", "256"), ("1,234+1", "1235"), ("0.1+0.2", "0.3"),
    ("12 × 3 ÷ 4", "9"), (" 5 ", "5"), ("2**-2", "0.25"), ("(1+2)*(3+4)", "21")])
def test_the_calculator_computes_exactly(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('ls')", "unsupported"), ("open('x')", "unsupported"), ("a+1", "unsupported"),
    ("(1).__class__", "unsupported"), ("'a'*3", "unsupported"), ("[1,2]", "unsupported"), ("1<2", "unsupported"),
    ("9**9**9", "digits"), ("10**41", "digits"), ("1e999", "digits"), ("2**0.5", "integer exponents"),
    ("1/0", "division by zero"), ("5%0", "division by zero"), ("0**-1", "division by zero"), ("(1+", "not an"),
    ("", "not an"), ("1" * 201, "longer than"), ("+".join(["1"] * 70), "operations"), ("lambda: 1", "unsupported")])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, why):
    with pytest.raises(CalculatorError, match=why):
        calculate(expression)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/%().^ xe", max_size=60))
def test_property_any_text_gives_a_value_or_a_calculator_error(text):
    try:
        assert isinstance(calculate(text), str)
    except CalculatorError:
        pass


small = st.integers(-999, 999)


@settings(max_examples=200, deadline=None)
@given(a=small, b=small, c=small, ops=st.tuples(st.sampled_from("+-*"), st.sampled_from("+-*")))
def test_property_integer_arithmetic_agrees_with_python(a, b, c, ops):
    expression = f"{a}{ops[0]}({b}){ops[1]}{c}"
    assert calculate(expression) == str(eval(expression))  # the test's own, trusted expression


async def _ok(arg: str) -> str:
    return arg.upper()


async def _raises(arg: str) -> str:
    raise RuntimeError("the service is down\nsecond line")


async def _hangs(arg: str) -> str:
    await asyncio.sleep(60)  # a timeout that did not fire fails the test (error None), it does not hang it
    return "never"


RELEASE, BLOCKS_RETURNED = threading.Event(), threading.Event()


def _blocks(arg: str) -> str:  # a plain function that hangs: it runs in a thread, abandoned at the timeout
    RELEASE.wait(60)
    BLOCKS_RETURNED.set()
    return "late"


async def _garbage(arg: str) -> object:
    return {"not": "text"}


def _long(arg: str) -> str:
    return "x" * 5000


def test_bad_tools_give_error_observations_counted_and_the_caller_goes_on():
    box = ToolBox([Tool(f.__name__.strip("_"), f, timeout_s=0.2) for f in (_ok, _raises, _hangs, _blocks, _garbage,
                                                                            _long)])

    async def calls():
        return [await box.call(name, "q") for name in ("ok", "raises", "hangs", "blocks", "garbage", "long", "nope")]

    RELEASE.clear()
    BLOCKS_RETURNED.clear()
    try:
        ok, raises, hangs, blocks, garbage, long, unknown = asyncio.run(calls())
        # The call came back while the blocked tool was still blocked: cut at its timeout, not waited out.
        assert not BLOCKS_RETURNED.is_set()
    finally:
        RELEASE.set()
    assert (ok.text, ok.error) == ("Q", None)
    assert (raises.text, raises.error) == ("error: the service is down", "raised")
    assert (hangs.error, blocks.error) == ("timeout", "timeout") and hangs.text.startswith("error: hangs did not")
    assert garbage.text == "error: garbage returned dict, not text" and garbage.error == "garbage"
    assert long.error is None and len(long.text) == 1001 and long.text.endswith("…")
    assert unknown.text.startswith("error: unknown tool 'nope' (tools: ok, raises")
    assert (box.stats.calls, box.stats.errors, box.stats.timeouts) == (7, 3, 2)
    assert box.stats.metrics() == {"tool_calls_total": 7, "tool_errors_total": 5, "tool_timeouts_total": 2}


def test_the_calculator_tool_answers_and_refuses_as_observations():
    box = build_toolbox(["calculator"], [], timeout_s=1.0, latency_ms=[])

    async def calls():
        return await box.call("calculator", "123*456"), await box.call("calculator", "import os")

    good, bad = asyncio.run(calls())
    assert (good.text, bad.text, bad.error) == ("56088", "error: not an arithmetic expression", "raised")


def test_simulated_latency_is_seeded_and_within_its_range():
    """On the virtual clock each call's wait is exactly the latency it drew (the calculator answers
    inline), so the draws themselves are compared: the same seed, the same waits."""

    async def waits(box):
        loop, out = asyncio.get_running_loop(), []
        for _ in range(6):
            start = loop.time()
            assert (await box.call("calculator", "1+1")).text == "2"
            out.append(loop.time() - start)
        return out

    def box(seed):
        return build_toolbox(["calculator"], [], timeout_s=1.0, latency_ms=[20, 40], seed=seed)

    first, again, other = (run_virtual(waits(box(seed))) for seed in (3, 3, 4))
    assert first == again and first != other
    assert all(0.02 <= s <= 0.04 for s in first + other) and len(set(first)) == 6


def test_tools_load_by_name_and_import_path_with_one_line_errors(tmp_path):
    path = tmp_path / "mytools.py"
    path.write_text("async def search(query):\n    return 'found ' + query\n\ndef two(a, b):\n    return a\n")
    tools = load_tools(["calculator"], [f"{path}:search"], timeout_s=2.0)
    assert [t.name for t in tools] == ["calculator", "search"] and tools[1].timeout_s == 2.0
    with pytest.raises(ConfigError, match="config key 'tools.names': unknown tool 'calc'"):
        load_tools(["calc"], [], 1.0)
    with pytest.raises(UserError, match=r"tool '.*:two' has signature \(a, b\), which cannot take one argument"):
        load_tools([], [f"{path}:two"], 1.0)
    with pytest.raises(UserError, match=r"tool '.*:nothing': '.*mytools.py' has no attribute 'nothing' "
                                        r"\(its functions: search, two\)"):
        load_tools([], [f"{path}:nothing"], 1.0)
    with pytest.raises(ConfigError, match="two tools are named 'search'"):
        load_tools([], [f"{path}:search", f"{path}:search"], 1.0)
