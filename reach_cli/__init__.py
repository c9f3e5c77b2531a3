"""The `reach` command line."""
