"""The root core (`deltad serve`): one daemon watches many workspaces and resumes every
answered run exactly once. Everything in this package runs as root, in the daemon's process."""
