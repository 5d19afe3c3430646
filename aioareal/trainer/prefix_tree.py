"""A micro-batch's sequences as a prefix tree: every distinct prefix computed once.

Causal attention makes a position's hidden state a function of its prefix alone. The G completions
of a group often begin alike or are identical, and prompts may share a template, so the
micro-batch's distinct prefixes become the nodes of a trie; each node is one input position,
attending to its ancestors and itself at its depth's position id. Log-probs and gradients are the
padded path's up to rounding: a node shared by k sequences receives their k gradients' sum through
the gathers below.

Layout, built on the host (no device reads):
  input_ids (r, T): each row's nodes, ancestors first, right-padded. Whole sequences go to a row,
    sorted so shared prefixes sit together, at most `row_len` nodes a row (bounding the (T, T) mask);
  position_ids (r, T): a node's depth, from 0;
  mask (r, 1, T, T) bool: a node attends to its ancestors and itself (padding to itself);
  pair_node, pair_target (u,): each distinct (prefix, next token) pair the loss needs: the flat index
    (row * T + node) of the prefix's last node and its target, so identical completions also share
    the LM head;
  pair_index (n,): each completion token, in loss_mask's order -> its pair (an episode's observation
    tokens are nodes but predict no pair).

It is taken only where it computes clearly fewer positions (`worthwhile_plan`): its mask costs
(T, T) per row, where the other layouts are plain causal attention.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import UserError
from ..group import Sample
from ..models.lora import decoder
from ..models.ops import ATTENTION

# Nodes per row: at most the CPU's short-attention key length (models/ops.py), so every row
# attends by two small matmuls. A longer single sequence gets a row of its own length.
ROW_LEN = 64
# Use the tree where it computes at most this fraction of the other layout's positions: below
# that the saved matmuls outweigh the per-row mask it adds (CPU, default run).
WORTH_IT = 0.8
# train.prefix_tree as the packer takes it: never, where it computes few enough positions, always.
TreeSetting = Literal[False, "auto", True]
Plan = tuple[list["_Row"], list[tuple[int, list[int]]]]  # the rows, and each sample's (row, prefix nodes)


@dataclass
class PrefixTree:
    input_ids: torch.Tensor  # (r, T) long
    position_ids: torch.Tensor  # (r, T) long
    mask: torch.Tensor  # (r, 1, T, T) bool: True attends
    pair_node: torch.Tensor  # (u,) long: flat index into (r * T) of the node predicting each pair
    pair_target: torch.Tensor  # (u,) long: the token each pair predicts
    pair_index: torch.Tensor  # (n,) long: each completion token, in loss_mask's order -> its pair

    @property
    def positions(self) -> int:
        """Token positions the model computes for this layout, padding included."""
        return self.input_ids.numel()

    def attention_masks(self) -> dict[str, torch.Tensor]:
        """The model's mask mapping: transformers takes it as given and builds no causal mask."""
        return {"full_attention": self.mask, "sliding_attention": self.mask}


class _Row:
    """One row's trie: node ids by (parent node, token), with each node's token, depth and parent."""

    def __init__(self) -> None:
        self.children: dict[tuple[int, int], int] = {}
        self.tokens: list[int] = []
        self.depths: list[int] = []
        self.parents: list[int] = []

    def known_depth(self, path: list[int]) -> int:
        """How many leading tokens of `path` are already nodes of this row."""
        node, depth = -1, 0
        for token in path:
            node = self.children.get((node, token), -2)
            if node == -2:
                break
            depth += 1
        return depth

    def add(self, path: list[int]) -> list[int]:
        """Insert `path`; returns the node of each of its prefixes (index d: the first d + 1 tokens)."""
        nodes, node = [], -1
        for depth, token in enumerate(path):
            child = self.children.get((node, token))
            if child is None:
                child = self.children[(node, token)] = len(self.tokens)
                self.tokens.append(token)
                self.depths.append(depth)
                self.parents.append(node)
            nodes.append(child)
            node = child
        return nodes


def plan_rows(samples: list[Sample], row_len: int = ROW_LEN) -> Plan:
    """The rows' tries, and for each sample its row and the node of each prefix of its inputs."""
    seqs = [s.prompt_ids + s.tokens for s in samples]
    order = sorted(range(len(samples)), key=lambda i: seqs[i])  # shared prefixes side by side
    rows: list[_Row] = []
    paths: list[tuple[int, list[int]]] = [(0, [])] * len(samples)
    for i in order:
        path = seqs[i][:-1]  # a sequence's inputs: all its tokens but the last, which is only predicted
        row = rows[-1] if rows else None
        if row is None or (row.tokens and len(row.tokens) + len(path) - row.known_depth(path) > row_len):
            row = _Row()
            rows.append(row)
        paths[i] = (len(rows) - 1, row.add(path))
    return rows, paths


def _width(rows: list[_Row]) -> int:
    return max(len(r.tokens) for r in rows)


