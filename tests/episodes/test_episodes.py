"""Episodes (docs/architecture.md rule 9, episodes/): coroutines that ask the engine for turns and write the world's
answers as observation tokens into one record; whatever an episode does wrong is counted and scored
0, and the others go on."""
from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
import torch
from engine_helpers import WANDER_EOS, reference_logprobs, wandering_model

from aioareal.episodes import EpisodeContext, EpisodeRunner, TurnQueue, codec_for, load_episode
from aioareal.episodes.episode_worker import drive
from aioareal.episodes.runner import call_of
from aioareal.errors import UserError
from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.group import MODEL, OBS_VERSION, Example, Group
from aioareal.models.shapes import build_char_tokenizer
from aioareal.tools import Tool, ToolBox, build_toolbox

TOKENIZER = build_char_tokenizer()
PROMPT = TOKENIZER.encode("12*34=", add_special_tokens=False)


async def exact(text: str, example) -> tuple[float, bool]:
    return float(text.strip() == example.answer), False


def setup(chat: bool = False, budget: int = 24, timeout_s: float = 30.0, tools: ToolBox | None = None,
          greedy: bool = False, model=None):
    params = SamplingParams(greedy=greedy, max_new_tokens=budget)
    engine = Engine(model or wandering_model(), WANDER_EOS, EngineOptions(6, len(PROMPT) + 40, params, seed=1))
    codec = codec_for(TOKENIZER, chat)
    queue = TurnQueue(codec.decode_raw)
    ctx = EpisodeContext(queue, codec, tools or build_toolbox(["calculator"], [], 1.0, []), exact, budget, 2)
    return engine, queue, ctx


def run(engine, queue, runner, groups):
    return asyncio.run(drive(engine, queue, [runner.run_group(g) for g in groups]))


def group(gid: int = 0, size: int = 3) -> Group:
    return Group(gid, PROMPT, size, Example(str(gid), "12*34=", "408"))


async def two_turns(example, gen):
    first = await gen.turn(max_tokens=3)
    answer = await gen.call("calculator", "12*34")
    gen.observe(f"<{answer}>")
    second = await gen.turn(max_tokens=4)
    assert first.finish_reason in ("length", "stop") and second.text == gen.completion.turns[-1].text
    return 0.5


def test_a_two_turn_episode_fills_one_record_with_turns_observations_and_tool_calls():
    model = wandering_model()
    engine, queue, ctx = setup(model=model)
    g = group()
    rewards, failures = run(engine, queue, EpisodeRunner(two_turns, ctx), [g])[0]
    assert (rewards, failures) == ([0.5] * 3, 0) and [s.reward for s in g.samples] == rewards
    for c in g.completions:
        roles = [t.role for t in c.turns]
        assert roles[1] == "tool" and c.turns[1].text == "<408>"
        obs = c.turns[1]
        assert TOKENIZER.decode(c.tokens[obs.start:obs.end]) == "<408>"  # raw prompts: the text as it is
        assert c.versions[obs.start:obs.end] == [OBS_VERSION] * 5 and math.isnan(c.logprobs[obs.start])
        assert [t.name for t in c.tool_calls] == ["calculator"] and c.tool_calls[0].error is None
        assert c.text == TOKENIZER.decode(c.tokens, skip_special_tokens=True)
        mask = torch.tensor(c.model_mask())
        ref = reference_logprobs(model, PROMPT, c.tokens)  # the model's tokens, after the whole history
        torch.testing.assert_close(torch.tensor(c.logprobs)[mask], ref[mask], atol=1e-4, rtol=1e-4)
    assert not engine.busy and len(engine.free) == 6


