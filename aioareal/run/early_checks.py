"""What a fresh run checks of its config before torch and transformers load (cli.py): that a model
given as a local path is there, that users' code named in the config (reward functions, an episode,
tools) can be found, and that built-in tools exist.
Nothing here imports torch or runs the user's code; the run resolves each for real later, with the
same messages. A typo then costs a second, not the ~7 s those imports take."""
from __future__ import annotations

from ..config import Config
from ..models.local_names import check_local
from ..rewards.reward_functions import RewardFunctionError
from ..tools.registry import check_tool_names
from ..usercode import check_spec, is_registered


def check_before_loading(config: Config) -> None:
    name = config.model.name
    if not name.endswith(".gguf"):  # a GGUF path has its own message (models/gguf.py), said when it loads
        check_local(name)
    for spec in config.reward.functions:
        check_spec(spec, "reward function", RewardFunctionError)
        if is_registered(spec) and config.reward.isolation == "process":
            raise RewardFunctionError(
                f"reward function '{spec}' is a Python object, which a worker process (reward.isolation=process) "
                "cannot import; name it by import path ('package.module:function' or 'path/to/file.py:function') "
                "or keep reward.isolation=thread")
    episode = config.data.episode
    if episode is None:
        return  # tools are only built for episodes (run/cell.py `rollout_kind`)
    if ":" in episode:  # a built-in episode's name has none; load_episode reports a wrong one
        check_spec(episode, "episode")
    check_tool_names(config.tools.names)
    for spec in config.tools.functions:
        check_spec(spec, "tool")
