"""Known causes of DDP hangs and divergences: the catalogue (data) and the rules (code)."""
