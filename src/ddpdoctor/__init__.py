"""ddpdoctor: find why a PyTorch DistributedDataParallel job hangs, and which line diverged."""

__version__ = "0.1.0"
