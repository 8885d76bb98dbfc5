"""Serving: aot.load, the dispatcher's call path, the fallback ladder, misses, padding, signatures, call statistics."""