def test_the_one_turn_episode_is_todays_single_completion():
    """single_turn samples the same tokens as a plain group (its G first turns share one prefill), and
    its record trains the same: no observation, every token the model's."""
    engine, queue, ctx = setup()
    episodic = group()
    run(engine, queue, EpisodeRunner(load_episode("single_turn"), ctx), [episodic])
    plain_engine = setup()[0]
    plain = group()
    plain_engine.submit(plain)
    while plain_engine.busy:
        plain_engine.step()
    for a, b in zip(plain.completions, episodic.completions):
        assert (a.tokens, a.logprobs, a.versions, a.finish_reason) == (b.tokens, b.logprobs, b.versions,
                                                                       b.finish_reason)
        assert b.model_mask() is None and [t.role for t in b.turns] == [MODEL]


def test_chat_prompts_get_observations_from_the_chat_template():
    codec = codec_for(TOKENIZER, chat=True)
    assert codec.check() == "template"
    assert codec.observation("42", "tool", before="") == "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n" \
                                                         "<|im_start|>assistant\n"
    # The model ended its turn at EOS: its end is not written twice.
    assert codec.observation("42", "tool", before="<|im_end|>") == "\n<|im_start|>tool\n42<|im_end|>\n" \
                                                                   "<|im_start|>assistant\n"
    assert codec_for(TOKENIZER, chat=False).observation("42", "tool", before="") == "42"


def test_a_template_that_refuses_a_role_falls_back_to_user_then_raw():
    class Strict:
        chat_template = "x"

        def __init__(self, allowed):
            self.allowed = allowed

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            if any(m["role"] not in self.allowed for m in messages):
                raise ValueError("unknown role")
            return "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"

    codec = codec_for(TOKENIZER, True)
    codec.template = Strict({"user", "assistant"})
    assert codec.check() == "template as user" and codec.observation("7", "tool", "") == "[user]7[assistant]"
    codec.template = Strict({"assistant"})
    assert codec.check() == "raw" and codec.observation("7", "tool", "") == "7"


async def raises(example, gen):
    await gen.turn(max_tokens=2)
    raise RuntimeError("a bug in the episode")


async def hangs(example, gen):
    await gen.turn(max_tokens=2)
    await asyncio.sleep(3600)


async def garbage(example, gen):
    await gen.turn(max_tokens=2)
    return "yes"


async def no_turn(example, gen):
    return 1.0


async def abandons_its_turn(example, gen):
    await asyncio.wait_for(gen.turn(max_tokens=20), timeout=0)  # stops waiting; the engine goes on
    return 1.0


@pytest.mark.parametrize("episode, why", [(raises, "raised RuntimeError: a bug in the episode"),
                                          (hangs, "ran past its timeout of 0.5s"),
                                          (garbage, "raised TypeError: returned 'yes', expected a finite number"),
                                          (no_turn, "ended without a model turn"),
                                          (abandons_its_turn, "raised TimeoutError")])
def test_a_bad_episode_scores_zero_is_counted_and_its_record_stays_whole(episode, why):
    engine, queue, ctx = setup(timeout_s=0.5)
    lines = []
    runner = EpisodeRunner(episode, ctx, timeout_s=0.5, log=lines.append)
    g = group(size=2)
    rewards, failures = run(engine, queue, runner, [g])[0]
    assert (rewards, failures, runner.stats.errors) == ([0.0, 0.0], 2, 2)
    assert len(lines) == 1 and why in lines[0]  # only the first failure is shown
    for s in g.samples:  # every sample holds a model token, its version and an end
        assert s.completion.tokens and s.version_min == 0 and s.completion.finish_reason
    assert not engine.busy and len(engine.free) == 6


async def blocks_the_loop(example, gen):
    await gen.turn(max_tokens=2)
    time.sleep(0.6)  # synchronous: the whole event loop waits
    return 1.0


def test_an_episode_that_blocks_the_loop_between_awaits_fails_and_is_counted():
    """A step that holds the loop past the runner's max_step_s fails the episode, named, scored 0
    (docs/reliability.md, user code); its turn is kept."""
    engine, queue, ctx = setup()
    lines = []
    runner = EpisodeRunner(blocks_the_loop, ctx, log=lines.append, max_step_s=0.2)
    g = group(size=2)
    rewards, failures = run(engine, queue, runner, [g])[0]
    assert (rewards, failures, runner.stats.errors) == ([0.0, 0.0], 2, 2)
    assert len(lines) == 1 and "raised LoopHeld: held the event loop for" in lines[0] and "limit 0.2s" in lines[0]
    assert all(s.completion.turns for s in g.samples)


