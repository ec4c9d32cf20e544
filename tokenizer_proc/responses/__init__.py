"""The OpenAI Responses API (``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``):
requests are translated into chat completions requests and run on the chat path
(`openai.convert.build_chat`); the output is shown as a Response object and
Responses stream events. (`tokenizer_proc.openai.render` is the chat/completions output.)"""
