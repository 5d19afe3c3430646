"""What a run shows and records: `metrics` (metrics.jsonl and samples.jsonl), `live` (the dashboard's
snapshot), `dashboard` (the rich view, and the plain lines without it), `trackers` (TensorBoard, W&B, trackio)."""
