"""`deltad`: one daemon watches many workspaces and resumes every answered run exactly once."""
