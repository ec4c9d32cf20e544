"""Detokenizer replicas: incremental detokenization and stop strings, outside the compute loop."""
