"""Time series in memory, and what the store and the evaluator both know of a series."""
