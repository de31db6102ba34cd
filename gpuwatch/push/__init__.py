"""Job metrics in: pushed by training processes (text format or JSON) or read from a textfile
directory, validated, limited, and sampled into the store with each cycle (docs/jobs.md)."""
