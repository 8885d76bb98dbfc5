"""Warm-ups: manifests, targets, the run, workers, jobs, shards, claims, failures."""
