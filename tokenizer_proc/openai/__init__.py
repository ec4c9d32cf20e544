"""The OpenAI surface: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` and the
stored chat completions: request models, serving (stream and full writers) and routes."""
