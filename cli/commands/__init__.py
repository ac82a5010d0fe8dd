"""One module per CLI subcommand; ``kvcast.cli.main`` assembles them."""
