"""Known causes of DDP hangs and divergences: the catalogue (``causes.yaml``, data only) and
its loader. The rules that recognise them are code of the analysis (``analysis/rules.py``)."""
