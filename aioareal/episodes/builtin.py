"""Episodes that ship with aioareal (`data.episode=<name>`); a user's own is named by import path.

single_turn   today's single completion as an episode: one turn, the task's verdict on it.
calculator    arithmetic with a calculator: the model may call it (up to tools.max_calls times) and
              gets the result back as an observation; the text of its last turn is its answer.
              After chat prompts a call is `<calc>EXPR</calc>` and the result comes back as a `tool`
              message written by the chat template. After raw prompts (the tiny model's character
              tokens, where every character is a token to train and decode) the call is compact:
                  347*582=[347*582]{201954}201954
              model: `[347*582]` (a call), world: `{201954}`, model: `201954` and EOS.
"""
from __future__ import annotations

from typing import Any

from .handle import EpisodeGen

CALL, END = "<calc>", "</calc>"  # after chat prompts
RAW_CALL, RAW_END = "[", "]"  # after raw prompts
RAW_RESULT = "{{{}}}"  # the result after raw prompts: {201954}


async def single_turn(example: Any, gen: EpisodeGen) -> None:
    await gen.turn()


async def calculator(example: Any, gen: EpisodeGen) -> float:
    start, end = (CALL, END) if gen.chat else (RAW_CALL, RAW_END)
    turn = await gen.turn(stop=[end])
    while turn.stop == end and gen.calls_left > 0:
        result = await gen.call("calculator", call_of(turn.text, start, end))
        gen.observe(result if gen.chat else RAW_RESULT.format(result))
        turn = await gen.turn(stop=[end])
    return await gen.score(turn.text)


def call_of(text: str, start: str = CALL, end: str = END) -> str:
    """The expression of the call a turn ends with: between the last `start` and `end`."""
    body = text[:text.rfind(end)] if end in text else text
    return body[body.rfind(start) + len(start):] if start in body else body


BUILTIN = {"single_turn": single_turn, "calculator": calculator}
