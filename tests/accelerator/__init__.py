"""Tests that need an accelerator (a TPU or GPU): skipped on CPU (see test_on_chip.py)."""
