"""fs3.mgmtd."""
