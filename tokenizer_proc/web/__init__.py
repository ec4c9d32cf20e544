"""HTTP glue every route shares: API key, CORS, body limits, JSON bodies read off the loop,
request ids, per-method routes and SSE responses with keep-alives."""
