"""ernie: an auto-parallel training compiler (placeholder, filled below)."""
