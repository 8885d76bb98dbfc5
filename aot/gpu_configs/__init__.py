"""The target configs of the GPUs jax-aot names (aot.platforms.cuda): package data."""
