"""Administration: verify and gc, rm, bundles, push/pull."""
