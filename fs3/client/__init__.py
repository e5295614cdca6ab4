"""fs3.client."""
