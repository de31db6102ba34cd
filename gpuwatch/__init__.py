"""gpuwatch: a GPU health daemon for fleets."""

__version__ = "0.1.0"
