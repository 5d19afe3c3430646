"""The pieces of scale-out that need no second process: merging the ranks' rows, the cell's
config, the prompt split, resharded counters, the safe reading of DCP shards, --resume auto, and
that without torchrun nothing of it shows."""
from __future__ import annotations

import asyncio
import json
import math
import pickle
from statistics import pstdev

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from aioareal.checkpoint import RunState
from aioareal.checkpoint.resume_plan import resume_target
from aioareal.checkpoint.safeload import UnsafeFile, check_shards, read_metadata
from aioareal.checkpoint.sharded import rank_state
from aioareal.config import load_config
from aioareal.distributed.world import World, is_collective_failure, rank_error
from aioareal.errors import ConfigError, UserError
from aioareal.group import Example
from aioareal.orchestrator import StepReport
from aioareal.orchestrator.loop import PromptSource
from aioareal.run.cell import LocalCell, cell_for, session
from aioareal.run.rank_hooks import RankHooks, merge_rows, merge_samples
from aioareal.run.recipe import train
from aioareal.run.sharded_cell import cell_config

TWO = World(rank=0, size=2, control=object())  # a stand-in: only the rank and size are read


def test_merged_row_sums_counts_averages_samples_and_takes_the_stalest():
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
    rows = [{"step": 3, "time": 1.0 + r, "reward_mean": sum(x) / 4, "reward_std": pstdev(x), "staleness_max": 2 - 2 * r,
             "gen_version": 3 - r, "gen_tokens_per_s": 100.0, "groups_trained": 6, "gen_idle_frac": 0.25 * r,
             "train_idle_frac": 0.5, "loss": 0.125} for r, x in enumerate(rewards)]
    merged = merge_rows(rows)
    union = rewards[0] + rewards[1]
    assert merged["reward_mean"] == pytest.approx(sum(union) / 8)
    assert merged["reward_std"] == pytest.approx(pstdev(union))
    assert (merged["staleness_max"], merged["gen_version"], merged["time"]) == (2, 2, 2.0)
    assert (merged["gen_tokens_per_s"], merged["groups_trained"], merged["loss"]) == (200.0, 12, 0.125)
    assert merged["gen_busy_ranks"] == [1.0, 0.75] and merged["world_size"] == 2
    assert [s["rank"] for s in merge_samples([[{"group_id": 0}], [{"group_id": 0}, {"group_id": 1}]])] == [0, 1, 1]


def test_cell_config_gives_each_rank_its_share_of_whole_groups():
    config = load_config(overrides=["algo.batch_groups=8", "algo.minibatches=2"])
    cell = cell_config(config, TWO)
    assert (cell.algo.batch_groups, cell.dist.world_size, config.algo.batch_groups) == (4, 2, 8)
    assert LocalCell().config(config) is config and cell_for(World()).config(config) is config
    with pytest.raises(ConfigError, match="algo.batch_groups.*divisible by the number of ranks \\(3\\)"):
        cell_config(config, World(size=3, control=object()))
    with pytest.raises(ConfigError, match="algo.minibatches"):
        cell_config(load_config(overrides=["algo.batch_groups=4", "algo.minibatches=4"]), TWO)


def test_ranks_draw_disjoint_prompts_that_together_are_the_single_process_stream():
    examples = [Example(str(i), str(i), "") for i in range(7)]
    def draws(stride: int, offset: int, n: int) -> list[str]:
        source = PromptSource(examples, lambda e: [], seed=3, stride=stride, offset=offset)
        return [source.next()[0].uid for _ in range(n)]
    single = draws(1, 0, 20)
    assert draws(2, 0, 10) == single[0::2] and draws(2, 1, 10) == single[1::2]


def test_rank_state_is_exact_on_the_same_world_and_restarts_after_the_slowest_rank_on_another():
    ranks = [{"cursor": 10, "ledger": {"trained": 8, "rejected": 1}, "reward_failures": 2},
             {"cursor": 12, "ledger": {"trained": 8, "dropped_stale": 3}, "reward_failures": 1}]
    state = RunState(step=4, cursor=10, elapsed=5.0, ranks=ranks)
    same = rank_state(state, World(rank=1, size=2, control=object()), local_batch=2)
    assert (same.cursor, same.ledger, same.reward_failures, same.ranks) == (12, ranks[1]["ledger"], 1, [])
    one = rank_state(state, World(), local_batch=4)  # 2 ranks -> 1 process
    assert (one.cursor, one.ledger, one.reward_failures) == (20, {"trained": 16, "dropped_stale": 3, "rejected": 1}, 3)


