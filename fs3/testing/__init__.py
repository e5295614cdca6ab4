"""fs3.testing."""
