"""fs3.usrbio."""
