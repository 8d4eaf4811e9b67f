"""Unit tests: analysis, rendering and reading on hand-built traces, no torch processes."""
