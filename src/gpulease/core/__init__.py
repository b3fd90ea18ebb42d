"""Pure domain: catalog, money and pricing, task specs, templates, errors. No I/O here."""
