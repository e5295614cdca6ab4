"""fs3.fuse."""
