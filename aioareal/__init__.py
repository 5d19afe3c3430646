"""aioareal: a fast, hackable asynchronous RL trainer for small language models."""

__version__ = "0.1.0"
