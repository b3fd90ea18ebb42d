"""The `gpulease` command line: a Typer app, thin over gpulease.client."""
