"""Renderers of a :class:`~ddpdoctor.analysis.report.Report`: console (rich) and JSON."""
