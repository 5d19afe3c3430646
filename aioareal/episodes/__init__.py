"""Multi-turn episodes (docs/architecture.md rule 9): an episode is a coroutine that asks the generator for model
turns, appends the world's answers as observation tokens, and returns its reward."""
from .episode_worker import EpisodeWorker, stored_rewards
from .handle import Codec, EpisodeContext, EpisodeGen, ModelTurn, Scorer, TurnQueue, codec_for
from .runner import BUILTIN, Episode, EpisodeRunner, EpisodeSetup, EpisodeStats, load_episode

__all__ = ["BUILTIN", "Codec", "Episode", "EpisodeContext", "EpisodeGen", "EpisodeRunner", "EpisodeSetup",
           "EpisodeStats", "EpisodeWorker", "ModelTurn", "Scorer", "TurnQueue", "codec_for", "load_episode",
           "stored_rewards"]
