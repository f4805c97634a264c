"""deltad: Delta Engine human-in-the-loop runs.

`deltad.protocol` is the on-disk contract shared by the `delta` client and the `deltad` daemon.
"""

__version__ = "0.1.0"
