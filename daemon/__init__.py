"""The long-running process and the CLI: sources, pipeline, state stores, configuration."""
