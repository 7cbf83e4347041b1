"""The version of hybridps: the one place it is written (CMake and the package build read it)."""
__version__ = "0.1.0"
