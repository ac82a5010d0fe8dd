"""The long-running process: runner, publisher, instance, workers, settings, sources, stores."""
