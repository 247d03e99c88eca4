"""Training loop, schedules, optimizer set-up and checkpoints."""
