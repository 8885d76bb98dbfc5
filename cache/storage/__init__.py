"""Storage: the ObjectStore protocol and its backends (folder, database table, fsspec), and ContentStore."""
