"""What a run shows and records: `metrics` (each step's report, its rows, and the JSONL files they go
to), `live` (the dashboard's snapshot), `dashboard` (the rich view, and the plain lines without it),
`trackers` (TensorBoard, W&B, trackio)."""
