"""The lab: what studies the trainer rather than trains (`bench`, `simulate`, and the experiments
behind `sweep`, `report` and `plot`). Nothing in the trainer imports it; the commands are unchanged."""
