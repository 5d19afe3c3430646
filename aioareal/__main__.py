import sys

from .cli import main


def entry() -> int:
    """`python -m aioareal` and the `aioareal` command: the process may start itself again with
    run.allocator's malloc (allocator.py)."""
    return main(restart=True)


if __name__ == "__main__":
    sys.exit(entry())
