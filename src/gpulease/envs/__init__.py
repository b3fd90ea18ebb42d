"""Template environments: venvs built once per recipe, cached and shared between instances."""
