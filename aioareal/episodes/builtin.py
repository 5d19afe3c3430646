"""Episodes that ship with aioareal (`data.episode=<name>`); a user's own is named by import path.

single_turn   today's single completion as an episode: one turn, the task's verdict on it.
calculator    arithmetic with a calculator: the model may write `<calc>EXPR</calc>` (up to
              tools.max_calls times); the tool's answer comes back as an observation, written
              `<result>56088</result>` after raw prompts and as a `tool` message by the chat
              template after chat prompts; the model's last turn is its answer:
                  347*582=<calc>347*582</calc><result>201954</result>201954
"""
from __future__ import annotations

from typing import Any

from .handle import EpisodeGen

CALL, END = "<calc>", "</calc>"


async def single_turn(example: Any, gen: EpisodeGen) -> None:
    await gen.turn()


async def calculator(example: Any, gen: EpisodeGen) -> float:
    turn = await gen.turn(stop=[END])
    while turn.stop == END and gen.calls_left > 0:
        result = await gen.call("calculator", call_of(turn.text))
        gen.observe(result if gen.chat else f"<result>{result}</result>")
        turn = await gen.turn(stop=[END])
    return await gen.score(turn.text)


def call_of(text: str) -> str:
    """The expression of the call a turn ends with: between the last <calc> and </calc>."""
    body = text[:text.rfind(END)] if END in text else text
    return body[body.rfind(CALL) + len(CALL):] if CALL in body else body


BUILTIN = {"single_turn": single_turn, "calculator": calculator}
