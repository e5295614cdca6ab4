"""fs3.transport."""
