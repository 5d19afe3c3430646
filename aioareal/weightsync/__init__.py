"""Trainer -> generator weight publishing: `full` (every parameter, staged on a dedicated stream) and
`lora` (merged adapter matrices only)."""
