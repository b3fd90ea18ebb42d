"""HTTP routes, thin: authenticate, parse, call one service, shape the answer."""
