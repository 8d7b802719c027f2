"""The `moejax` command line (`moejax.cli.main:main`), one module per subcommand."""
