"""A PromQL evaluator over gpuwatch's store, on the promql-parser package's AST."""
