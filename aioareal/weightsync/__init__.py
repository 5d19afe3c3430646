"""Trainer -> generator weight publishing: `full.py`: every parameter, staged on a
dedicated stream, or with LoRA the merged adapter matrices only."""
