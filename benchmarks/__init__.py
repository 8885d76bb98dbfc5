"""Side-by-side benchmarks of jax-aot against plain JAX (see benchmarks/README.md)."""
