"""Tool calling: request shapes (`models`), what a request's tools ask for (`plan`), the grammars
that force calls (`grammar`), calls and their results in a conversation (`pairs`) and the output
parsers by model family (`parsers`)."""
