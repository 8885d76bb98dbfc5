"""The index of a cache: entry rows (entry), the schema and its migrations (schema), the
engine (engine), the SQLAlchemy Index (sql, with its reads in queries and its side of
the gc protocol in gc_protocol), writers' leases (leases), the stdlib reader of a folder
cache (reader), the one read protocol both readers satisfy (protocol), refs and releases
(refs, refs_sql), serving statistics' rows (call_stats), and the one rule of which entry
is served per signature (served). Every SQL statement of the index is in this package."""
