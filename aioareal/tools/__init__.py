"""Tools for episodes (docs/architecture.md rule 9): the calculator, users' tools by import path, and the box
that calls them under timeouts and turns every failure into a counted observation."""
from .registry import BUILTIN, build_toolbox, load_tools
from .toolbox import ERROR_PREFIX, CalculatorError, Tool, ToolBox, ToolResult, ToolStats, ToolThreads, calculate

__all__ = ["BUILTIN", "ERROR_PREFIX", "CalculatorError", "Tool", "ToolBox", "ToolResult", "ToolStats",
           "ToolThreads", "build_toolbox", "calculate", "load_tools"]
