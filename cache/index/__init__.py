"""The SQL index: schema and migrations, the engine, Index, leases, the stdlib read-only reader."""
