"""agent_runner package."""
