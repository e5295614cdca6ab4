"""Checkpoints for training jobs on fs3 (see fs3/ckpt/api.py)."""
