"""The turns episodes ask for, on their way to the engine, and the futures the episodes await.

An episode's `turn()` only queues an ask; the engine's driver (episode_worker.py) hands them over
between two steps (`feed`) and resolves the futures of ended turns after each (`resolve`). The first
turns of a group's episodes with the same stops and budget merge into one request: one prefill, as a
plain group's.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ..generation.turns import StopStrings, TurnRequest
from ..group import Group


@dataclass
class Ask:
    group: Group
    index: int
    stop: tuple[str, ...]
    max_tokens: int
    future: asyncio.Future
    first: bool  # the episode's first ask (until then it holds a place among its group's)


class TurnQueue:
    def __init__(self, decode_raw: Callable[[list[int]], str]) -> None:
        self.decode_raw = decode_raw
        self.pending: list[Ask] = []
        self.waiting: dict[tuple[int, int], asyncio.Future] = {}  # (id(group), index) -> its turn's future
        self.on_ask: Callable[[Ask], None] = lambda ask: None  # the driver's wake-up: work arrived by itself

    def ask(self, group: Group, index: int, stop: tuple[str, ...], max_tokens: int,
            first: bool = False) -> asyncio.Future:
        """Queue a turn for sample `index` of `group`; the future is done when its turn has ended."""
        ask = Ask(group, index, stop, max_tokens, asyncio.get_running_loop().create_future(), first)
        self.pending.append(ask)
        self.on_ask(ask)
        return ask.future

    @property
    def pending_sequences(self) -> int:
        return len(self.pending)

    def feed(self, submit: Callable[[TurnRequest], None]) -> int:
        """Hand every pending ask to `submit` (the engine's `submit_turn`); returns how many."""
        merged: dict[tuple, TurnRequest] = {}
        requests: list[TurnRequest] = []
        for ask in self.pending:
            self.waiting[(id(ask.group), ask.index)] = ask.future
            fresh = not ask.group.samples[ask.index].completion.tokens
            key = (id(ask.group), ask.stop, ask.max_tokens)
            if fresh and key in merged:
                merged[key].indices.append(ask.index)
                continue
            stop = StopStrings(ask.stop, self.decode_raw) if ask.stop else None
            request = TurnRequest(ask.group, [ask.index], stop, ask.max_tokens)
            requests.append(request)
            if fresh:
                merged[key] = request
        count = len(self.pending)
        self.pending = []
        for request in requests:
            try:
                submit(request)
            except ValueError as e:  # the engine cannot serve it: the episode's `turn()` raises, not hangs
                for index in request.indices:
                    self.waiting.pop((id(request.group), index)).set_exception(RuntimeError(str(e)))
        return count

    def resolve(self, ended: list[tuple[TurnRequest, int]]) -> None:
        """The engine reported these sequences' turns over: wake their episodes."""
        for request, index in ended:
            future = self.waiting.pop((id(request.group), index))
            if not future.done():  # an episode that stopped waiting (cancelled) learns nothing
                future.set_result(None)
