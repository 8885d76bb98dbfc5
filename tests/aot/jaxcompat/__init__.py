"""Tests of aot.jaxcompat: the canary of a JAX upgrade."""
