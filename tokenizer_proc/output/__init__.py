"""Reading the model's output for the APIs: reasoning and tool-call split of a chat choice
(`chat_output`, `blocks`, `reasoning`), JSON prefixes, and logprob entries in each API's shape."""
