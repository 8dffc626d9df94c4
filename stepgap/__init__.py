"""stepgap: where do the step gaps go?

This package is the command line only (`stepgap ...`, `python -m stepgap`). It sits above every
other layer and imports each command's module when it builds the parser; docs/design.md has the
map of the layers.
"""

__version__ = "0.1.0"
