"""The ``kvcast`` command: the click entry point, one module per subcommand, shared options."""