def test_a_slow_tool_does_not_hold_the_engine():
    """A tool that answers only once the other episodes have taken all their turns: if waiting on it
    held the engine, it would time out instead."""
    others_done = asyncio.Event()
    finished: list[int] = []

    async def waits_for_the_others(arg):
        await others_done.wait()
        return "after the others"

    async def episode(example, gen):
        await gen.turn(max_tokens=2)
        if gen.index == 0:
            gen.observe(await gen.call("wait", ""))
        for _ in range(3):
            await gen.turn(max_tokens=2)
        finished.append(gen.index)
        if sorted(finished) == [1, 2]:
            others_done.set()
        return 1.0

    engine, queue, ctx = setup(tools=ToolBox([Tool("wait", waits_for_the_others, 20.0)]))
    g = group(size=3)
    run(engine, queue, EpisodeRunner(episode, ctx), [g])
    assert finished[2] == 0 and g.completions[0].tool_calls[0].error is None
    assert g.completions[0].turns[1].text == "after the others"


def test_calls_past_the_limit_are_error_observations():
    async def episode(example, gen):
        await gen.turn(max_tokens=1)
        return len([await gen.call("calculator", "1+1") for _ in range(3)])

    engine, queue, ctx = setup()  # max_calls=2
    g = group(size=1)
    run(engine, queue, EpisodeRunner(episode, ctx), [g])
    assert [c.error for c in g.completions[0].tool_calls] == [None, None, "limit"]


def test_episodes_load_by_name_and_import_path(tmp_path):
    path = tmp_path / "env.py"
    path.write_text("async def ep(example, gen):\n    return 1.0\n\nclass Env:\n    async def __call__(self, example, "
                    "gen):\n        return 0.0\n\ndef plain(example, gen):\n    return 1.0\n")
    assert load_episode("calculator").__name__ == "calculator"
    assert load_episode(f"{path}:ep").__name__ == "ep"
    assert type(load_episode(f"{path}:Env")).__name__ == "Env"
    with pytest.raises(UserError, match=r"episode '.*:plain' is not an async function"):
        load_episode(f"{path}:plain")
    with pytest.raises(UserError, match=r"episode '.*:nope': '.*env.py' has no attribute 'nope'"):
        load_episode(f"{path}:nope")


@pytest.mark.parametrize("text, call", [("<calc>12*34</calc>", "12*34"), ("so <calc>1+2</calc>", "1+2"),
                                        ("12*34</calc>", "12*34"), ("<calc>a</calc><calc>3-1</calc>", "3-1")])
def test_the_calculator_episode_reads_the_last_call(text, call):
    assert call_of(text) == call
    raw = text.replace("<calc>", "[").replace("</calc>", "]")
    assert call_of(raw, "[", "]") == call


def test_a_row_brings_its_system_prompt_and_tools_to_the_chat_template():
    from aioareal.tasks.base import PromptRenderer

    seen = {}

    class Template:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
            seen.update(messages=messages, **kwargs)
            return "rendered"

    renderer = PromptRenderer(Template(), chat=True, system_prompt="default")
    schema = [{"type": "function", "function": {"name": "calculator"}}]
    renderer.text(Example("1", "12*34?", "408", row={"system": "Use the calculator.", "tools": json.dumps(schema)}))
    assert seen["messages"][0] == {"role": "system", "content": "Use the calculator."} and seen["tools"] == schema
    seen.clear()
    renderer.text(Example("2", "1+1?", "2"))
    assert seen["messages"][0]["content"] == "default" and "tools" not in seen
    with pytest.raises(UserError, match="row 3: its 'tools' column is not JSON"):
        renderer.text(Example("3", "q", "a", row={"tools": "[nope"}))