class Planted:
    def __reduce__(self):
        return (exec, ("open('PLANTED', 'w').close()",))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_shard_metadata_is_read_without_running_code_and_non_tensor_entries_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good"
    dcp.save({"w": torch.arange(6.0)}, checkpoint_id=good, no_dist=True)
    assert set(read_metadata(good).state_dict_metadata) == {"w"}
    check_shards(good)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / ".metadata").write_bytes(pickle.dumps(Planted()))
    with pytest.raises(UnsafeFile, match="builtins.exec"):
        read_metadata(planted)
    assert not (tmp_path / "PLANTED").exists()
    both = tmp_path / "both"
    dcp.save({"w": torch.zeros(2), "note": "text"}, checkpoint_id=both, no_dist=True)
    with pytest.raises(UnsafeFile, match="non-tensor entries \\(note\\)"):
        read_metadata(both)
    shard = next(good.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])  # a torn write
    with pytest.raises(ValueError, match="metadata says"):
        check_shards(good)


def test_resume_auto_continues_a_run_directory_that_holds_a_run_and_starts_it_otherwise(tmp_path):
    with pytest.raises(UserError, match="--resume auto needs --run-dir"):
        resume_target("auto", None, None)
    assert resume_target("auto", str(tmp_path / "new"), "configs/x.yaml") is None
    (tmp_path / "config.yaml").write_text("run: {seed: 0}\n")
    assert resume_target("auto", str(tmp_path), "configs/x.yaml") == tmp_path
    with pytest.raises(UserError, match="drop --config"):
        resume_target(str(tmp_path), None, "configs/x.yaml")


def test_a_failed_collective_becomes_one_line_naming_the_rank_and_the_timeout():
    error = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:41114")
    assert is_collective_failure(error) and not is_collective_failure(ValueError("bad input"))
    message = str(rank_error(World(rank=1, size=4, timeout_s=30.0, control=object()), error))
    assert message.startswith("rank 1 of 4: a collective") and "dist.timeout_s=30 s" in message
    assert rank_error(World(), error).exit_code == 4


def test_without_torchrun_a_run_is_the_single_process_run(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    config = load_config(overrides=["model.name=random:tiny", "algo.batch_groups=2", "algo.group_size=2",
                                    "train.steps=1", "data.eval_size=4", "run.dashboard=off"],
                         flags={"run.run_dir": str(tmp_path / "run")})
    with session(config) as world:
        assert world == World() and not dist.is_initialized()
        run_dir = train(config, log=lambda *_: None, printer=lambda row: None)
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    sample = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    state = json.loads((run_dir / "checkpoints" / "step-000001" / "state.json").read_text())
    assert "world_size" not in row and "rank" not in sample and "ranks" not in state
    assert not (run_dir / "checkpoints" / "step-000001" / "shards").exists() and not math.isnan(row["loss"])


class Recorder:
    def __init__(self) -> None:
        self.steps: list = []
        self.stops: list = []

    async def on_step(self, report) -> None:
        self.steps.append(report)

    async def on_stop(self, state) -> None:
        self.stops.append(state)


class OtherRankAsked(World):
    """Rank 0 of 2, where rank 1 reports the same step with SIGTERM (15) pending."""

    def all_gather(self, obj):
        if isinstance(obj, tuple):  # a step report
            row, samples, state, _ = obj
            return [obj, ({**row, "reward_mean": 1.0, "staleness_max": 5}, samples, {**state, "cursor": 99}, 15)]
        return [obj, {**obj, "cursor": 99}]


def test_rank_hooks_merge_the_reports_and_stop_every_rank_when_any_asked():
    inner = Recorder()
    hooks = RankHooks(inner, OtherRankAsked(rank=0, size=2, control=object()))
    row = {"step": 1, "time": 2.0, "reward_mean": 0.0, "reward_std": 0.0, "staleness_max": 1}
    state = RunState(step=1, cursor=7, elapsed=2.0, ledger={"trained": 2})
    stop = asyncio.run(hooks.on_step(StepReport(1, row, [{"group_id": 0, "staleness": 1}], [], state)))
    asyncio.run(hooks.on_stop(state))
    hooks.close()
    assert stop == 15 and not hooks.stop_requested  # rank 1's signal stops this rank too
    merged = inner.steps[0]
    assert (merged.row["reward_mean"], merged.row["staleness_max"], merged.row["world_size"]) == (0.5, 5, 2)
    assert [s["rank"] for s in merged.samples] == [0, 1]
    assert [r["cursor"] for r in merged.state.ranks] == [7, 99] and merged.state.cursor == 7
    assert [r["cursor"] for r in inner.stops[0].ranks] == [7, 99]


def test_lora_under_torchrun_is_refused_by_name():
    config = load_config(overrides=["model.lora_rank=8"])
    with pytest.raises(ConfigError, match="model.lora_rank"):
        cell_config(config, World(rank=0, size=2, control=object()))
