"""The package's version, stamped into the packages and kernel bundles it writes."""

__version__ = "0.1.0"
