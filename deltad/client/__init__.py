"""The `delta` one-shot client: run an agent, pause for a human, resume from disk."""