def worthwhile_plan(samples: list[Sample], other_positions: int, always: bool = False,
                    row_len: int = ROW_LEN) -> tuple[Plan, int] | None:
    """The planned rows and their positions if the tree computes at most WORTH_IT x `other_positions`
    (or `always`), else None; never a plan without a single input position."""
    planned = plan_rows(samples, row_len)
    positions = len(planned[0]) * _width(planned[0])
    if positions == 0 or not always and positions > WORTH_IT * other_positions:
        return None
    return planned, positions


def build_tree(samples: list[Sample], pad_id: int, row_len: int = ROW_LEN, planned: Plan | None = None) -> PrefixTree:
    """The prefix-tree layout of these samples (CPU tensors; `tree_to` moves them); `planned`: their
    `plan_rows`, where the caller has it already (the mask is built only for a tree that is taken)."""
    rows, paths = planned or plan_rows(samples, row_len)
    width = _width(rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        input_ids[r, :len(row.tokens)] = torch.tensor(row.tokens, dtype=torch.long)
        position_ids[r, :len(row.depths)] = torch.tensor(row.depths, dtype=torch.long)
    return PrefixTree(input_ids, position_ids, _ancestor_mask(rows, width), *_pairs(samples, paths, width))


def _ancestor_mask(rows: list[_Row], width: int) -> torch.Tensor:
    """(r, 1, T, T) bool: each node's ancestors and itself; a padding position sees itself only."""
    r_idx: list[int] = []
    q_idx: list[int] = []
    k_idx: list[int] = []
    for r, row in enumerate(rows):
        ancestors: list[list[int]] = []
        for node, parent in enumerate(row.parents):  # parents come before their children
            line = (ancestors[parent] if parent >= 0 else []) + [node]
            ancestors.append(line)
            r_idx.extend([r] * len(line))
            q_idx.extend([node] * len(line))
            k_idx.extend(line)
        pad = range(len(row.tokens), width)
        r_idx.extend([r] * len(pad))
        q_idx.extend(pad)
        k_idx.extend(pad)
    mask = torch.zeros(len(rows), width, width, dtype=torch.bool)
    mask[torch.tensor(r_idx), torch.tensor(q_idx), torch.tensor(k_idx)] = True
    return mask[:, None]


def _pairs(samples: list[Sample], paths: list[tuple[int, list[int]]],
           width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct (predicting node, target) pairs, and each completion token's pair in loss_mask's order."""
    pairs: dict[tuple[int, int], int] = {}
    nodes: list[int] = []
    targets: list[int] = []
    index: list[int] = []
    for s, (r, path) in zip(samples, paths):
        seq = s.prompt_ids + s.tokens
        first = len(s.prompt_ids) - 1  # the prompt's last token predicts the completion's first
        model = s.completion.model_mask()  # episodes: observation tokens are inputs, never targets
        for t in range(first, len(seq) - 1):
            if model is not None and not model[t - first]:
                continue
            key = (r * width + path[t], seq[t + 1])
            pair = pairs.get(key)
            if pair is None:
                pair = pairs[key] = len(nodes)
                nodes.append(key[0])
                targets.append(key[1])
            index.append(pair)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return as_long(nodes), as_long(targets), as_long(index)


def tree_to(tree: PrefixTree, device: torch.device) -> PrefixTree:
    put = dict(device=device, non_blocking=True)
    return PrefixTree(*(getattr(tree, f).to(**put) for f in PrefixTree.__dataclass_fields__))


def tree_hidden(model: torch.nn.Module, tree: PrefixTree) -> torch.Tensor:
    """Hidden states of the nodes that predict each distinct pair: (u, H)."""
    hidden = decoder(model)(input_ids=tree.input_ids, attention_mask=tree.mask,
                             position_ids=tree.position_ids, use_cache=False).last_hidden_state  # (r, T, H)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, tree.pair_node)


def use_tree(setting: bool | str, device: torch.device, model: torch.nn.Module, compiled: bool) -> TreeSetting:
    """train.prefix_tree (true, false or "auto") -> never, per micro-batch where it pays, or always.
    The tree's masks need the project's attention ("aioareal"). "auto" is on where it was measured
    to pay (the CPU), and off for compiled layers (a recompile per mask shape)."""
    attention = getattr(model.config, "_attn_implementation", None)
    if setting == "auto":
        return "auto" if device.type == "cpu" and attention == ATTENTION == "aioareal" and not compiled else False
    if setting and attention != "aioareal":
        raise UserError(f"train.prefix_tree=true needs the model's attention implementation 'aioareal' (models load "
                        f"with it on transformers >= 4.53), but it is {attention!r}; set train.prefix_tree=false")
    if setting and compiled:
        raise UserError("train.prefix_tree=true does not combine with train.compile=true (each micro-batch's tree "
                        "mask has a new shape, a recompile); set one of them to false")
    return True if setting else False
