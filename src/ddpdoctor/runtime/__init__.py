"""The in-rank runtime: runs inside every training process (standard library and torch only)."""
