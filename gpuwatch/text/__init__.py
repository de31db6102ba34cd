"""How text users and other programs write is read and printed: YAML, units, times, RE2, Go."""
