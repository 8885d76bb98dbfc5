"""The target configs of the GPUs jax-aot names (aot.gpu_targets): package data."""
