"""One module per group of meta operations (3FS meta/store/ops)."""
