"""The gpulease server: REST API, web console and the reconcilers that move state to intent."""
