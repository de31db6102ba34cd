"""Files in the state directory: the journal, the GPU inventory, atomic JSON files."""
