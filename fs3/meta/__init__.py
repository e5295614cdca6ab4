"""fs3.meta."""
