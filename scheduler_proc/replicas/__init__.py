"""Detokenizer replicas as the scheduler sees them: which replica each request goes to
(`router`), the registry of replicas and their states (`registry`), and attach/detach control
(`control`)."""
