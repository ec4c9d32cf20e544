"""The Anthropic Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``):
requests are translated into chat completions requests and run on the chat path
(`openai.convert.build_chat`); the output is shown as Anthropic messages and events."""
