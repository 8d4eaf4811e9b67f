"""The trace format (schema), its in-memory model and its reader."""
