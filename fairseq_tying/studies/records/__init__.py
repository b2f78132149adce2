"""A run's record: its typed layout, its builder from a run folder, a reproduction against it."""
