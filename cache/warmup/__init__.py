"""Warm-ups: manifests, targets, the run, workers, jobs, shards, records, failures."""
