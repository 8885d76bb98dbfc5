"""Tests (a package: modules are imported as tests.<folder>.<module>)."""
