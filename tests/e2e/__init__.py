"""End-to-end tests: real torchrun / mp.spawn jobs on gloo, each with a hard timeout."""
