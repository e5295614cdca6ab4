"""fs3.storage."""
